"""When the take stage takes the next round: the device's state as the forward stage reports it, and the
gathering policy that reads it (pure: the clock and the waits are given to it).

While the device is busy and fewer jobs than a round are queued, the next round is taken only as late as still
lets it be taken and prepared before the device is free (by the device's measured time per text and the take
stage's measured time per round): requests that arrive meanwhile join it, so a closed loop of small requests
still fills whole batches. With a round's worth queued there is nothing to gather: it is taken at once, so the
device never waits for the tokenizer. The wait ends as soon as the device is free, however wrong the estimate
(a stall or a paused process inflates it).

Behind a round whose largest request alone needs more than CUT_IN_PASSES passes (head-of-line: one large
request), work of its level or a higher one is not left to wait for its end: looked for every LOOK_EVERY
seconds, it is taken at once, as a round of about one pass, which runs between two passes of the round on the
device (worker/serving/yielding.py). A round of many small requests is not cut into: under a steady load every
round is one (ROUND_PASSES passes, sorted by length), and cutting into each would leave the work in short,
badly padded rounds (0.7x the texts/s of a steady 8-text-request load, measured).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from embedfleet.worker.serving.yielding import CUT_IN_PASSES

GATHER_LEAD = 0.05  # least seconds before the device is free that the next round is taken (and tokenised)
LOOK_EVERY = 0.02  # seconds between two looks (one LLEN) for work queued behind a large request
IDLE_LOOK = 0.1  # seconds between two looks at the clock while gathering with nothing to look for
SMOOTHING = 0.3  # weight of the newest measurement in the smoothed per-text and per-round seconds


def smoothed(previous: float, measured: float) -> float:
    return (1 - SMOOTHING) * previous + SMOOTHING * measured


@dataclass(frozen=True)
class OnDevice:
    """The round on the device, as the take stage sees it: when it began and is expected to end (monotonic
    seconds), about how many passes its largest request needs alone (None: not known) and whether it holds
    lower-level work only."""

    began: float = 0.0
    free_at: float = 0.0
    largest: int | None = None
    lower: bool = False


class Device:
    """The device's state, written by the forward stage and read by the take stage.

    `take_now` is set while no round is on the device (and when a paused bulk round calls for interactive work):
    the take stage then takes at once. `wanted` is set when a paused bulk round wants interactive work taken
    (burst mode's end waits for it). The smoothed time per text is the forward stage's alone."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._now = OnDevice()
        self.take_now = threading.Event()
        self.take_now.set()
        self.wanted = threading.Event()
        self._seconds_per_text = 0.0  # the forward stage's own

    def busy(self, began: float, texts: int, largest: int | None, lower: bool) -> None:
        """A round goes on the device."""
        self.take_now.clear()
        with self._lock:
            self._now = OnDevice(began, began + texts * self._seconds_per_text, largest, lower)

    def measured(self, texts: int, seconds: float) -> None:
        """A round's passes took `seconds` for `texts` texts: the time per text, smoothed."""
        if texts:
            self._seconds_per_text = smoothed(self._seconds_per_text, seconds / texts)

    def free(self) -> None:
        """The round left the device (done, or failed): take the next now."""
        self.take_now.set()

    def call_for_interactive(self) -> None:
        """A bulk round paused between two passes wants the interactive work queued behind it taken now."""
        self.take_now.set()
        self.wanted.set()

    def now(self) -> OnDevice:
        with self._lock:
            return self._now


@dataclass(frozen=True)
class Gather:
    """Take at `take_at` (monotonic seconds); meanwhile look for work at the `look` highest levels (0: none)."""

    take_at: float
    look: int


class Gathering:
    """The gathering policy of one worker: `plan` decides, `wait` waits it out. `clock`: monotonic seconds."""

    def __init__(self, max_jobs: int, clock: Callable[[], float] = time.monotonic):
        self.max_jobs = max_jobs
        self.clock = clock

    def due(self, device: OnDevice, prepare_seconds: float) -> bool:
        """Whether the next round is to be taken now whatever is queued: no time is left to gather in."""
        return device.free_at - max(GATHER_LEAD, 2 * prepare_seconds) <= self.clock()

    def plan(self, device: OnDevice, queued: int, prepare_seconds: float, reach: int) -> Gather | None:
        """When to take the next round while `device` runs, with `queued` jobs waiting and a round's take and
        prepare taking `prepare_seconds`; None: now. `reach`: how many levels, from the highest, may cut in
        between the passes of the round on the device (worker/serving/levels.py `levels_up_to`)."""
        if queued >= self.max_jobs:
            return None  # a round's worth is there: nothing to gather
        take_at = device.free_at - max(GATHER_LEAD, 2 * prepare_seconds)  # twice the time it takes: a margin
        look = reach if device.largest is not None and device.largest > CUT_IN_PASSES else 0
        return Gather(take_at, look)

    def wait(self, plan: Gather, *, woken: Callable[[float], bool], stopped: Callable[[], bool],
             waiting: Callable[[int], bool]) -> int:
        """Wait until `plan.take_at`, or less: `woken(seconds)` waits up to that long and returns True when the
        take should happen now (the device is free); `waiting(levels)` looks for work queued at those levels.
        Returns how many levels, from the highest, the take then reads (work to run between two passes of the
        round on the device); 0: a whole round, from every level."""
        while (left := plan.take_at - self.clock()) > 0 and not stopped():
            if woken(min(left, LOOK_EVERY if plan.look else IDLE_LOOK)):
                break
            if plan.look and waiting(plan.look):
                return plan.look
        return 0
