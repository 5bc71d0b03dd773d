"""Where a worker's time goes: per thread, seconds summed per stage (take, tokenise, collate, forward, ...).

Each stage thread of the worker binds a clock (`bind(stages, "take")`); code on that thread then calls
`lap("tokenise")` when a stage ends: the seconds since the previous lap go to that stage. Laps are one
perf_counter and one dict add, cheap enough for the hot path; a thread that bound no clock laps into a
throwaway one (the probe, tests, an Engine used alone). Because every lap closes the time since the last
one, a thread's stages add up to its wall time: the waits are stages too (`wait: ...`), so the table shows
what each thread computes and what it waits for.

On a GPU, kernels run asynchronously: the device's time lands in the stage that waits for it (the copy back).
"""

from __future__ import annotations

import threading
import time

_local = threading.local()


class Clock:
    """One thread's stage totals (seconds) since it was bound."""

    __slots__ = ("totals", "mark")

    def __init__(self) -> None:
        self.totals: dict[str, float] = {}
        self.mark = time.perf_counter()

    def lap(self, stage: str) -> None:
        now = time.perf_counter()
        self.totals[stage] = self.totals.get(stage, 0.0) + (now - self.mark)
        self.mark = now


class Stages:
    """A worker's clocks, by thread role; read by its metrics (worker/serving/metrics.py) at any time."""

    def __init__(self) -> None:
        self._clocks: dict[str, Clock] = {}

    def snapshot(self) -> dict[str, dict[str, float]]:
        """thread role -> stage -> seconds so far (copies: the threads keep counting)."""
        return {role: dict(clock.totals) for role, clock in list(self._clocks.items())}


def bind(stages: Stages | None, role: str) -> None:
    """This thread's laps count into `stages` under `role` from now on (None: into a throwaway clock)."""
    clock = Clock()
    _local.clock = clock
    if stages is not None:
        stages._clocks[role] = clock


def lap(stage: str) -> None:
    """The seconds since this thread's previous lap were spent in `stage`."""
    try:
        clock = _local.clock
    except AttributeError:
        clock = _local.clock = Clock()
    clock.lap(stage)
