"""Native asyncio enqueue, coalesced: concurrent submits share one round trip (no thread per submit).

Whatever callers are waiting when the previous send returns go in the next one: one enqueue script run per
queue for all of them (common/protocol/scripts/enqueue.lua), so that 10,000 concurrent submits cost a few
round trips and script runs on one connection instead of 10,000 queued for the pool (which would also starve
the result reads). The script answers each caller on its own, so each fails alone: an id already in use, or
a queue past its depth limit, checked against the queue as the callers before it in the send left it (in
arrival order). A request that cannot be encoded fails in its caller's own submit, before it joins a send.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import redis
import redis.asyncio as aioredis

from embedfleet.common.names import tag_of
from embedfleet.common.protocol import enqueueing, keys, rqkeys, scripts, slotmoves
from embedfleet.common.request import EmbedRequest
from embedfleet.common.scheduling import DEFAULT_PRIORITY
from embedfleet.producer.client.core import enqueue_args, queue_full

MAX_COALESCED = 2000  # requests per coalesced send


@dataclass
class _Submit:
    model: str
    work: enqueueing.Enqueue
    size: int
    done: asyncio.Future = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class Submitter:
    """Enqueues the requests of concurrent callers together, one script run per queue, one round trip per
    send. `max_queue_depth` is checked per caller, in arrival order (common/protocol/scripts/enqueue.lua)."""

    def __init__(self, connection: aioredis.Redis, max_queue_depth: int | None, tag: str = ""):
        self.connection = connection
        self.max_queue_depth = max_queue_depth
        self.tag = tag  # on a Redis Cluster: its models' hash tag, in their queue names (keys.py)
        self._announced: set[str] = set()  # queues this producer listed in rq:queues (once each)
        self._waiting: list[_Submit] = []
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task | None = None

    async def submit(self, model: str, requests: list[EmbedRequest], level: str = DEFAULT_PRIORITY,
                     fresh: bool = False) -> None:
        """Enqueue `requests` on `model`'s queue of that priority level, all or none; raises QueueFullError,
        DuplicateRequestError, a ValidationError for a request that cannot be encoded, or the Redis error of
        its send. `fresh`: their ids are new random ones (not looked up)."""
        queue = keys.queue_name(model, level, self.tag)
        work = enqueue_args(queue, requests, self.max_queue_depth, fresh)  # may fail alone
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
                batch, size = [], 0
                while self._waiting and (not batch or size + self._waiting[0].size <= MAX_COALESCED):
                    item = self._waiting.pop(0)
                    if not item.done.done():  # a caller cancelled before its send: nothing is sent for it
                        batch.append(item)
                        size += item.size
                if batch:
                    await self._coalesced(batch)

    async def _coalesced(self, batch: list[_Submit]) -> None:
        try:
            replies = await self._send(batch)
        except Exception as exc:  # noqa: BLE001 - a connection or Redis error fails every caller of the send
            for item in batch:
                if not item.done.done():
                    item.done.set_exception(exc)
            return
        for item, reply in zip(batch, replies):
            if item.done.done():
                continue
            try:
                if isinstance(reply, Exception):
                    raise reply
                enqueueing.check_enqueued(reply)
            except enqueueing.QueueFull as full:
                item.done.set_exception(queue_full(item.model, full.depth, self.max_queue_depth))
            except Exception as exc:  # noqa: BLE001 - this caller's own error (an id in use, a refused write)
                item.done.set_exception(exc)
            else:
                item.done.set_result(None)

    async def _send(self, batch: list[_Submit]) -> list:
        """One reply per caller of the send, in its order: an enqueue script run per group of callers that
        share one (the same queue), all in one pipeline."""
        groups: list[list[int]] = []
        for i, item in enumerate(batch):
            group = next((g for g in groups if batch[g[0]].work.same_script(item.work)), None)
            if group is None:
                groups.append([i])
            else:
                group.append(i)
        replies = await self._pipeline_loaded(batch, groups)
        if slotmoves.is_cluster(self.connection):
            replies = await self._again_while_moving(batch, groups, replies)
        out: list = [None] * len(batch)
        for group, reply in zip(groups, replies):
            for position, i in enumerate(group):
                out[i] = reply if isinstance(reply, Exception) else reply[position]
        for group, reply in zip(groups, replies):
            if not isinstance(reply, Exception):
                self._announced.add(batch[group[0]].work.queue)
        return out

    async def _pipeline_loaded(self, batch: list[_Submit], groups: list[list[int]]) -> list:
        replies = await self._pipeline(batch, groups)
        if any(isinstance(reply, redis.exceptions.NoScriptError) for reply in replies):
            replies = await self._pipeline(batch, groups, by_source=True)  # a new or restarted server
        return replies

    async def _again_while_moving(self, batch: list[_Submit], groups: list[list[int]], replies: list) -> list:
        """Send again, with slotmoves.py's backoff, only the groups whose enqueue met a slot being moved (it
        wrote nothing; the others' ran, and must not run twice), until none does or MOVING_WAIT passed."""
        deadline, pause = time.monotonic() + slotmoves.MOVING_WAIT, slotmoves.FIRST_PAUSE
        while True:
            moving = [k for k, reply in enumerate(replies) if isinstance(reply, Exception)
                      and slotmoves.slot_moving(reply)]
            if not moving or time.monotonic() + pause > deadline:
                return replies
            await asyncio.sleep(pause)
            pause = min(pause * 2, slotmoves.MAX_PAUSE)
            for k, reply in zip(moving, await self._pipeline_loaded(batch, [groups[k] for k in moving])):
                replies[k] = reply

    async def _pipeline(self, batch: list[_Submit], groups: list[list[int]], by_source: bool = False) -> list:
        pipe = self.connection.pipeline(transaction=False)
        listed = []  # a tagged queue (Redis Cluster) goes into rq:queues outside its script (another slot)
        for group in groups:
            works = [batch[i].work for i in group]
            keys_, args = enqueueing.round_args(works, announce=works[0].queue not in self._announced)
            scripts.ENQUEUE.queue(pipe, keys_, args, by_source)
            if tag_of(works[0].queue) and works[0].queue not in self._announced:
                listed.append(rqkeys.rq_queue_key(works[0].queue))
        if listed:
            pipe.sadd(rqkeys.RQ_QUEUES, *listed)
        return (await pipe.execute(raise_on_error=False))[:len(groups)]
