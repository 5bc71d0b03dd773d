"""The worker's own supervisor: `embedfleet worker --gpus ...` and `--replicas N` run their engines as child
processes (`python -m worker`, one per GPU and replica), and this keeps them running.

A child that dies (a crash, SIGKILL, the watchdog's exit 70) is started again under a new name after a pause that
doubles with each quick death (common/restarts.py, as `embedfleet up` does); the jobs it held come back when their
leases lapse (common/protocol/operations.py `recover`, run by every live worker). One that keeps dying within a
minute of its start (--max-restarts in a row) stops the others and the supervisor exits with its code, so that a
container restarts whole rather than crash-looping a child unnoticed. A child that exits 0 (--burst) is done.
SIGTERM/SIGINT are forwarded to every child (each drains what it holds); the supervisor exits when they have.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

from common.restarts import Restarts, exit_reason

log = logging.getLogger("embedfleet.worker")
CHILD_POLL = 0.5  # seconds between looks at the children


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
        self.process = subprocess.Popen([sys.executable, "-m", "worker", *self.argv, *name], env=self.env)
        self.starts += 1
        self.started_at = time.monotonic()
        log.info("%s: worker pid %d", self.label, self.process.pid)


def run(children: list[Child], max_restarts: int) -> int:
    """Start `children` and keep them running until a signal stops them, or one keeps dying; returns the exit code."""
    for child in children:
        child.plan = Restarts(max_restarts)
        child.start()
    stopping: list[int] = []  # a plain list: an Event's lock could be held where the signal handler runs

    def forward(signum, _frame):
        stopping.append(signum)
        for child in children:
            if child.process.poll() is None:
                child.process.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)
    failed = 0
    due: dict[int, float] = {}  # child index -> when it starts again
    seen: dict[int, subprocess.Popen] = {}  # child index -> the process whose death was dealt with

    def unseen_death() -> bool:  # every engine may die at once (a bad flag, the machine): each is dealt with
        return any(child.process.poll() not in (None, 0) and seen.get(index) is not child.process
                   for index, child in enumerate(children))

    while any(child.process.poll() is None for child in children) or (not stopping and (due or unseen_death())):
        for index, child in enumerate(children):
            code = child.process.poll()
            if code in (None, 0) or stopping or index in due and due[index] > time.monotonic():
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
                forward(signal.SIGTERM, None)
                break
            log.warning("%s: worker pid %d %s; starting it again in %g s (restart %d of at most %d in a row); its "
                        "jobs come back when their leases lapse", child.label, child.process.pid, exit_reason(code),
                        delay, child.plan.failures, max_restarts)
            due[index] = time.monotonic() + delay
        time.sleep(CHILD_POLL)
    # A child that died earlier and was waiting to start again when the stop came was said then: not a failure now.
    codes = [child.process.returncode for index, child in enumerate(children) if index not in due]
    return failed or next((c for c in codes if c not in (0, -signal.SIGTERM, -signal.SIGINT)), 0)
