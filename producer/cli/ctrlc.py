"""Ctrl-C in a command that runs until it is stopped (`embed`, `status --watch`): noted by a handler and acted on
between the command's steps, never raised in the middle of one."""

from __future__ import annotations

import signal
import time

SLICE = 0.1  # seconds: how soon a sleep notices a Ctrl-C


class CtrlC:
    """SIGINT during the run: noted, and acted on between the run's steps, never raised in the middle of one.

    Python's own KeyboardInterrupt is raised wherever the main thread is: inside a submit (its requests queued,
    their ids not logged), between a Redis command and its reply (left on a pooled connection), inside a
    __del__ (where Python drops it, and the run goes on waiting), or while hiredis packs an int argument (int ->
    str looks for signals; hiredis 3.5 does not check that PyObject_Repr failed, and the process segfaults:
    about 1 Ctrl-C in 10 that lands during a busy run, in our tries). Blocking SIGINT does not hold it back
    either: the mask is the main thread's, so the kernel hands the signal to another thread (numpy's OpenBLAS
    pool), and Python runs the handler in the main thread all the same, mid-step. The first Ctrl-C sets
    `pressed` and puts back the default action, so that a second one ends the process at once, whatever it
    waits for (the checkpoint's records are whole writes: a rerun resumes, as after a kill)."""

    def __init__(self):
        self.pressed = False
        self._previous = None

    def __enter__(self) -> CtrlC:
        self._previous = signal.signal(signal.SIGINT, self._note)
        return self

    def __exit__(self, *exc) -> None:
        if not self.pressed:
            signal.signal(signal.SIGINT, self._previous)

    def sleep(self, seconds: float) -> None:
        """Sleep `seconds`, or less: until Ctrl-C is pressed."""
        end = time.monotonic() + seconds
        while not self.pressed and (left := end - time.monotonic()) > 0:
            time.sleep(min(left, SLICE))

    def _note(self, signum, frame) -> None:
        self.pressed = True
        signal.signal(signal.SIGINT, signal.SIG_DFL)
