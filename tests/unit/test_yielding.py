"""The yielding policy (worker/serving/yielding.py) without Redis or a model: what runs between two forward passes
of a round, what a round picked up for the device does when interactive work waits, and that the one look at
Redis it may need is made only where the answer matters."""

from __future__ import annotations

import pytest

from embedfleet.worker.serving.handoff import END
from embedfleet.worker.serving.rounds import Round
from embedfleet.worker.serving.yielding import (CUT_IN_PASSES, Move, after_call, between_passes, cuts_in, interactive,
                                                yields_at_pickup)

WORK = object()  # a round's engine Work: what matters here is only whether it has any


def bulk(passes: int | None = 16, preemptible: bool = True, work=WORK) -> Round:
    return Round(0.0, work=work, lower=True, preemptible=preemptible, passes=passes)


def normal(passes: int | None = 16, work=WORK) -> Round:
    return Round(0.0, work=work, passes=passes)


def never() -> bool:
    pytest.fail("looked at Redis where the answer does not matter")


def yes() -> bool:
    return True


def no() -> bool:
    return False


def test_interactive_work_cuts_into_a_bulk_round_whatever_its_size():
    assert cuts_in(normal(passes=40), bulk(passes=2))
    assert cuts_in(normal(passes=None), bulk(passes=None))
    assert cuts_in(normal(work=None), bulk())  # all answered before the engine: it only needs storing


def test_lower_level_work_never_runs_inside_a_higher_round():
    assert not cuts_in(bulk(passes=1), normal(passes=16))
    assert not cuts_in(bulk(work=None), normal())


@pytest.mark.parametrize("ready, outer, expected", [
    (1, 16, True), (CUT_IN_PASSES, 16, True), (CUT_IN_PASSES + 1, 16, False),  # short enough to cut in
    (2, 2, False), (1, 2, True),  # and fewer passes than the round it cuts into
    (None, 16, False), (1, None, False),  # not known: no cut-in
])
def test_short_work_of_the_same_level_cuts_into_a_longer_round(ready, outer, expected):
    assert cuts_in(normal(ready), normal(outer)) is expected
    assert cuts_in(bulk(ready), bulk(outer)) is expected  # the same within the bulk level


def test_nothing_or_the_end_never_cuts_in():
    assert not cuts_in(None, bulk()) and not cuts_in(END, bulk())
    assert not interactive(None) and not interactive(END) and not interactive(bulk()) and interactive(normal())


def test_a_round_picked_up_yields_only_if_preemptible_with_interactive_work_waiting():
    assert yields_at_pickup(bulk(), yes)
    assert not yields_at_pickup(bulk(), no)
    assert not yields_at_pickup(bulk(preemptible=False), never)  # the share's round keeps its turn
    assert not yields_at_pickup(bulk(work=None), never)  # nothing to run: its answers are stored anyway
    assert not yields_at_pickup(normal(), never)


def test_between_passes_of_an_interactive_round_only_cut_ins_run():
    outer = normal(16)
    assert between_passes(normal(1), outer, never, False) == (Move.RUN, False)
    assert between_passes(normal(8), outer, never, False) == (Move.LEAVE, False)
    assert between_passes(bulk(1), outer, never, False) == (Move.LEAVE, False)
    assert between_passes(None, outer, never, False) == (Move.NONE, False)
    assert between_passes(END, outer, never, False) == (Move.LEAVE, False)


def test_between_passes_of_a_bulk_round_with_no_interactive_work_waiting():
    outer = bulk(16)
    assert between_passes(normal(8), outer, never, False) == (Move.RUN, False)  # interactive, prepared
    assert between_passes(bulk(1), outer, never, False) == (Move.RUN, False)  # short bulk behind a long one
    assert between_passes(bulk(8), outer, no, False) == (Move.LEAVE, False)
    assert between_passes(None, outer, no, False) == (Move.NONE, False)
    assert between_passes(END, outer, never, False) == (Move.LEAVE, False)


def test_a_bulk_round_calls_for_interactive_work_and_makes_room_for_it():
    outer = bulk(16)
    assert between_passes(None, outer, yes, False) == (Move.NONE, True)  # not prepared yet: take it now
    assert between_passes(bulk(8), outer, yes, False) == (Move.GIVE_BACK, True)  # a prepared bulk round goes back
    share = bulk(8, preemptible=False)
    assert between_passes(share, outer, yes, False) == (Move.SET_ASIDE, True)  # the share's round waits its turn
    assert between_passes(share, outer, yes, True) == (Move.LEAVE, False)  # one set aside already


def test_after_the_call_only_interactive_work_runs():
    assert after_call(normal(40)) is Move.RUN
    assert after_call(bulk(1)) is Move.LEAVE  # another worker took the interactive work
    assert after_call(END) is Move.LEAVE
    assert after_call(None) is Move.NONE  # not ready yet: after the next pass
