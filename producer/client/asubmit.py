"""Native asyncio enqueue: rq writes the jobs, redis.asyncio sends them (no thread per submit).

rq's enqueue_many only queues commands on the pipeline it is given, so it runs here against a pipeline of
a client that never connects, and the commands it queued are replayed on an asyncio transaction. The jobs
are byte for byte what the sync Producer enqueues (producer.client.core.enqueue), with the same WATCH guard: an
id that already names a job or a result is refused.

Concurrent submits are coalesced (Submitter): whatever callers are waiting when the previous transaction
returns go in the next one, so that 10,000 concurrent submits cost a few transactions on one connection
instead of 10,000 queued for the pool (which would also starve the result reads).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import redis
import redis.asyncio as aioredis
from rq import Queue
from rq.job import Job

from common.protocol import keys
from common.errors import DuplicateRequestError, QueueFullError
from common.request import EmbedRequest
from common.scheduling import DEFAULT_PRIORITY
from producer.client.core import SERIALIZER, count_tokens, enqueue_data

# rq needs a client to build a pipeline from; this one is never asked to send anything (a pipeline only
# sends on execute(), and the queue's server version is set below, so rq does not read INFO through it).
_RECORDER = redis.Redis(host="embedfleet-recorder.invalid")


def job_commands(queue_name: str, requests: list[EmbedRequest], server_version: tuple,
                 payloads: list[bytes] | None = None) -> list[tuple]:
    """The (args, options) of each command rq's enqueue_many sends for `requests` (`payloads`: their encodings,
    when the caller made them already)."""
    queue = Queue(queue_name, connection=_RECORDER, serializer=SERIALIZER)
    queue.redis_server_version = server_version  # what rq would read with INFO, once per queue
    pipe = _RECORDER.pipeline()
    payloads = payloads or [None] * len(requests)
    queue.enqueue_many([enqueue_data(r, p) for r, p in zip(requests, payloads)], pipeline=pipe)
    count_tokens(pipe, queue_name, requests)
    return list(pipe.command_stack)


async def server_version(connection: aioredis.Redis) -> tuple:
    info = await connection.info("server")
    return tuple(int(part) for part in str(info["redis_version"]).split(".")[:3])


async def enqueue_commands(connection: aioredis.Redis, commands: list[tuple], requests: list[EmbedRequest]) -> None:
    """Send rq's `commands` for `requests` in one transaction, all or none (see producer.client.core.enqueue)."""
    taken = [key for r in requests for key in (Job.key_for(r.id), keys.result_key(r.id))]
    async with connection.pipeline(transaction=True) as pipe:
        while True:
            try:
                await pipe.watch(*taken)
                if await pipe.exists(*taken):
                    for r in requests:
                        if await pipe.exists(Job.key_for(r.id), keys.result_key(r.id)):
                            raise DuplicateRequestError(f"request id {r.id} is already in use: ids are never "
                                                        "reused")
                pipe.multi()
                for args, options in commands:
                    pipe.execute_command(*args, **options)
                await pipe.execute()
                return
            except redis.WatchError:
                continue


MAX_COALESCED = 2000  # requests per coalesced transaction


@dataclass
class _Submit:
    model: str
    queue: str
    requests: list[EmbedRequest]
    payloads: list[bytes]  # the requests encoded
    done: asyncio.Future = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class Submitter:
    """Enqueues the requests of concurrent callers together, in one transaction per round.

    `max_queue_depth` is checked per caller, in arrival order, against the queue's length read once per
    round (so that callers of one round cannot all squeeze past the limit together).
    """

    def __init__(self, connection: aioredis.Redis, max_queue_depth: int | None):
        self.connection = connection
        self.max_queue_depth = max_queue_depth
        self.version: tuple | None = None
        self._waiting: list[_Submit] = []
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task | None = None

    async def submit(self, model: str, requests: list[EmbedRequest], level: str = DEFAULT_PRIORITY) -> None:
        """Enqueue `requests` on `model`'s queue of that priority level, all or none; raises QueueFullError,
        DuplicateRequestError or the Redis error of its round; ValidationError for a request that cannot be
        encoded."""
        # Encoded here, by the caller, before it joins a round: a request that cannot be encoded (too large, a
        # value msgpack cannot carry) fails its own caller, never the others enqueued in the same round.
        item = _Submit(model, keys.queue_name(model, level), requests, [r.encode() for r in requests])
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
                while self._waiting and (not round_ or size + len(self._waiting[0].requests) <= MAX_COALESCED):
                    item = self._waiting.pop(0)
                    if not item.done.done():  # a caller cancelled before its round: nothing is sent for it
                        round_.append(item)
                        size += len(item.requests)
                if round_:
                    await self._round(round_)

    async def _round(self, round_: list[_Submit]) -> None:
        try:
            if self.version is None:
                self.version = await server_version(self.connection)
            admitted = await self._admit(round_)
            try:
                await self._enqueue(admitted)
            except DuplicateRequestError:  # one caller's id is taken: the others must not fail with it
                for item in admitted:
                    await self._enqueue([item])
        except Exception as exc:  # noqa: BLE001 - a connection or Redis error fails every caller of the round
            for item in round_:
                if not item.done.done():
                    item.done.set_exception(exc)
        for item in round_:
            if not item.done.done():
                item.done.set_result(None)

    async def _admit(self, round_: list[_Submit]) -> list[_Submit]:
        if self.max_queue_depth is None:
            return round_
        queues = sorted({item.queue for item in round_})
        pipe = self.connection.pipeline(transaction=False)
        for queue in queues:
            pipe.llen("rq:queue:" + queue)
        depths = dict(zip(queues, await pipe.execute()))
        admitted = []
        for item in round_:
            depth = depths[item.queue]
            if depth + len(item.requests) > self.max_queue_depth:
                item.done.set_exception(QueueFullError(
                    f"the queue of model '{item.model}' holds {depth} requests, the limit is "
                    f"{self.max_queue_depth}: retry later"))
            else:
                depths[item.queue] = depth + len(item.requests)
                admitted.append(item)
        return admitted

    async def _enqueue(self, items: list[_Submit]) -> None:
        """One transaction for `items`; a DuplicateRequestError fails the one item it names when alone."""
        if not items:
            return
        try:
            commands = [c for item in items
                        for c in job_commands(item.queue, item.requests, self.version, item.payloads)]
            await enqueue_commands(self.connection, commands, [r for item in items for r in item.requests])
        except DuplicateRequestError as err:
            if len(items) > 1:
                raise
            items[0].done.set_exception(err)
            return
        for item in items:
            if not item.done.done():
                item.done.set_result(None)
