"""Native asyncio enqueue: rq writes the jobs, redis.asyncio sends them (no thread per submit).

rq's enqueue_many only queues commands on the pipeline it is given, so it runs here against a pipeline of
a client that never connects, and the commands it queued are replayed on an asyncio transaction. The jobs
are byte for byte what the sync Producer enqueues (producer.core.enqueue), with the same WATCH guard: an
id that already names a job or a result is refused.
"""

from __future__ import annotations

import redis
import redis.asyncio as aioredis
from rq import Queue
from rq.job import Job

from common import keys
from common.errors import DuplicateRequestError
from common.request import EmbedRequest
from producer.core import SERIALIZER, enqueue_data

# rq needs a client to build a pipeline from; this one is never asked to send anything (a pipeline only
# sends on execute(), and the queue's server version is set below, so rq does not read INFO through it).
_RECORDER = redis.Redis(host="embedfleet-recorder.invalid")


def job_commands(queue_name: str, requests: list[EmbedRequest], server_version: tuple) -> list[tuple]:
    """The (args, options) of each command rq's enqueue_many sends for `requests`."""
    queue = Queue(queue_name, connection=_RECORDER, serializer=SERIALIZER)
    queue.redis_server_version = server_version  # what rq would read with INFO, once per queue
    pipe = _RECORDER.pipeline()
    queue.enqueue_many([enqueue_data(r) for r in requests], pipeline=pipe)
    return list(pipe.command_stack)


async def server_version(connection: aioredis.Redis) -> tuple:
    info = await connection.info("server")
    return tuple(int(part) for part in str(info["redis_version"]).split(".")[:3])


async def enqueue(connection: aioredis.Redis, queue_name: str, requests: list[EmbedRequest],
                  version: tuple) -> None:
    """Enqueue `requests` in one transaction, all or none (see producer.core.enqueue)."""
    commands = job_commands(queue_name, requests, version)
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
