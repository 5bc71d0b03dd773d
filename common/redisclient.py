"""Redis clients with timeouts that suit blocking reads (BLPOP, BLMOVE), for every entry point.

redis-py 8 defaults to a 5 s socket timeout, shorter than the blocking reads here would like; a client
without any timeout would hang forever on a dead host. Blocking calls wait at most MAX_BLOCK seconds per
command (then loop), safely inside SOCKET_TIMEOUT.

After a Redis restart every pooled connection is stale, and the first command on each fails with
"Connection closed by server". redis-py's sync client retries that on its own; an asyncio client built on
a pool of its own does not, so `connect_async` asks for one retry, on a fresh connection, of a command
whose connection failed. A timeout is not retried (it would double a wait on a hung Redis). The commands
sent here may safely run twice: reads, SET, DEL, EXPIRE, and RPUSH on a notify list (one more wake-up).
"""

from __future__ import annotations

import asyncio
import contextlib

import redis
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

SOCKET_TIMEOUT = 30.0
CONNECT_TIMEOUT = 5.0
MAX_BLOCK = 10.0
MAX_ASYNC_CONNECTIONS = 64  # per asyncio client; a burst beyond it waits (up to SOCKET_TIMEOUT) for one
CLOSE_TIMEOUT = 2.0  # seconds each step of closing an async client may take (a hung peer cannot stall it)


def connect(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, socket_timeout=SOCKET_TIMEOUT, socket_connect_timeout=CONNECT_TIMEOUT)


def connect_async(url: str) -> aioredis.Redis:
    pool = aioredis.BlockingConnectionPool.from_url(
        url, max_connections=MAX_ASYNC_CONNECTIONS, timeout=SOCKET_TIMEOUT, socket_timeout=SOCKET_TIMEOUT,
        socket_connect_timeout=CONNECT_TIMEOUT, retry=Retry(NoBackoff(), 1, (redis.ConnectionError,)))
    return aioredis.Redis.from_pool(pool)  # the client owns the pool: aclose() closes it too


def block_for(seconds_left: float) -> float:
    """How long one blocking command may wait: what is left, within (0.01, MAX_BLOCK]."""
    return min(max(seconds_left, 0.01), MAX_BLOCK)


async def bounded(step, what: str = "") -> None:
    """Await one best-effort step of a shutdown for at most CLOSE_TIMEOUT; a Redis error or a peer that
    does not answer in time ends the step, never the shutdown."""
    with contextlib.suppress(asyncio.TimeoutError, redis.RedisError, OSError):
        await asyncio.wait_for(step, CLOSE_TIMEOUT)


async def close_async(client: aioredis.Redis) -> None:
    """Close an asyncio client and its pool in bounded time. Closing a socket first waits for the peer
    (a TLS close_notify, say); a peer that never answers is left to the transport's own abort."""
    await bounded(client.aclose())
