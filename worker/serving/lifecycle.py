"""A worker's stop and drain: the flags every stage reads, the signals that set them, and the stage threads
whose death stops the worker.

`stop()` (a warm stop, from any thread) lets every job already taken finish, then `work()` returns. SIGTERM and
SIGINT drain: the round on the device finishes, the rounds not yet started go back to the head of the queue,
and the process exits within the drain timeout; a second signal, or the timeout, ends the process at once (the
leases recover its jobs). Which signal began the drain is kept: `embedfleet worker` exits 130 after SIGINT (the
shell's code for Ctrl-C), 0 after SIGTERM, as its supervisor does (worker/serving/supervise.py).
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable

from embedfleet.common.console import EXIT_INTERRUPTED
# the forced exits: a hung device call would never let a normal exit end
from embedfleet.common.processes import exit_now
from embedfleet.worker.engine import stageclock

log = logging.getLogger("embedfleet.worker")

WATCHDOG_EXIT = 70  # a forward pass hung past its deadline (EX_SOFTWARE): the supervisor restarts the worker
FORCED_EXIT = 1  # a second stop signal, or a drain past its timeout


class Lifecycle:
    """The stop and drain flags of one worker (events, set from any thread, never cleared), and the signal
    that began its drain."""

    def __init__(self, name: str, drain_timeout: float):
        self.name = name
        self.drain_timeout = drain_timeout
        self.stopping = threading.Event()  # take nothing more; end once what is held is finished
        self.draining = threading.Event()  # ... and give back what has not reached the device
        self.signal: int | None = None  # SIGTERM or SIGINT: the first stop signal (the one that began the drain)
        self._lock = threading.Lock()

    @property
    def stopped(self) -> bool:
        return self.stopping.is_set()

    def stop(self) -> None:
        self.stopping.set()

    @property
    def exit_code(self) -> int:
        """The process's code once drained: 130 after SIGINT (Ctrl-C), else 0."""
        return EXIT_INTERRUPTED if self.signal == signal.SIGINT else 0

    def begin_drain(self) -> bool:
        """Set both flags and start the drain's deadline; True the first time only."""
        with self._lock:
            if self.draining.is_set():
                return False
            self.draining.set()
            self.stopping.set()
        timer = threading.Timer(self.drain_timeout, self._overdue)
        timer.daemon = True
        timer.start()
        return True

    def install_signal_handlers(self, drain: Callable[[], None]) -> None:
        """SIGTERM / SIGINT call `drain`; a second one ends the process at once. Only the main thread may.
        Handlers only set flags: raising inside a Redis read could strand taken ids."""
        def on_signal(signum, frame):
            name = signal.Signals(signum).name
            if self.draining.is_set():
                log.warning("worker %s: second %s; exiting now (the leases recover its jobs)", self.name, name)
                exit_now(FORCED_EXIT)
            log.info("worker %s: %s: draining (a second signal exits at once)", self.name, name)
            self.signal = signum
            drain()

        signal.signal(signal.SIGINT, on_signal)
        signal.signal(signal.SIGTERM, on_signal)

    def _overdue(self) -> None:
        log.error("worker %s: the drain took more than %g s; exiting now (the leases recover its jobs)",
                  self.name, self.drain_timeout)
        exit_now(FORCED_EXIT)

    def stage(self, name: str, loop: Callable[..., None], *args, clocks: stageclock.Stages) -> threading.Thread:
        """A stage's thread (not started): its clock bound; its death is logged and stops the worker."""
        def run() -> None:
            stageclock.bind(clocks, name)
            try:
                loop(*args)
            except BaseException:
                log.exception("worker %s: the %s stage died; stopping the worker (its jobs are recovered from "
                              "the started registry)", self.name, name)
                self.stop()
                raise

        return threading.Thread(target=run, name=f"{name}-{self.name}", daemon=True)
