"""Where a running `embedfleet up` says which Redis it serves, and how every command finds a Redis URL.

Each `up` writes one small JSON file, `${XDG_CACHE_HOME:-~/.cache}/embedfleet/up/<pid>.json`, while it
runs, and removes it when it stops. A Redis URL is resolved in this order (first wins):

    1. the --redis-url flag (or the `redis_url` argument of Producer/AsyncProducer)
    2. the EMBEDFLEET_REDIS_URL environment variable
    3. the most recently started `embedfleet up` that is still running
    4. redis://127.0.0.1:6379/0 (rq's default too); a process that connects to it so is told once, on stderr
       (a fleet that is not running should not look like an empty one on someone else's Redis)
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
from pathlib import Path

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
ENV_REDIS_URL = "EMBEDFLEET_REDIS_URL"
_fell_back = False  # whether resolve_redis_url gave DEFAULT_REDIS_URL for want of any other in this process


def state_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "embedfleet" / "up"


def write(state: dict) -> Path:
    """Publish this process's fleet (`state` holds at least `redis_url`); returns the file to remove later."""
    folder = state_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{os.getpid()}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"pid": os.getpid(), **state}))
    tmp.replace(path)  # readers never see half a file
    return path


def remove(path: Path | None) -> None:
    if path is not None:
        path.unlink(missing_ok=True)


def running() -> list[dict]:
    """The states of the `up`s still running, most recently started first (files of dead ones are skipped)."""
    found = []
    for path in state_dir().glob("*.json"):
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):  # vanished, or not ours
            state = json.loads(path.read_text())
            if _alive(int(state["pid"])):
                found.append((path.stat().st_mtime, state))
    return [state for _, state in sorted(found, key=lambda pair: pair[0], reverse=True)]


def resolve_redis_url(url: str | None = None) -> str:
    """The Redis URL to use, by the order in this module's docstring. Empty strings count as unset."""
    if url:
        return url
    if os.environ.get(ENV_REDIS_URL):
        return os.environ[ENV_REDIS_URL]
    fleets = running()
    if fleets:
        return fleets[0]["redis_url"]
    global _fell_back
    _fell_back = True
    return DEFAULT_REDIS_URL


def connecting(url: str) -> None:
    """Called by every client made from a URL (common.redisclient): the first connection to the default Redis
    that no one named says so, once."""
    if _fell_back and url == DEFAULT_REDIS_URL:
        _say_default()


@functools.cache
def _say_default() -> None:
    logging.getLogger("embedfleet").warning(
        "embedfleet: using Redis %s, the default: no --redis-url, no %s and no `embedfleet up` running",
        DEFAULT_REDIS_URL, ENV_REDIS_URL)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True
