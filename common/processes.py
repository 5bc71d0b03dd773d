"""Child processes that end with the process that started them, and a prompt exit once a process's work is done.

A supervisor (`embedfleet up`, `embedfleet worker --replicas/--gpus`) starts each child in a session of its own, so
that a terminal's Ctrl-C (SIGINT to its whole foreground process group) reaches the supervisor alone, which stops
each child once, in order; and with PR_SET_PDEATHSIG (Linux), so that a supervisor killed outright still ends
them (SIGTERM: a worker drains, Redis writes its AOF out) rather than leaving orphans holding ports and queues."""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import subprocess
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


def start_owned(argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
    """Start `argv` as a child only its parent stops: a session of its own, SIGTERM when the parent dies."""
    return subprocess.Popen(argv, stdin=subprocess.DEVNULL, env=env, start_new_session=True,
                            preexec_fn=die_with_parent())


def exit_now(code: int) -> None:
    """End the process with `code` after flushing its log and output, without the interpreter's teardown.

    For a process whose work is done and said (a worker drained, withdrawn and deregistered): what a normal exit
    still does is unload every module one by one, seconds for torch and transformers on a busy CPU, while a
    supervisor or `docker stop` waits. Only for processes that register nothing to run at exit."""
    for handler in logging.getLogger().handlers:
        with contextlib.suppress(Exception):  # a broken log stream must not keep the process alive
            handler.flush()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # closed, or its reader is gone
            stream.flush()
    os._exit(code)
