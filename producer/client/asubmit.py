"""Native asyncio enqueue, coalesced: concurrent submits share one round trip (no thread per submit).

Whatever callers are waiting when the previous round returns go in the next one: one pipeline holding one
enqueue script per caller (common/protocol/operations.py), so that 10,000 concurrent submits cost a few round
trips on one connection instead of 10,000 queued for the pool (which would also starve the result reads).
Each caller's enqueue is its own script run, so each fails alone: an id already in use, or a queue past its
depth limit, which each script checks against the queue as the callers before it in the round left it (in
arrival order). A request that cannot be encoded fails in its caller's own submit, before it joins a round.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import redis
import redis.asyncio as aioredis

from common.protocol import keys, operations, scripts
from common.request import EmbedRequest
from common.scheduling import DEFAULT_PRIORITY
from producer.client.core import enqueue_args, queue_full

MAX_COALESCED = 2000  # requests per coalesced round


@dataclass
class _Submit:
    model: str
    work: operations.Enqueue
    size: int
    done: asyncio.Future = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class Submitter:
    """Enqueues the requests of concurrent callers together, one script run per caller, one round trip per
    round. `max_queue_depth` is checked per caller, in arrival order (common/protocol/scripts/enqueue.lua)."""

    def __init__(self, connection: aioredis.Redis, max_queue_depth: int | None):
        self.connection = connection
        self.max_queue_depth = max_queue_depth
        self._waiting: list[_Submit] = []
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task | None = None

    async def submit(self, model: str, requests: list[EmbedRequest], level: str = DEFAULT_PRIORITY) -> None:
        """Enqueue `requests` on `model`'s queue of that priority level, all or none; raises QueueFullError,
        DuplicateRequestError, a ValidationError for a request that cannot be encoded, or the Redis error of
        its round."""
        work = enqueue_args(keys.queue_name(model, level), requests, self.max_queue_depth)  # may fail alone
        item = _Submit(model, work, len(requests))
        self._waiting.append(item)
        self._wakeup.set()
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._loop(), name="embedfleet submits")
        await item.done

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        for item in self._waiting:
            if not item.done.done():
                item.done.cancel()

    async def _loop(self) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            while self._waiting:
                round_, size = [], 0
                while self._waiting and (not round_ or size + self._waiting[0].size <= MAX_COALESCED):
                    item = self._waiting.pop(0)
                    if not item.done.done():  # a caller cancelled before its round: nothing is sent for it
                        round_.append(item)
                        size += item.size
                if round_:
                    await self._round(round_)

    async def _round(self, round_: list[_Submit]) -> None:
        try:
            replies = await self._send(round_)
        except Exception as exc:  # noqa: BLE001 - a connection or Redis error fails every caller of the round
            for item in round_:
                if not item.done.done():
                    item.done.set_exception(exc)
            return
        for item, reply in zip(round_, replies):
            if item.done.done():
                continue
            try:
                if isinstance(reply, Exception):
                    raise reply
                operations.check_enqueued(reply)
            except operations.QueueFull as full:
                item.done.set_exception(queue_full(item.model, full.depth, self.max_queue_depth))
            except Exception as exc:  # noqa: BLE001 - this caller's own error (an id in use, a refused write)
                item.done.set_exception(exc)
            else:
                item.done.set_result(None)

    async def _send(self, round_: list[_Submit]) -> list:
        replies = await self._pipeline(round_)
        if any(isinstance(reply, redis.exceptions.NoScriptError) for reply in replies):
            replies = await self._pipeline(round_, by_source=True)  # a new or restarted server
        return replies

    async def _pipeline(self, round_: list[_Submit], by_source: bool = False) -> list:
        pipe = self.connection.pipeline(transaction=False)
        for item in round_:
            scripts.ENQUEUE.queue(pipe, item.work.keys, item.work.args, by_source)
        return await pipe.execute(raise_on_error=False)
