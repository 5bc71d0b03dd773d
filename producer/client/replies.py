"""Reply listener: one XREAD loop on an AsyncProducer's reply stream wakes all its waiters, on one connection.

Requests an AsyncProducer submits carry its reply stream as `reply_to`; workers add each finished
request's id there. The listener hands the ids of each XREAD answer to the WaitHub together, which reads
their results in one round trip. After a reconnect (a Redis restart may have lost entries, MAXLEN may
have trimmed some meanwhile) it asks the hub to look at every waited id once more.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid

import redis
import redis.asyncio as aioredis

from common.protocol import keys
from common.redisclient import CLOSE_TIMEOUT, MAX_BLOCK, bounded, close_async
from producer.client.waiters import WaitHub

log = logging.getLogger(__name__)


class ReplyListener:
    """Feeds the ids on this producer's reply stream to `hub` (started by the first `start`)."""

    def __init__(self, connection: aioredis.Redis, hub: WaitHub):
        self.connection = connection
        self.hub = hub
        self.stream = keys.reply_stream_key(uuid.uuid4().hex)
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._listen(), name=f"replies {self.stream}")

    async def close(self) -> None:
        """Stop listening and delete the stream; bounded even on a Redis that hangs."""
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
                except (redis.ConnectionError, redis.TimeoutError) as exc:
                    log.warning("reply stream %s: Redis unreachable (%s); retrying in %.1f s", self.stream, exc,
                                backoff)
                    await asyncio.sleep(backoff)
                    backoff, recheck = min(backoff * 2, MAX_BLOCK), True
                    continue
                if recheck:
                    self.hub.recheck()
                backoff, recheck = 0.5, False
                woke = []
                for _, entries in replies:
                    for entry_id, fields in entries:
                        last_id = entry_id
                        request_id = fields.get(b"id", b"")
                        if keys.valid_request_id(request_id):  # a wake-up; the hub trusts only the result
                            woke.append(request_id.decode())
                        else:
                            log.warning("reply stream %s: entry %s names no request id; ignored",
                                        self.stream, entry_id)
                self.hub.woke(woke)
        except asyncio.CancelledError:
            raise
        except Exception:  # never silent: waiters fall back to their notify lists
            log.exception("reply stream %s: listener died; waiters fall back to their notify lists", self.stream)
            self.hub.stream_lost()
