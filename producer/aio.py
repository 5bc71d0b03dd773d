"""AsyncProducer: the asyncio face of Producer, for web apps and the gateway.

Waiting is native asyncio: requests this producer submitted wake through its reply stream (one blocked
connection for all waiters, producer/replies.py), any other id through BLPOP on its notify list. rq's
enqueue/cancel/status calls are synchronous by design and run in worker threads.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import redis.asyncio as aioredis

from common import keys
from common.capabilities import ModelCapabilities
from common.errors import NotFoundError, ResultTimeoutError, UnavailableError
from common.params import PoolingParams
from common.redisclient import MAX_ASYNC_CONNECTIONS, block_for, close_async, connect_async
from common.result import Result
from producer.client import Producer
from producer.core import PENDING, read_result, redis_errors
from producer.replies import ReplyListener

OUTAGE_RECHECK = 0.5  # seconds between a waiter's looks for its result while Redis is unreachable


@dataclass
class _Link:
    """One Redis (shard) of the fleet: short commands, this producer's reply stream there, and the BLPOPs
    for ids this producer did not submit, in a pool of their own so that however many there are they never
    starve short commands (beyond the pool's size they queue for a slot)."""

    url: str
    redis: aioredis.Redis = field(init=False)
    replies: ReplyListener = field(init=False)
    blocking: aioredis.Redis = field(init=False)
    slots: asyncio.Semaphore = field(init=False)

    def __post_init__(self):
        self.redis = connect_async(self.url)
        self.replies = ReplyListener(connect_async(self.url))
        self.blocking = connect_async(self.url)
        self.slots = asyncio.Semaphore(MAX_ASYNC_CONNECTIONS)

    async def close(self) -> None:
        await self.replies.close()
        await close_async(self.blocking)
        await close_async(self.redis)


class AsyncProducer:
    """Same methods as Producer, as coroutines. See Producer for the arguments."""

    def __init__(self, redis_url: str | None = None, *, shards: Mapping[str, str] | None = None,
                 max_queue_depth: int | None = None):
        self._sync = Producer(redis_url, shards=shards, max_queue_depth=max_queue_depth)
        # URLs resolved once (flag, env, running `up`, default), one link per shard
        self._links = {url: _Link(url) for url in self._sync.shards.urls()}
        self.redis = self._links[self._sync.redis_url].redis  # the default Redis

    async def close(self) -> None:
        """Fail pending waits and drop every connection. Bounded: each step that talks to Redis gets
        CLOSE_TIMEOUT, so a Redis that stopped answering cannot hang a shutdown."""
        for link in self._links.values():
            await link.close()
        self._sync.close()  # closes sockets only; not in a thread, whose pool may be busy with stuck calls

    async def connection_of(self, request_id: str) -> aioredis.Redis:
        """The asyncio client of the shard that holds `request_id` (the only one, unless sharded)."""
        return (await self._link_of(request_id)).redis

    async def _link_of(self, request_id: str) -> _Link:
        if len(self._links) == 1:
            return self._links[self._sync.redis_url]
        return self._links[await asyncio.to_thread(self._sync.url_of, request_id)]

    async def __aenter__(self) -> AsyncProducer:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    @property
    def max_queue_depth(self) -> int | None:
        return self._sync.max_queue_depth

    async def models(self) -> dict[str, ModelCapabilities]:
        return await asyncio.to_thread(self._sync.models)

    async def live_workers(self, model: str) -> int:
        return await asyncio.to_thread(self._sync.live_workers, model)

    async def workers(self, model: str) -> list[dict]:
        return await asyncio.to_thread(self._sync.workers, model)

    async def fleet(self) -> dict:
        return await asyncio.to_thread(self._sync.fleet)

    async def queue_depth(self, model: str) -> int:
        return await asyncio.to_thread(self._sync.queue_depth, model)

    async def submit(self, inputs, model: str | None = None, *, params: PoolingParams | None = None,
                     reply_to: str | None = None, **fields) -> str:
        return (await self.submit_many([inputs], model, params=params, reply_to=reply_to, **fields))[0]

    async def submit_many(self, batches: list, model: str | None = None, *,
                          params: PoolingParams | None = None, reply_to: str | None = None,
                          **fields) -> list[str]:
        link = self._links[self._sync.redis_url]
        if len(self._links) > 1:
            link = self._links[await asyncio.to_thread(self._sync.url_for_submit, model)]
        ids = await asyncio.to_thread(self._sync.submit_many, batches, model, params=params,
                                      reply_to=reply_to or link.replies.stream, **fields)
        if reply_to is None:
            link.replies.expect(ids)
        return ids

    async def get(self, request_id: str) -> Result | None:
        connection = await self.connection_of(request_id)
        with redis_errors():
            raw = await connection.get(keys.result_key(request_id))
        return read_result(request_id, raw)

    async def wait(self, request_id: str, timeout: float = 60.0) -> Result:
        """Block until the result lands; raises TimeoutError or the request's own error.

        A wait rides out a Redis outage shorter than its timeout, and a wake-up (a reply-stream entry, a
        notify-list element) counts only once the result it announces is there: anyone who can write to
        Redis can forge one.
        """
        deadline = time.monotonic() + timeout
        link = await self._link_of(request_id)
        if link.replies.handles(request_id):
            result = await self._wait_reply(link, request_id, deadline, timeout)
        else:
            result = await self._wait_notify(link, request_id, deadline, timeout)
        result.raise_for_error()
        return result

    async def _wait_reply(self, link: _Link, request_id: str, deadline: float, timeout: float) -> Result:
        while True:
            future = link.replies.waiter(request_id)  # before the GET: a reply after it cannot be missed
            try:
                result, reachable = await self._get_through_outage(request_id)
                if result is not None:  # landed before the wait began (its reply may be yet to come)
                    link.replies.complete(request_id)
                    return result
                left = deadline - time.monotonic()
                try:  # in an outage the reply may have come and gone unseen: look again soon
                    await asyncio.wait_for(future, max(left if reachable else min(left, OUTAGE_RECHECK), 0))
                except asyncio.TimeoutError:
                    if time.monotonic() < deadline:
                        continue
                    raise await self._timeout(request_id, timeout) from None
                except UnavailableError:  # the producer was closed
                    raise
                except Exception:  # noqa: BLE001 - the listener died (it logged why); notify lists still work
                    return await self._wait_notify(link, request_id, deadline, timeout)
            finally:
                link.replies.forget(request_id, future)
            result = await self.get(request_id)
            if result is not None:
                return result
            await self._check_still_pending(request_id)  # a reply without its result: forged, or expired

    async def _wait_notify(self, link: _Link, request_id: str, deadline: float, timeout: float) -> Result:
        await asyncio.to_thread(self._sync.raise_if_unknown, request_id)  # an id that never existed: at once
        while True:
            result, reachable = await self._get_through_outage(request_id)
            if result is not None:
                return result
            left = deadline - time.monotonic()
            if left <= 0:
                raise await self._timeout(request_id, timeout)
            woke = None
            if reachable:
                try:
                    woke = await self._blpop(link, request_id, deadline)
                except UnavailableError:
                    reachable = False
            if not reachable:
                await asyncio.sleep(min(left, OUTAGE_RECHECK))
            elif woke is not None:
                result = await self.get(request_id)
                if result is not None:
                    return result
                await self._check_still_pending(request_id)  # a wake-up without its result: forged
                with redis_errors():  # else every BLPOP would take it again (a result lands with a new one)
                    await link.redis.delete(keys.notify_key(request_id))

    async def _get_through_outage(self, request_id: str) -> tuple[Result | None, bool]:
        """(the result or None, whether Redis answered)."""
        try:
            return await self.get(request_id), True
        except UnavailableError:
            return None, False

    async def _check_still_pending(self, request_id: str) -> None:
        """After a wake-up that announced a result which is not there: go on waiting if the request is
        still queued or running (the wake-up was forged), else its result has expired."""
        if await self.status(request_id) not in PENDING:
            raise NotFoundError(f"the result of request {request_id} has expired")

    async def _blpop(self, link: _Link, request_id: str, deadline: float):
        """One bounded BLPOP on the notify list; None if it timed out (or no slot freed in time)."""
        try:
            await asyncio.wait_for(link.slots.acquire(), max(deadline - time.monotonic(), 0))
        except asyncio.TimeoutError:
            return None
        try:
            with redis_errors():
                key = keys.notify_key(request_id)
                woke = await link.blocking.blpop([key], timeout=block_for(deadline - time.monotonic()))
                if woke is not None:  # hand the wake-up on to any other waiter on the same id
                    await link.blocking.pipeline().rpush(key, 1).expire(key, keys.RESULT_TTL).execute()
                return woke
        finally:
            link.slots.release()

    async def _timeout(self, request_id: str, timeout: float) -> ResultTimeoutError:
        return ResultTimeoutError(f"no result for request {request_id} after {timeout:g} s "
                            f"(status: {await self.status(request_id)})")

    async def embed(self, inputs, model: str | None = None, *, timeout: float = 60.0, **fields) -> np.ndarray:
        """Submit and wait: the embeddings as a numpy array of shape (n, d)."""
        return (await self.wait(await self.submit(inputs, model, **fields), timeout)).embeddings

    async def status(self, request_id: str) -> str:
        return await asyncio.to_thread(self._sync.status, request_id)

    async def cancel(self, request_id: str) -> bool:
        link = await self._link_of(request_id)
        cancelled = await asyncio.to_thread(self._sync.cancel, request_id)
        if cancelled:
            link.replies.complete(request_id)
        return cancelled
