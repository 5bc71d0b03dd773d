"""The hand-offs between the worker's stages and the slot (worker/serving/handoff.py), without Redis or a model:
at most one prepared round waits for the device, whatever the forward stage does with what it looks at."""

from __future__ import annotations

import random
import threading

from embedfleet.worker.serving.handoff import END, Handoff
from embedfleet.worker.serving.rounds import Round


def prepared(handoff: Handoff, began: float = 0.0) -> Round:
    """A round offered the way the take stage does: its slot first."""
    assert handoff.reserve(timeout=1)
    round_ = Round(began)
    assert handoff.offer(round_)
    return round_


def test_a_second_round_is_taken_only_once_the_first_is_picked_up():
    handoff = Handoff()
    first = prepared(handoff)
    assert not handoff.reserve(timeout=0.01)  # the first still waits for the device
    assert handoff.waiting() == [first] and handoff.full()
    assert handoff.next_round(timeout=1) is first
    assert handoff.reserve(timeout=0.01)  # picked up: the next may be taken


def test_a_take_that_brought_nothing_gives_its_slot_up():
    handoff = Handoff()
    assert handoff.reserve(timeout=0.01)
    handoff.unreserve()
    assert handoff.reserve(timeout=0.01)


def test_a_round_looked_at_keeps_its_slot_until_it_is_kept_or_put_back():
    handoff = Handoff()
    round_ = prepared(handoff)
    assert handoff.look() is round_ and not handoff.waiting()
    assert not handoff.reserve(timeout=0.01)  # taken out to decide: nothing else may be prepared meanwhile
    assert handoff.put_back(round_) and handoff.waiting() == [round_]
    assert not handoff.reserve(timeout=0.01)
    assert handoff.keep(handoff.look()) is round_
    assert handoff.reserve(timeout=0.01)


def test_nothing_prepared_looks_like_none_and_putting_none_back_is_nothing():
    handoff = Handoff()
    assert handoff.look() is None and handoff.look(timeout=0.01) is None and handoff.next_round(0.01) is None
    assert handoff.put_back(None) and not handoff.waiting()
    assert handoff.keep(None) is None
    assert handoff.reserve(timeout=0.01)  # keeping nothing released nothing


def test_a_round_put_back_after_the_end_came_leaves_the_handoff_and_frees_its_slot():
    """The take stage queues its end without a slot (it is no round): a round looked at meanwhile cannot go
    back in, and is given back to its queue by the caller."""
    handoff = Handoff()
    round_ = prepared(handoff)
    assert handoff.look() is round_
    handoff.close(timeout=1)
    assert not handoff.put_back(round_)
    assert handoff.reserve(timeout=0.01)
    assert handoff.next_round(timeout=1) is END


def test_end_needs_no_slot_and_follows_the_last_round():
    handoff = Handoff()
    round_ = prepared(handoff)
    closer = threading.Thread(target=handoff.close)  # waits until the round is picked up
    closer.start()
    assert handoff.next_round(timeout=1) is round_
    assert handoff.next_round(timeout=5) is END
    closer.join(5)
    assert not closer.is_alive()
    handoff.close(timeout=0.01)
    handoff.close(timeout=0.01)  # full: not queued twice, and no error
    assert handoff.waiting() == [END]


def test_the_finish_handoff_holds_one_round_and_says_when_its_stage_is_gone():
    handoff = Handoff()
    first, second = Round(1.0), Round(2.0)
    assert handoff.pass_on(first)
    assert not handoff.pass_on(second, alive=lambda: False)  # full, and the finish stage is gone
    assert handoff.next_finished() is first
    handoff.end_finish()
    handoff.end_finish()  # full: dropped, not blocking
    assert handoff.next_finished() is END


def test_at_most_one_round_waits_whatever_the_forward_stage_does_with_it():
    """A take thread prepares rounds as fast as the slot lets it while the forward thread picks them up, looks
    at them and puts them back, keeps them, or lets them wait; whenever a take gets the slot, nothing waits."""
    handoff, rng = Handoff(), random.Random(37)
    seen: list[int] = []
    picked: list[Round] = []
    rounds = 300

    def take() -> None:
        for number in range(rounds):
            while not handoff.reserve(timeout=0.1):
                pass
            seen.append(len(handoff.waiting()))  # what waits when the slot is ours: nothing
            handoff.offer(Round(float(number)))
        handoff.close()

    taker = threading.Thread(target=take)
    taker.start()
    while (ready := handoff.look(timeout=5)) is not END:
        assert ready is not None, "the take stage stopped handing rounds over"
        move = rng.choice(("keep", "back", "next"))
        if move == "back":
            assert handoff.put_back(ready)
        else:
            picked.append(handoff.keep(ready))
    taker.join(5)
    assert seen == [0] * rounds
    assert [round_.began for round_ in picked] == [float(n) for n in range(rounds)]  # each once, in order
