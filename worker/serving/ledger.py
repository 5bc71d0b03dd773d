"""The jobs a worker holds: taken and not yet acknowledged, by claim, with when each was taken.

Written by the take stage (a round taken), the finish stage (a round acknowledged) and the forward stage or a
drain (rounds given back); read by the heartbeat, which renews the leases of what it holds (each only until its
job's timeout: then the lease lapses and the job is recovered), and by burst mode's end and the advert.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

from embedfleet.common.protocol.records import Taken
from embedfleet.worker.serving.heartbeat import timed_out


class Ledger:
    """Held jobs by claim (id, execution), under one lock. `let_go(ids)`: called with the ids of the jobs
    this worker computed (or would have) once they are no longer held (in-flight dedup's markers,
    worker/serving/inflight.py), after their answers are stored, outside the lock."""

    def __init__(self, let_go: Callable[[list[str]], None] | None = None):
        self._held: dict[tuple[str, str], tuple[Taken, float]] = {}
        self._lock = threading.Lock()
        self._let_go = let_go

    def __len__(self) -> int:
        with self._lock:
            return len(self._held)

    def hold(self, jobs: Iterable[Taken], since: float) -> None:
        """Jobs just taken (only the ones this worker claimed: a job it could not start is not its own)."""
        with self._lock:
            for job in jobs:
                if job.claimed:
                    self._held[job.id, job.execution] = (job, since)

    def release(self, answered: Iterable[Taken] = (), computed: Iterable[Taken] = ()) -> None:
        """These jobs are held no more: `answered` ones were answered without running, `computed` ones ran
        (or were given back before they could)."""
        computed = list(computed)
        with self._lock:
            for job in (*answered, *computed):
                self._held.pop((job.id, job.execution), None)
        if self._let_go is not None:
            self._let_go([job.id for job in computed])

    def renewable(self, now: float) -> list[Taken]:
        """The held jobs whose lease the heartbeat renews: those still within their job's timeout."""
        with self._lock:
            return [job for job, since in self._held.values() if not timed_out(job.timeout, now - since)]
