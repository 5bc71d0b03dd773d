"""One `embedfleet up` process as a user runs it, its output read as it comes, and whether a process it started
is still there."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest


class Up:
    """One `embedfleet up` process; its output (stdout and stderr together) is collected by a thread."""

    def __init__(self, *args: str, env: dict, cwd: Path | None = None):
        self.proc = subprocess.Popen([sys.executable, "-m", "embedfleet.producer.cli", "up", *args], env=env, cwd=cwd,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        self.ready = threading.Event()
        self.changed = threading.Condition()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            with self.changed:
                self.lines.append(line)
                self.changed.notify_all()
            if "Ctrl-C stops everything" in line:
                self.ready.set()
        self.ready.set()  # ended: wait_up() tells which
        with self.changed:
            self.changed.notify_all()

    def wait_for(self, text: str, after: int = 0, timeout: float = 120) -> str:
        """The first line from line `after` on that holds `text`, waiting for it (fails if `up` ends first)."""
        deadline = time.monotonic() + timeout
        with self.changed:
            while True:
                found = [line for line in self.lines[after:] if text in line]
                if found:
                    return found[0]
                if self.proc.poll() is not None and not self.reader.is_alive():
                    pytest.fail(f"embedfleet up ended before saying {text!r}:\n{self.output}")
                if time.monotonic() > deadline:
                    pytest.fail(f"embedfleet up did not say {text!r} within {timeout} s:\n{self.output}")
                self.changed.wait(1)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def wait_up(self) -> Up:
        self.ready.wait(240)
        if "Ctrl-C stops everything" not in self.output:
            self.kill()
            pytest.fail(f"embedfleet up did not come up:\n{self.output}")
        return self

    @property
    def redis_url(self) -> str:
        return re.search(r"is up: model '.*' on (redis://\S+)", self.output).group(1)

    def stop(self, sig=signal.SIGINT) -> int:
        self.proc.send_signal(sig)
        code = self.proc.wait(90)
        self.reader.join(10)
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
