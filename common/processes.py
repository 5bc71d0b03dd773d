"""Child processes that end with the process that started them (Linux), so that a killed supervisor leaves
no orphaned Redis or worker holding its ports and data."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable

PR_SET_PDEATHSIG = 1


def die_with_parent() -> Callable[[], None] | None:
    """A `preexec_fn` for subprocess.Popen: the child gets SIGTERM when its parent dies (None off Linux).

    The signal is tied to the thread that starts the child: start such children from the main thread."""
    if not sys.platform.startswith("linux"):
        return None
    parent = os.getpid()

    def arrange() -> None:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # the parent died before the line above
            os.kill(os.getpid(), signal.SIGTERM)

    return arrange
