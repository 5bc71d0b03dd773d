"""How every `embedfleet` command ends: exit 0, 1 (runtime failure) or 2 (usage), errors as one line.

An error is printed as `embedfleet: <what>; <what to do>` on stderr; the traceback only with --debug
(or EMBEDFLEET_DEBUG=1). Usage errors come from common.config.OneLineParser (exit 2).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

import redis

from embedfleet.common.errors import NO_WORKER_HINT, EmbedfleetError
from embedfleet.common.redisclient import AccessError, access_problem

EXIT_RUNTIME = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130  # the shell's convention for a command stopped by Ctrl-C

# What to do about an error, by code, where its message does not say so already.
HINTS = {
    "redis_unavailable": "is the fleet running? start one with `embedfleet up`, or pass --redis-url URL",
    "model_not_found": "`embedfleet status` lists the served models; pass --model NAME",
    "no_worker": NO_WORKER_HINT,
    "timeout": "the fleet may be busy or stopped: check `embedfleet status`, or raise --timeout",
}


def run(command: Callable[[list[str]], int], argv: list[str]) -> int:
    """Run one command; turn what it raises into one line and an exit code."""
    debug = "--debug" in argv or os.environ.get("EMBEDFLEET_DEBUG", "").lower() in ("1", "true", "yes")
    try:
        return command(argv)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except Exception as exc:  # the last resort: one line, not a traceback (re-raised with --debug)
        if debug:
            raise
        fail(summary(exc))
        return EXIT_RUNTIME


def fail(message: str) -> None:
    print(f"embedfleet: {' '.join(message.split())}", file=sys.stderr, flush=True)


def summary(exc: BaseException) -> str:
    """`<what>; <what to do>` for an exception a command let through."""
    problem = access_problem(exc)  # credentials, ACL or TLS: say so, not "unreachable"
    if problem and not isinstance(exc, AccessError):
        return problem
    # a Redis Cluster none of whose nodes answers: redis-py's own class, no ConnectionError
    if isinstance(exc, (redis.ConnectionError, redis.TimeoutError, redis.exceptions.RedisClusterUnreachableError)):
        return f"Redis is unreachable ({str(exc).rstrip('.')}); {HINTS['redis_unavailable']}"
    if isinstance(exc, EmbedfleetError):
        hint = HINTS.get(exc.code)
        return f"{exc.message.rstrip('.')}; {hint}" if hint and hint not in exc.message else exc.message
    if isinstance(exc, FileNotFoundError):
        return f"no such file: {exc.filename}; check the path"
    if isinstance(exc, OSError) and exc.filename:
        return f"{exc.strerror}: {exc.filename}; check the path and its permissions"
    return f"unexpected {type(exc).__name__}: {exc}; rerun with --debug for the traceback and report it"
