"""Running `embedfleet` as a user would: a real process, the user's env minus EMBEDFLEET_* settings, and
XDG_CACHE_HOME in a temp folder (so a running `up` of the user's is never found, nor a test's published)."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def clean_env(cache: Path, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EMBEDFLEET_")}
    return {**env, "XDG_CACHE_HOME": str(cache), "PYTHONPATH": str(ROOT), **extra}


def embedfleet(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "embedfleet.producer.cli", *args], capture_output=True, text=True,
                          timeout=120, env=env)


def wait_for(condition, timeout: float = 30.0, what: str = "condition") -> None:
    """Wait for an event another process or thread brings about: `condition()` true, or fail after `timeout`."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def assert_one_line_error(done: subprocess.CompletedProcess, code: int, *words: str) -> None:
    """Exit `code`, and on stderr exactly one line `embedfleet: ...` holding `words`; no traceback."""
    assert done.returncode == code, (done.returncode, done.stderr)
    assert done.stderr.startswith("embedfleet: ") and done.stderr.count("\n") == 1, done.stderr
    assert "Traceback" not in done.stderr and all(word in done.stderr for word in words), done.stderr


@contextlib.contextmanager
def socket_listening():
    """A plain TCP listener on a free port (yielded), as another program holding it would be."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def advertised(producer, model: str, worker: subprocess.Popen | threading.Thread, timeout: float = 120,
               name: str | None = None) -> dict:
    """The advert of `worker` once it serves `model`: a worker process, or a thread of this one (it must not end
    meanwhile); `name`: the advert of that worker, among others of the model's."""
    deadline = time.monotonic() + timeout
    pause = 0.2 if isinstance(worker, subprocess.Popen) else 0.01  # a thread advertises within milliseconds
    while not (found := [w for w in producer.workers(model) if name is None or w["name"] == name]):
        alive = worker.poll() is None if isinstance(worker, subprocess.Popen) else worker.is_alive()
        assert alive and time.monotonic() < deadline, "no worker came up"
        time.sleep(pause)
    return found[0]


def running(pid: int) -> bool:
    """Whether process `pid` still runs (a zombie, dead but not yet reaped by whoever adopted it, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def children_of(pid: int) -> list[int]:
    """The live child processes of `pid` (Linux /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError):
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                if int(fields[1]) == pid and fields[0] != "Z":
                    found.append(int(entry.name))
    return found
