"""The gathering policy (worker/serving/gathering.py) on a fake clock, without Redis or a model: when the take
stage takes the next round while the device is busy, and the device state it reads."""

from __future__ import annotations

import pytest

from embedfleet.worker.serving.gathering import GATHER_LEAD, IDLE_LOOK, LOOK_EVERY, Device, Gather, Gathering, OnDevice
from embedfleet.worker.serving.yielding import CUT_IN_PASSES


class Clock:
    """Fake monotonic seconds; `woken(seconds)` is the wait the policy is given: the time passes, and the
    device frees itself at `free_at` (None: never)."""

    def __init__(self, free_at: float | None = None):
        self.now, self.free_at, self.waits = 100.0, free_at, []

    def __call__(self) -> float:
        return self.now

    def woken(self, seconds: float) -> bool:
        self.waits.append(seconds)
        if self.free_at is not None and self.now + seconds >= self.free_at:
            self.now = max(self.now, self.free_at)
            return True
        self.now += seconds
        return False


def busy(free_in: float, largest: int | None = 16, lower: bool = False, now: float = 100.0) -> OnDevice:
    """`largest`: the passes the largest request of the round on the device needs alone."""
    return OnDevice(began=now - 1.0, free_at=now + free_in, largest=largest, lower=lower)


def test_a_round_s_worth_queued_is_taken_at_once():
    policy = Gathering(max_jobs=64, clock=Clock())
    assert policy.plan(busy(5.0), queued=64, prepare_seconds=0.01, reach=1) is None
    assert policy.plan(busy(5.0), queued=500, prepare_seconds=0.01, reach=1) is None
    assert policy.plan(busy(5.0), queued=63, prepare_seconds=0.01, reach=1) is not None


@pytest.mark.parametrize("prepare_seconds, lead", [(0.0, GATHER_LEAD), (0.01, GATHER_LEAD), (0.2, 0.4)])
def test_the_take_comes_as_late_as_still_lets_the_round_be_ready_when_the_device_is_free(prepare_seconds, lead):
    """At least GATHER_LEAD before the device is free, or twice the measured take-and-prepare time."""
    plan = Gathering(max_jobs=64, clock=Clock()).plan(busy(1.0), queued=3, prepare_seconds=prepare_seconds, reach=2)
    assert plan.take_at == pytest.approx(101.0 - lead)


@pytest.mark.parametrize("largest, reach, look", [(CUT_IN_PASSES + 1, 1, 1), (16, 2, 2), (CUT_IN_PASSES, 2, 0),
                                                  (1, 1, 0), (None, 2, 0)])
def test_work_behind_a_request_of_several_passes_is_looked_for(largest, reach, look):
    """Only a round whose largest request needs more than CUT_IN_PASSES passes alone is cut into: a full round
    of small requests (ROUND_PASSES passes, each request in one) is not, so a steady load keeps whole rounds."""
    plan = Gathering(max_jobs=64, clock=Clock()).plan(busy(1.0, largest), queued=0, prepare_seconds=0.0, reach=reach)
    assert plan.look == look


def test_the_wait_lasts_until_the_take_time_in_idle_steps():
    clock = Clock()
    taken = Gathering(64, clock).wait(Gather(take_at=100.35, look=0), woken=clock.woken, stopped=lambda: False,
                                      waiting=lambda levels: pytest.fail("nothing to look for"))
    assert taken == 0 and clock.now == pytest.approx(100.35)
    assert clock.waits[:3] == [IDLE_LOOK] * 3 and max(clock.waits) == IDLE_LOOK  # it looks at the clock often
    assert sum(clock.waits) == pytest.approx(0.35)


def test_the_wait_ends_as_soon_as_the_device_is_free_however_wrong_the_estimate():
    clock = Clock(free_at=100.12)
    taken = Gathering(64, clock).wait(Gather(take_at=130.0, look=0), woken=clock.woken, stopped=lambda: False,
                                      waiting=lambda levels: False)
    assert taken == 0 and clock.now == pytest.approx(100.12)


def test_work_queued_behind_a_long_round_is_taken_at_once_as_a_cut_in_take():
    clock, looks = Clock(), []

    def waiting(levels: int) -> bool:
        looks.append((clock.now, levels))
        return len(looks) == 3  # queued after the third look

    taken = Gathering(64, clock).wait(Gather(take_at=105.0, look=2), woken=clock.woken, stopped=lambda: False,
                                      waiting=waiting)
    assert taken == 2  # a take of about one pass, from the two highest levels
    assert [levels for _, levels in looks] == [2, 2, 2] and clock.waits == [LOOK_EVERY] * 3


def test_a_stop_ends_the_wait_and_a_past_take_time_does_not_wait():
    clock = Clock()
    stops = iter([False, False, True])
    assert Gathering(64, clock).wait(Gather(130.0, 0), woken=clock.woken, stopped=lambda: next(stops),
                                     waiting=lambda levels: False) == 0
    assert len(clock.waits) == 2
    clock.waits.clear()
    assert Gathering(64, clock).wait(Gather(clock.now - 1, 1), woken=clock.woken, stopped=lambda: False,
                                     waiting=lambda levels: True) == 0
    assert clock.waits == []


def test_the_device_state_the_forward_stage_reports():
    device = Device()
    assert device.take_now.is_set() and device.now() == OnDevice()  # nothing on it: take at once
    device.busy(began=10.0, texts=100, largest=4, lower=True)
    assert not device.take_now.is_set()
    assert device.now() == OnDevice(10.0, 10.0, 4, True)  # no time per text measured yet: free "now"
    device.measured(texts=100, seconds=1.0)  # 10 ms a text, smoothed from 0
    device.measured(texts=0, seconds=5.0)  # a round with nothing to compute teaches nothing
    device.free()
    assert device.take_now.is_set()
    device.busy(began=20.0, texts=100, largest=None, lower=False)
    assert device.now().free_at == pytest.approx(20.0 + 100 * 0.3 * 0.01)
    assert not device.wanted.is_set()
    device.call_for_interactive()
    assert device.take_now.is_set() and device.wanted.is_set()


def test_a_round_knows_the_passes_of_its_largest_request_apart_from_its_own():
    """What the take stage reports to the device (rounds.passes_of): a full round of small requests needs many
    passes but none of its requests more than one; one large request needs them all by itself."""
    from embedfleet.worker.engine.seam import Prepared, Work
    from embedfleet.worker.engine.shaper import Shape
    from embedfleet.worker.serving.rounds import Round, passes_of

    def round_of(*sizes: int) -> Round:
        prepared = {i: Prepared(token_lists=[[1] * 8] * size) for i, size in enumerate(sizes)}
        return Round(0.0, work=Work(requests=[], results=[], prepared=prepared))

    shape = Shape(tokens=128, rows=16)  # 16 rows of 8 tokens a pass
    assert passes_of(round_of(*[8] * 32), shape) == (16, 1)  # 32 requests of 8 texts: 16 passes, one each
    assert passes_of(round_of(256, 8), shape) == (17, 16)  # a 256-text request holds 16 passes alone
    assert passes_of(round_of(256), None) == (None, None)
    assert passes_of(Round(0.0), shape) == (0, 0)
