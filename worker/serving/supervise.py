"""The worker's own supervisor: `embedfleet worker --gpus ...` and `--replicas N` run their engines as child
processes (`python -m embedfleet.worker`, one per GPU and replica), and this keeps them running.

A child that dies (a crash, SIGKILL, the watchdog's exit 70) is started again under a new name after a pause that
doubles with each quick death (common/restarts.py, as `embedfleet up` does); the jobs it held come back when their
leases lapse (common/protocol/claims.py `recover`, run by every live worker). One that keeps dying within a
minute of its start (--max-restarts in a row) stops the others and the supervisor exits with its code, so that a
container restarts whole rather than crash-looping a child unnoticed. A child that exits 0 (--burst), or 130 (it
drained after a SIGINT of its own), is done.

Stopping: each SIGTERM/SIGINT is forwarded once to every running child (the first: each drains what it holds,
withdraws its advert and exits 0, or 130 after SIGINT; a second: each exits at once); the supervisor exits as soon
as they have: 0 after SIGTERM, 130 after SIGINT (the shell's code for Ctrl-C), or the code of an engine that could
not drain (1: a second signal, or past its --drain-timeout). Each child runs in a session of its own
(common/processes.py), so that a terminal's Ctrl-C, sent to the whole foreground process group, reaches the
supervisor alone: a child that got it directly and again by the forward would take the second as `exit now`. A
supervisor killed outright (SIGKILL, the OOM killer) cannot forward: each child then gets SIGTERM from the kernel
(Linux) and drains, so that a supervisor started again never serves beside orphans.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from embedfleet.common.console import EXIT_INTERRUPTED
from embedfleet.common.processes import start_owned
from embedfleet.common.restarts import Restarts, exit_reason

log = logging.getLogger("embedfleet.worker")
CHILD_POLL = 0.5  # seconds between looks at the children (a stop signal or a child's death wakes it at once)
DONE = (0, EXIT_INTERRUPTED)  # a child that drained and exited: 130 after SIGINT (Ctrl-C), as a command does


@dataclass
class Child:
    """One engine process: its label in log lines, its worker flags and environment, and its restart plan."""

    label: str
    argv: list[str]
    env: dict[str, str]
    name: str | None = None  # its --name; a start after the first gets a suffix (rq refuses a name still registered)
    plan: Restarts = field(default_factory=lambda: Restarts(0))
    process: subprocess.Popen | None = None
    starts: int = 0
    started_at: float = 0.0

    def start(self) -> None:
        name = [] if self.name is None else ["--name", self.name if not self.starts else f"{self.name}.{self.starts}"]
        self.process = start_owned([sys.executable, "-m", "embedfleet.worker", *self.argv, *name], env=self.env)
        self.starts += 1
        self.started_at = time.monotonic()
        log.info("%s: worker pid %d", self.label, self.process.pid)


def run(children: list[Child], max_restarts: int) -> int:
    """Start `children` and keep them running until a signal stops them, or one keeps dying; returns the exit code."""
    received: list[int] = []  # stop signals, forwarded by the loop; a plain list: the handler only appends
    with _woken_by_signals(received) as wait:
        for child in children:
            child.plan = Restarts(max_restarts)
            child.start()
        failed, due = _supervise(children, max_restarts, received, wait)
    # A child that died earlier and was waiting to start again when the stop came was said then: not a failure now.
    ended = [child for index, child in enumerate(children) if index not in due]
    if received:
        for child in ended:
            log.info("%s: worker pid %d stopped (%s)", child.label, child.process.pid,
                     exit_reason(child.process.returncode))
    failed = failed or next((child.process.returncode for child in ended
                             if child.process.returncode not in (*DONE, -signal.SIGTERM, -signal.SIGINT)), 0)
    return failed or (EXIT_INTERRUPTED if received[:1] == [signal.SIGINT] else 0)


def _supervise(children: list[Child], max_restarts: int, received: list[int],
               wait: Callable[[float], None]) -> tuple[int, dict[int, float]]:
    """The loop: restart the dead, forward each stop signal once to each running child, until all have ended.
    Returns the code of a child that kept dying (else 0) and the children that were waiting to start again."""
    failed, sent = 0, 0
    due: dict[int, float] = {}  # child index -> when it starts again
    seen: dict[int, subprocess.Popen] = {}  # child index -> the process whose death was dealt with

    def unseen_death() -> bool:  # every engine may die at once (a bad flag, the machine): each is dealt with
        return any(child.process.poll() not in (None, *DONE) and seen.get(index) is not child.process
                   for index, child in enumerate(children))

    while any(child.process.poll() is None for child in children) or (not received and (due or unseen_death())):
        while sent < len(received):  # here, not in the handler: a child being started then gets it too
            for child in children:
                if child.process.poll() is None:
                    child.process.send_signal(received[sent])
            sent += 1
        for index, child in enumerate(children):
            code = child.process.poll()
            if code is None or code in DONE or received or index in due and due[index] > time.monotonic():
                continue
            if index in due:  # its pause is over
                del due[index]
                child.start()
                continue
            if seen.get(index) is child.process:
                continue
            seen[index] = child.process
            delay = child.plan.after_exit(time.monotonic() - child.started_at)
            if delay is None:
                failed = code
                log.error("%s: worker pid %d %s (%d deaths in a row, each within a minute of its start; "
                          "--max-restarts %d); stopping the others", child.label, child.process.pid,
                          exit_reason(code), child.plan.failures, max_restarts)
                received.append(signal.SIGTERM)
                break
            log.warning("%s: worker pid %d %s; starting it again in %g s (restart %d of at most %d in a row); its "
                        "jobs come back when their leases lapse", child.label, child.process.pid, exit_reason(code),
                        delay, child.plan.failures, max_restarts)
            due[index] = time.monotonic() + delay
        if sent == len(received):  # a stop that came meanwhile is forwarded first
            wait(CHILD_POLL)
    return failed, due


@contextlib.contextmanager
def _woken_by_signals(received: list[int]):
    """SIGTERM/SIGINT are appended to `received`; yields `wait(seconds)`, which returns early on any of them and
    on a child's death (SIGCHLD), so that the supervisor acts on a stop, and exits after its last child, at once."""
    reader, writer = os.pipe()
    os.set_blocking(reader, False)
    os.set_blocking(writer, False)
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD)}

    def wait(seconds: float) -> None:
        if select.select([reader], [], [], seconds)[0]:
            with contextlib.suppress(BlockingIOError):
                os.read(reader, 512)

    old_fd = signal.set_wakeup_fd(writer)  # the signal's number is written there: select() wakes
    try:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda signum, _frame: received.append(signum))
        signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, not SIG_IGN: that would reap the children
        yield wait
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        signal.set_wakeup_fd(old_fd)
        os.close(reader)
        os.close(writer)
