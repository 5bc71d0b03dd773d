"""Reply listener: one XREAD loop wakes every waiter of an AsyncProducer, on one Redis connection.

Requests an AsyncProducer submits carry its reply stream as `reply_to`; workers add each finished
request's id there. Waiting on a thousand requests then costs one blocked connection, not a thousand
BLPOPs. Ids this producer did not submit are waited for on their notify lists instead (see AsyncProducer).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import OrderedDict

import redis
import redis.asyncio as aioredis

from common import keys
from common.errors import UnavailableError
from common.redisclient import CLOSE_TIMEOUT, MAX_BLOCK, bounded, close_async

log = logging.getLogger(__name__)

EARLY_REPLIES = 4096  # how many replies for not-yet-expected ids are remembered (a tiny race window)


class ReplyListener:
    """Resolves a future per waiting id when its id appears on this producer's reply stream."""

    def __init__(self, connection: aioredis.Redis):
        self.connection = connection
        self.stream = keys.reply_stream_key(uuid.uuid4().hex)
        self._inflight: dict[str, float] = {}  # submitted through this producer, no reply seen yet
        self._early: OrderedDict[str, None] = OrderedDict()  # replies that beat their expect() call
        self._waiters: dict[str, list[asyncio.Future]] = {}
        self._task: asyncio.Task | None = None
        self._failure: BaseException | None = None

    def expect(self, request_ids: list[str]) -> None:
        """Note ids just enqueued with this stream as their `reply_to` (a reply may already be in)."""
        stamp = time.monotonic()
        for request_id in request_ids:
            if request_id in self._early:
                del self._early[request_id]
            else:
                self._inflight[request_id] = stamp
        if self._task is None or self._task.done():
            self._failure = None
            self._task = asyncio.get_running_loop().create_task(self._listen(), name=f"replies {self.stream}")

    def handles(self, request_id: str) -> bool:
        return self._failure is None and request_id in self._inflight

    def waiter(self, request_id: str) -> asyncio.Future:
        future = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(request_id, []).append(future)
        return future

    def forget(self, request_id: str, future: asyncio.Future) -> None:
        futures = self._waiters.get(request_id, [])
        with contextlib.suppress(ValueError):
            futures.remove(future)
        if not futures:
            self._waiters.pop(request_id, None)

    def complete(self, request_id: str) -> None:
        """A reply for `request_id` (from the stream, or known locally, e.g. a cancel)."""
        if self._inflight.pop(request_id, None) is None and request_id not in self._waiters:
            self._early[request_id] = None
            while len(self._early) > EARLY_REPLIES:
                self._early.popitem(last=False)
        for future in self._waiters.pop(request_id, []):
            if not future.done():
                future.set_result(None)

    async def close(self) -> None:
        """Fail pending waits, stop listening and delete the stream; bounded even on a Redis that hangs."""
        self._fail_waiters(UnavailableError("the producer was closed while waiting for a result"))
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(self._task, CLOSE_TIMEOUT)
        await bounded(self.connection.delete(self.stream))
        await close_async(self.connection)

    async def _listen(self) -> None:
        last_id, backoff, recheck = "0-0", 0.5, False
        try:
            while True:
                try:
                    replies = await self.connection.xread({self.stream: last_id}, block=int(MAX_BLOCK * 1000))
                    if recheck:
                        await self._complete_landed()
                    backoff, recheck = 0.5, False
                except (redis.ConnectionError, redis.TimeoutError) as exc:
                    log.warning("reply stream %s: Redis unreachable (%s); retrying in %.1f s", self.stream, exc,
                                backoff)
                    await asyncio.sleep(backoff)
                    backoff, recheck = min(backoff * 2, MAX_BLOCK), True
                    continue
                for _, entries in replies:
                    for entry_id, fields in entries:
                        last_id = entry_id
                        request_id = fields.get(b"id", b"")
                        if keys.valid_request_id(request_id):  # a wake-up; wait() trusts only the result
                            self.complete(request_id.decode())
                        else:
                            log.warning("reply stream %s: entry %s names no request id; ignored",
                                        self.stream, entry_id)
                self._prune()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # never silent: waiters fall back to their notify lists
            log.exception("reply stream %s: listener died; waiters fall back to BLPOP", self.stream)
            self._failure = exc
            self._fail_waiters(exc)

    async def _complete_landed(self) -> None:
        """After an outage the stream may have lost entries (a restarted Redis without them, or MAXLEN
        trimming while we were away): wake every waiter whose result is already there."""
        waiting = list(self._waiters)
        if waiting:
            found = await self.connection.mget([keys.result_key(i) for i in waiting])
            for request_id, blob in zip(waiting, found):
                if blob is not None:
                    self.complete(request_id)

    def _fail_waiters(self, exc: BaseException) -> None:
        for futures in self._waiters.values():
            for future in futures:
                if not future.done():
                    future.set_exception(exc)
        self._waiters.clear()

    def _prune(self) -> None:
        """Ids whose job expired unserved never get a reply: forget them after the job's TTL."""
        horizon = time.monotonic() - keys.JOB_TTL
        if self._inflight and next(iter(self._inflight.values())) < horizon:
            self._inflight = {i: t for i, t in self._inflight.items() if t >= horizon}
