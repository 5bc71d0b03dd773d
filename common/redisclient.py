"""Redis clients with timeouts that suit blocking reads (BLPOP, BLMOVE), for every entry point.

redis-py 8 defaults to a 5 s socket timeout, shorter than the blocking reads here would like; a client
without any timeout would hang forever on a dead host. Blocking calls wait at most MAX_BLOCK seconds per
command (then loop), safely inside SOCKET_TIMEOUT.
"""

from __future__ import annotations

import redis
import redis.asyncio as aioredis

SOCKET_TIMEOUT = 30.0
CONNECT_TIMEOUT = 5.0
MAX_BLOCK = 10.0
MAX_ASYNC_CONNECTIONS = 64  # per asyncio client; a burst beyond it waits (up to SOCKET_TIMEOUT) for one


def connect(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, socket_timeout=SOCKET_TIMEOUT, socket_connect_timeout=CONNECT_TIMEOUT)


def connect_async(url: str) -> aioredis.Redis:
    pool = aioredis.BlockingConnectionPool.from_url(
        url, max_connections=MAX_ASYNC_CONNECTIONS, timeout=SOCKET_TIMEOUT, socket_timeout=SOCKET_TIMEOUT,
        socket_connect_timeout=CONNECT_TIMEOUT)
    return aioredis.Redis.from_pool(pool)  # the client owns the pool: aclose() closes it too


def block_for(seconds_left: float) -> float:
    """How long one blocking command may wait: what is left, within (0.01, MAX_BLOCK]."""
    return min(max(seconds_left, 0.01), MAX_BLOCK)
