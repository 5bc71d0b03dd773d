"""What runs between two forward passes of a round: the yielding policy (pure decisions; the forward stage,
worker/serving/forward.py, does what they say).

Rounds are cut by work (ROUND_PASSES passes of it), and the engine calls back between two passes of a round;
there a prepared round may cut in, and the round on the device then goes on where it paused, nothing thrown away:

- interactive work into a bulk round: a bulk round pauses for higher-level work, whatever its size
  (worker/serving/levels.py). When interactive work waits and is not prepared yet, the take stage is called to
  take it now (a bulk round it had prepared goes back to its queue to make room, unless it is the share's round:
  that one is set aside and runs next), and the bulk round waits up to PAUSE_WAIT for it;
- work queued behind a long round: a round of at most CUT_IN_PASSES passes (fewer than the one on the device), of
  its level or a higher one, which the take stage takes as soon as it is queued (worker/serving/gathering.py).
  Work behind a large request waits about one pass, and the large one still gets at least a third of the device
  however much such work keeps coming.

Lower-level work never runs inside a higher round. A bulk round still waiting for the device when interactive
work arrives goes back to the head of its queue (as a drain does: the delivery is not counted), unless it is
the share's round.
"""

from __future__ import annotations

import enum
from collections.abc import Callable

from embedfleet.worker.serving.handoff import END
from embedfleet.worker.serving.rounds import Round

# forward passes of work (by estimated tokens) one round holds at most: enough inputs that sorting them by
# length saves most of the padding (rounds of 3 passes ran a 16-text-request load at 0.7x of one sorted
# round); interactive work does not wait for a bulk round's end (it runs between two passes)
ROUND_PASSES = 16
# a round of at most this many passes runs between two passes of a longer round of its level or a lower one
CUT_IN_PASSES = 2
PAUSE_WAIT = 0.05  # most seconds a paused bulk round waits for the take stage to prepare the interactive work


class Move(enum.Enum):
    """What becomes of the prepared round looked at between two passes."""

    NONE = "nothing prepared"
    RUN = "runs now, between two passes of the round on the device"
    LEAVE = "stays prepared (back into the hand-off)"
    GIVE_BACK = "goes back to its queue, to make room for interactive work"
    SET_ASIDE = "the share's round: set aside, it runs after the round on the device"


def interactive(ready) -> bool:
    """Whether what the take stage handed over is a round of higher-level (interactive) work."""
    return isinstance(ready, Round) and not ready.lower


def cuts_in(ready, outer: Round) -> bool:
    """Whether a prepared round runs between two passes of `outer`: higher-level work in a lower round,
    whatever its size; work of the same level or higher when it is short (at most CUT_IN_PASSES passes, and
    fewer than `outer`'s). Lower-level work never runs inside a higher round."""
    if not isinstance(ready, Round) or (ready.lower and not outer.lower):
        return False
    if (outer.lower and not ready.lower) or ready.work is None:
        return True
    return ready.passes is not None and outer.passes is not None and \
        ready.passes <= CUT_IN_PASSES and ready.passes < outer.passes


def yields_at_pickup(round_: Round, higher_waiting: Callable[[], bool]) -> bool:
    """Whether a round just picked up for the device goes back to its queue instead: a preemptible bulk round
    (not the share's) with interactive work waiting."""
    return round_.preemptible and round_.work is not None and higher_waiting()


def between_passes(ready, outer: Round, higher_waiting: Callable[[], bool], set_aside: bool) -> tuple[Move, bool]:
    """Between two passes of `outer`, with `ready` looked at in the hand-off (a Round, END or None): what becomes
    of it, and whether the take stage is then called to take interactive work now. `higher_waiting()` looks
    (one LLEN) only where the answer matters; `set_aside`: a share's round is set aside already."""
    if cuts_in(ready, outer):
        return Move.RUN, False
    if not outer.lower or ready is END or not higher_waiting():
        return (Move.NONE if ready is None else Move.LEAVE), False
    if ready is None:
        return Move.NONE, True
    if ready.preemptible:
        return Move.GIVE_BACK, True
    if not set_aside:
        return Move.SET_ASIDE, True
    return Move.LEAVE, False


def after_call(ready) -> Move:
    """What becomes of the round the take stage prepared after the call: interactive work runs now; anything
    else (another worker took the interactive work) stays prepared."""
    if ready is None:
        return Move.NONE
    return Move.RUN if interactive(ready) else Move.LEAVE
