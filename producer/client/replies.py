"""Reply listener: one XREAD loop on an AsyncProducer's reply stream wakes all its waiters, on one connection.

Requests an AsyncProducer submits carry its reply stream as `reply_to`; workers add each finished
request's id there. The listener hands the ids of each XREAD answer to the WaitHub together, which reads
their results in one round trip. The same XREAD reads the reply streams of other producers' requests that
this producer waits on (`watch`: a request wakes only on its own stream, common/protocol/keys.py), from the
entry that was their last when the wait looked; an entry {kick} on its own stream restarts the XREAD with a
stream added. After a reconnect (a Redis restart may have lost entries, MAXLEN may have trimmed some
meanwhile), or a restart after an unexpected error, it asks the hub to look at every waited id once more.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid

import redis
import redis.asyncio as aioredis

from embedfleet.common.names import valid_request_id
from embedfleet.common.policy import RESULT_TTL
from embedfleet.common.protocol import keys, slotmoves
from embedfleet.common.redisclient import CLOSE_TIMEOUT, MAX_BLOCK, bounded, close_async
from embedfleet.producer.client.redisfaults import OUTAGES  # unreachable, or down for now (CLUSTERDOWN)
from embedfleet.producer.client.waiters import OUTAGE_RECHECK, WaitHub

log = logging.getLogger(__name__)


class ReplyListener:
    """Feeds the ids on this producer's reply stream, and on the streams it `watch`es, to `hub` (started by
    the first `start` or `watch`). `commands`: the producer's command connections (for the kicks)."""

    def __init__(self, connection: aioredis.Redis, hub: WaitHub, commands: aioredis.Redis | None = None,
                 tag: str = ""):
        self.connection = connection
        self.hub = hub
        self.commands = commands or connection
        self.stream = keys.reply_stream_key(tag + uuid.uuid4().hex)  # `tag`: its models' slot on a cluster
        self._streams: dict[str, list] = {}  # another producer's stream -> [last id read, {ids waited on it}]
        self._watched: dict[str, str] = {}  # request id -> the stream it is watched on
        self._blocked = False  # an XREAD is in flight
        self._kicked = False  # ... and a kick was sent for it
        self._kicks: set[asyncio.Task] = set()
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._listen(), name=f"replies {self.stream}")
            self._task.add_done_callback(self._ended)

    def watch(self, stream: str, request_ids: list[str], last_id: bytes) -> None:
        """Read `stream` too (from `last_id` if it is new here) for `request_ids`."""
        if stream not in self._streams:
            self._streams[stream] = [last_id, set()]
        self._streams[stream][1].update(request_ids)
        for request_id in request_ids:
            self._watched[request_id] = stream
        self.start()
        if self._blocked and not self._kicked:
            self._kicked = True
            task = asyncio.get_running_loop().create_task(self._kick())
            self._kicks.add(task)
            task.add_done_callback(self._kicks.discard)

    def watches(self, request_id: str) -> bool:
        return request_id in self._watched

    def discard(self, request_id: str) -> None:
        """Nobody waits for `request_id`: its stream is read no more once no id waits on it."""
        stream = self._watched.pop(request_id, None)
        if stream is not None:
            ids = self._streams[stream][1]
            ids.discard(request_id)
            if not ids:
                del self._streams[stream]

    async def close(self) -> None:
        """Stop listening and delete the stream; bounded even on a Redis that hangs."""
        for task in [self._task, *self._kicks]:
            if task is not None:
                task.cancel()
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(self._task, CLOSE_TIMEOUT)
        await bounded(self.connection.delete(self.stream))
        await close_async(self.connection)

    async def _kick(self) -> None:
        try:
            await self.commands.pipeline(transaction=False).xadd(self.stream, {"kick": 1}).expire(
                self.stream, RESULT_TTL).execute()
        except (redis.ConnectionError, redis.TimeoutError):
            pass  # the XREAD fails too, and its reconnect looks at every id

    def _ended(self, task: asyncio.Task) -> None:
        """Never silent: a listener that died of an unexpected error is logged and started again, and every
        waited id is looked at once more (a wake-up may have come meanwhile)."""
        if task.cancelled() or task.exception() is None:
            return
        log.error("reply stream %s: listener died; starting it again in %.1f s", self.stream, OUTAGE_RECHECK,
                  exc_info=task.exception())

        def restart() -> None:
            if self._task is task:
                self.hub.recheck()
                self.start()

        asyncio.get_running_loop().call_later(OUTAGE_RECHECK, restart)

    async def _listen(self) -> None:
        last_id, backoff, recheck = "0-0", 0.5, False
        moving_pause = slotmoves.FIRST_PAUSE
        while True:
            streams = {self.stream: last_id, **{name: state[0] for name, state in self._streams.items()}}
            self._blocked, self._kicked = True, False
            try:
                replies = await self.connection.xread(streams, block=int(MAX_BLOCK * 1000))
            except OUTAGES as exc:
                log.warning("reply stream %s: Redis cannot answer (%s); retrying in %.1f s", self.stream, exc,
                            backoff)
                await asyncio.sleep(backoff)
                backoff, recheck = min(backoff * 2, MAX_BLOCK), True
                continue
            except redis.RedisError as exc:
                if slotmoves.slot_moving(exc):  # a reshard of the streams' slot: entries move with them, none lost
                    log.info("reply stream %s: its slot is being moved (%s); reading again in %.2f s", self.stream,
                             exc, moving_pause)
                    await asyncio.sleep(moving_pause)
                    moving_pause = min(moving_pause * 2, slotmoves.MAX_PAUSE)
                    continue
                if not isinstance(exc, redis.ResponseError):
                    raise
                self._drop_unreadable(exc)  # another's stream is no stream any more: its ids are looked at
                await asyncio.sleep(OUTAGE_RECHECK)
                continue
            finally:
                self._blocked = False
            if recheck:
                self.hub.recheck()
            backoff, recheck, moving_pause = 0.5, False, slotmoves.FIRST_PAUSE
            woke = []
            for raw_name, entries in replies:
                name = raw_name.decode() if isinstance(raw_name, bytes) else raw_name
                own = name == self.stream
                for entry_id, fields in entries:
                    if own:
                        last_id = entry_id
                    elif name in self._streams:
                        self._streams[name][0] = entry_id
                    request_id = fields.get(b"id", b"")
                    if valid_request_id(request_id):  # a wake-up; the hub trusts only the result
                        woke.append(request_id.decode())
                    elif own and b"kick" not in fields:
                        log.warning("reply stream %s: entry %s names no request id; ignored", self.stream, entry_id)
            self.hub.woke(woke)

    def _drop_unreadable(self, exc: redis.ResponseError) -> None:
        """XREAD refused (a watched key is of a foreign type: Redis is input): stop reading the other
        producers' streams; the hub looks at their ids again (and polls an id whose stream stays unreadable)."""
        ids = list(self._watched)
        log.warning("reply stream %s: XREAD refused (%s); the %d waits on other streams look again", self.stream,
                    exc, len(ids))
        self._streams.clear()
        self._watched.clear()
        self.hub.look_at(ids)
