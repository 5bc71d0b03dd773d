"""How many torch threads run a small forward pass on a CPU: one while other work keeps the machine's CPUs busy,
all of them otherwise.

Each layer of a pass is a parallel region; with OMP_WAIT_POLICY=PASSIVE (worker/engine/cpus.py) the threads sleep
between regions (after a brief spin, which a descheduled partner outlasts), and a one-row pass waits for them to
wake at every layer. Which count wins depends on what else runs. On the 2-core development machine, beside a busy
loop, bench/threads.py --tokens 12 ran one-row MiniLM passes at 83/s on one PASSIVE thread against 35/s on two;
quiet, one short text after an idle gap (the idle path of an interactive request) took 15.2 ms on one thread against
10.9 ms on two (p50 of the worker's forward stage, issue 38's note). So a pass of at most SMALL_PASS_TOKENS padded
tokens runs on one thread while the machine's 1-minute load average is at least its CPU count (read at most once a
second), and on every thread otherwise, as every larger pass does. (Timing each count in place does not work: the
first pass on two threads after a run on one wakes a thread that slept, and measures that.)
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterator

SMALL_PASS_TOKENS = 32  # padded tokens (rows x longest row) up to which a CPU pass is "small"
LOAD_EVERY = 1.0  # seconds between two reads of the load average


class SmallPasses:
    """One engine's thread count for its small CPU passes; used by the forward stage's thread only."""

    def __init__(self, load: Callable[[], float] = lambda: os.getloadavg()[0], cpus: int | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.load, self.cpus, self.clock = load, cpus or os.cpu_count() or 1, clock
        self._busy, self._read_at = False, float("-inf")

    def for_pass(self, padded_tokens: int, device) -> contextlib.AbstractContextManager:
        """The thread count for one forward pass of `padded_tokens` on `device` (a torch device, or a model's
        device string). Nothing where torch is not loaded (the null model), the pass runs elsewhere (a GPU: its
        threads only feed it), it is not small, or the machine has CPUs to spare."""
        torch = sys.modules.get("torch")
        if torch is None or padded_tokens > SMALL_PASS_TOKENS or not str(device).startswith("cpu") \
                or not self.busy():
            return contextlib.nullcontext()
        return _one_thread(torch)

    def busy(self) -> bool:
        """Whether other work keeps every CPU busy: the 1-minute load average is at least the CPU count."""
        now = self.clock()
        if now - self._read_at >= LOAD_EVERY:
            self._read_at = now
            try:
                self._busy = self.load() >= self.cpus
            except OSError:  # no load average here: all threads, as for any pass
                self._busy = False
        return self._busy


@contextlib.contextmanager
def _one_thread(torch) -> Iterator[None]:
    threads = torch.get_num_threads()
    if threads == 1:
        yield
        return
    torch.set_num_threads(1)  # ~0.1 us: libgomp keeps its idle threads for the next larger pass
    try:
        yield
    finally:
        torch.set_num_threads(threads)
