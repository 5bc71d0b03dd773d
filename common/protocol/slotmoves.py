"""A Redis Cluster slot being moved (resharding): what its errors look like, and sending again until the move ends.

While a slot migrates (CLUSTER SETSLOT MIGRATING / IMPORTING, its keys MIGRATEd a few at a time) a command or
script whose keys are partly moved is refused with TRYAGAIN; one whose keys are all moved gets ASK; a script
that reaches, mid-run, a key (built from an id) that already moved stops with "non local key" (every script
judges what it reads before its first write, and enqueue.lua probes its new job keys before its push, so
such a stop wrote nothing). redis-py follows ASK and TRYAGAIN on its own for about 0.4 s, then raises
ClusterError("TTL exhausted"). None of these ran the command: it is sent again, with a short backoff, until
the move ends (the slot's new master answers, or MOVED points there) or MOVING_WAIT passes; then the last
error is raised (the caller's own error handling says it: a producer's UnavailableError, a worker's
connection-error backoff). A plain Redis never sees these errors: there nothing changes.
"""

from __future__ import annotations

import asyncio
import time

import redis
import redis.asyncio.cluster as aiocluster
import redis.cluster

MOVING_WAIT = 15.0  # seconds a slot's move may hold a command up before its error is raised
FIRST_PAUSE, MAX_PAUSE = 0.01, 0.2  # the backoff between tries: doubled each time, within these


def slot_moving(exc: BaseException) -> bool:
    """Whether `exc` says the command met a slot being moved (and did not run)."""
    if isinstance(exc, (redis.exceptions.TryAgainError, redis.exceptions.AskError)):
        return True  # (MovedError is an AskError: a move that just ended)
    if isinstance(exc, redis.exceptions.ClusterError):
        return "TTL exhausted" in str(exc)
    return isinstance(exc, redis.ResponseError) and "non local key" in str(exc)


def is_cluster(connection) -> bool:
    """Whether `connection` is a Redis Cluster client (sync or asyncio): only there can a slot move."""
    return isinstance(connection, (redis.cluster.RedisCluster, aiocluster.RedisCluster))


def while_moving(call, connection=None, wait: float = MOVING_WAIT):
    """`call()`, sent again while it meets a slot being moved (at most `wait` seconds). `connection`: a
    cluster client whose slot map is read again before each new try."""
    deadline, pause = time.monotonic() + wait, FIRST_PAUSE
    while True:
        try:
            return call()
        except redis.RedisError as exc:
            if not slot_moving(exc) or time.monotonic() + pause > deadline:
                raise
        time.sleep(pause)
        pause = min(pause * 2, MAX_PAUSE)
        if isinstance(connection, redis.cluster.RedisCluster):
            connection.nodes_manager.initialize()


async def while_moving_async(call, wait: float = MOVING_WAIT):
    """while_moving for a coroutine function `call` (redis-py's asyncio cluster reads its map on MOVED)."""
    deadline, pause = time.monotonic() + wait, FIRST_PAUSE
    while True:
        try:
            return await call()
        except redis.RedisError as exc:
            if not slot_moving(exc) or time.monotonic() + pause > deadline:
                raise
        await asyncio.sleep(pause)
        pause = min(pause * 2, MAX_PAUSE)
