"""Waits on ids a Producer submitted (without a reply stream): one BLPOP over all their notify lists, on one
connection.

Their results wake no reply stream, only the request's notify list (lib.lua `publish`; the requests of
other AsyncProducers wake on their own streams, which the ReplyListener reads: producer/client/replies.py). One
BLPOP names every such list plus this producer's kick list; a wait that starts meanwhile pushes one
element on the kick list, which ends the BLPOP so that the next one names the new id too. A popped
wake-up is pushed back (another process may wait on the same id) and the id is read by the WaitHub.
A notify key that is not a list (Redis is input) would fail the BLPOP of all: it leaves the BLPOP and its
wait looks at its result every OUTAGE_RECHECK seconds instead.
"""

from __future__ import annotations

import asyncio
import logging
import uuid

import redis
import redis.asyncio as aioredis

from embedfleet.common.policy import RESULT_TTL
from embedfleet.common.protocol import keys, slotmoves
from embedfleet.common.redisclient import MAX_BLOCK, bounded, close_async
from embedfleet.producer.client.redisfaults import OUTAGES  # unreachable, or down for now (CLUSTERDOWN)
from embedfleet.producer.client.waiters import OUTAGE_RECHECK, WaitHub

log = logging.getLogger(__name__)


class NotifyListener:
    def __init__(self, connect, commands: aioredis.Redis, hub: WaitHub, tag: str = ""):
        self._connect = connect  # made on first use: a producer that waits only on its own ids needs none
        self.connection: aioredis.Redis | None = None
        self.commands = commands
        self.hub = hub
        self.kick = keys.kick_key(tag + uuid.uuid4().hex)  # `tag`: the slot of its ids' lists on a cluster
        self.ids: set[str] = set()
        self.unusable: set[str] = set()  # ids whose notify key is no list: polled (_poll)
        self._changed = asyncio.Event()
        self._blocked = False  # a BLPOP is in flight
        self._kicked = False  # ... and a kick was sent for it
        self._kicks: set[asyncio.Task] = set()
        self._task: asyncio.Task | None = None

    def add(self, request_id: str) -> None:
        if request_id in self.ids or request_id in self.unusable:
            return
        self.ids.add(request_id)
        self._changed.set()
        if self._task is None or self._task.done():
            self._start()
        elif self._blocked and not self._kicked:
            self._kicked = True
            task = asyncio.get_running_loop().create_task(self._send_kick())
            self._kicks.add(task)
            task.add_done_callback(self._kicks.discard)

    def _start(self) -> None:
        if self.connection is None:
            self.connection = self._connect()
        self._task = asyncio.get_running_loop().create_task(self._listen(), name=f"notify {self.kick}")
        self._task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task) -> None:
        """Never silent: a listener that died of an unexpected error is logged and started again (its waits
        are looked at once more: a wake-up may have come meanwhile)."""
        if task.cancelled() or task.exception() is None:
            return
        log.error("notify listener died; starting it again in %.1f s", OUTAGE_RECHECK, exc_info=task.exception())

        def restart() -> None:
            if self._task is task and self.ids:
                self.hub.look_at(list(self.ids))
                self._start()

        asyncio.get_running_loop().call_later(OUTAGE_RECHECK, restart)

    def discard(self, request_id: str) -> None:
        self.ids.discard(request_id)  # the next BLPOP leaves it out; no kick needed

    async def forged(self, request_id: str) -> None:
        """Drop a wake-up whose result was not there (else every BLPOP would take it again)."""
        await self.commands.delete(keys.notify_key(request_id))

    async def close(self) -> None:
        for task in [self._task, *self._kicks]:
            if task is not None:
                task.cancel()
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)
        if self.connection is not None:
            await bounded(self.connection.delete(self.kick))
            await close_async(self.connection)

    async def _drop_unusable(self, exc: redis.ResponseError) -> None:
        """Notify keys that are not lists (written by someone else: Redis is input) leave the BLPOP; their
        waits look at their result every POLL_UNUSABLE seconds instead."""
        watched = [self.kick, *(keys.notify_key(i) for i in self.ids)]
        pipe = self.connection.pipeline(transaction=False)
        for key in watched:
            pipe.type(key)
        kinds = await pipe.execute()
        bad = [key for key, kind in zip(watched, kinds) if kind not in (b"list", b"none")]
        log.warning("notify lists: BLPOP refused (%s); %d key(s) are not lists: %s", exc, len(bad), bad[:5])
        if not bad:  # not a key's fault: do not spin
            await asyncio.sleep(OUTAGE_RECHECK)
            return
        prefix = keys.notify_key("")
        for key in bad:
            if key == self.kick:
                await self.commands.delete(self.kick)
                continue
            request_id = key[len(prefix):]
            self.ids.discard(request_id)
            self.unusable.add(request_id)
            task = asyncio.get_running_loop().create_task(self._poll(request_id))
            self._kicks.add(task)
            task.add_done_callback(self._kicks.discard)

    async def _poll(self, request_id: str) -> None:
        while self.hub.waits_for(request_id):
            self.hub.look_at([request_id])
            await asyncio.sleep(OUTAGE_RECHECK)
        self.unusable.discard(request_id)

    async def _send_kick(self) -> None:
        try:
            await self.commands.pipeline(transaction=False).rpush(self.kick, 1).expire(
                self.kick, keys.KICK_TTL).execute()
        except (redis.ConnectionError, redis.TimeoutError):
            pass  # the BLPOP fails too, and its reconnect looks at every id

    async def _listen(self) -> None:
        prefix = keys.notify_key("")
        backoff, recheck, moving_pause = 0.5, False, slotmoves.FIRST_PAUSE
        while True:
            if not self.ids:
                self._changed.clear()
                await self._changed.wait()
            watched = [keys.notify_key(i) for i in self.ids]
            self._blocked, self._kicked = True, False
            try:
                popped = await self.connection.blpop([self.kick, *watched], timeout=MAX_BLOCK)
                if popped is not None and popped[0].decode() != self.kick:  # hand it on, for other waiters
                    await self.connection.pipeline(transaction=False).rpush(popped[0], 1).expire(
                        popped[0], RESULT_TTL).execute()
            except OUTAGES as exc:
                log.warning("notify lists: Redis cannot answer (%s); retrying in %.1f s", exc, backoff)
                await asyncio.sleep(backoff)
                backoff, recheck = min(backoff * 2, MAX_BLOCK), True
                continue
            except redis.RedisError as exc:
                if slotmoves.slot_moving(exc):  # a reshard of the lists' slot (a pop's hand-on may have failed)
                    recheck = True
                    log.info("notify lists: their slot is being moved (%s); popping again in %.2f s", exc,
                             moving_pause)
                    await asyncio.sleep(moving_pause)
                    moving_pause = min(moving_pause * 2, slotmoves.MAX_PAUSE)
                    continue
                if not isinstance(exc, redis.ResponseError):
                    raise
                await self._drop_unusable(exc)  # one key that is no list fails the BLPOP of all of them
                continue
            finally:
                self._blocked = False
            backoff, moving_pause = 0.5, slotmoves.FIRST_PAUSE
            if recheck:  # a wake-up may have come while we were away
                recheck = False
                self.hub.recheck()
            if popped is None or popped[0].decode() == self.kick:
                continue
            request_id = popped[0].decode()[len(prefix):]
            self.ids.discard(request_id)
            self.hub.woke([request_id])
            # Results often land together (a worker's round): one read of every id still named finds the
            # others before the next BLPOP names them, so that they are not popped one by one (each pop
            # would start another read of them all).
            self.hub.look_at(list(self.ids))
            await self.hub.read_through()
