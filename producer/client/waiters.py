"""Every pending wait of an AsyncProducer on one Redis, answered by coalesced reads.

A wait registers a future here and asks for one look at its result key. Looks and wake-ups (reply-stream
entries, notify-list pops, a listener's reconnect) only mark ids as due; one reader task then fetches
every due id with MGETs and resolves their futures with the decoded result as each MGET returns. Ten
thousand waits cost one read per batch of ids that woke together, never a connection each.

One MGET asks for about READ_BYTES of results (producer/client/readsize.py). What a read that finds no result
does next (look the job up, follow another's id on its path, check a wake-up without its result) is
producer/client/lookups.py's.

A request wakes one way (common/protocol/keys.py): ids this producer submitted through its reply stream;
another's request through its own `reply_to` stream (read from its job at the first look: the reply
listener then reads that stream too) or, without one, its notify list (the notify listener).

A wake-up counts only once its result is there (anyone who can write to Redis can forge one); a result
that is missing after a wake-up means a forged wake-up (the job is still pending) or an expired result.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Awaitable, Callable

import redis
import redis.asyncio as aioredis

from embedfleet.common.errors import DecodeError, EmbedfleetError, UnavailableError
from embedfleet.common.policy import JOB_TTL
from embedfleet.common.protocol import keys, slotmoves
from embedfleet.common.result import Result
from embedfleet.producer.client.core import read_result
from embedfleet.producer.client.lookups import OUTAGE_RECHECK, Lookups
from embedfleet.producer.client.readsize import read_size, result_bytes
from embedfleet.producer.client.redisfaults import outage, unavailable

log = logging.getLogger(__name__)


class Look(enum.IntEnum):
    """Why an id is due for a read; a stronger reason wins when two arrive before the read."""

    RECHECK = 0  # a result may have landed without its wake-up reaching us yet
    RECONNECT = 1  # a listener reconnected: a wake-up may have been lost, and Redis may have lost the job
    FIRST = 2  # a wait began: the result may be in already; if not, an id without a job fails at once
    WOKE = 3  # a wake-up announced the result


class WaitHub(Lookups):
    """Futures per request id, resolved by one reader task.

    Ids this producer submitted (`expect`) wake through its reply stream. Other ids, once a first look found
    no result, are handed to `replies` (the ReplyListener, which reads their request's stream too) or to
    `notify` (a NotifyListener), as their job says.
    """

    def __init__(self, connection: aioredis.Redis, status: Callable[[str], Awaitable[str]]):
        self.connection = connection
        self.status = status  # the producer's status(id), for a wake-up without its result
        self.notify = None  # set by the producer: the NotifyListener of this Redis
        self.replies = None  # ... and its ReplyListener
        self._own: dict[str, float] = {}  # ids submitted with our reply stream, no result seen yet
        self._paths: dict[str, str | None] = {}  # another's id -> its reply stream, or None: its notify list
        self._waiters: dict[str, list[asyncio.Future]] = {}
        self._due: dict[str, Look] = {}
        self._subscribers: set[asyncio.Queue] = set()
        self._wakeup = asyncio.Event()
        self._read_waiters: list[asyncio.Future] = []  # read_through() callers, answered after the next read
        self._task: asyncio.Task | None = None
        self._checks: set[asyncio.Task] = set()  # running _check_pending tasks (held: the loop keeps weak refs)
        self._closed: BaseException | None = None
        self._result_bytes: float | None = None  # a result's size here, smoothed (None: none read yet)

    # -- what the producer and the listeners call ----------------------------------------------------
    def expect(self, request_ids: list[str]) -> None:
        """Ids about to be enqueued with our reply stream (before the enqueue: a reply may beat its return)."""
        stamp = time.monotonic()
        for request_id in request_ids:
            self._own[request_id] = stamp
        self._prune()

    def unexpect(self, request_ids: list[str]) -> None:
        for request_id in request_ids:
            self._own.pop(request_id, None)

    def watch(self, request_id: str) -> asyncio.Future:
        """A future that resolves to the result of `request_id` (or raises its read's error)."""
        if self._closed is not None:
            raise self._closed
        future = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(request_id, []).append(future)
        self._mark([request_id], Look.FIRST)
        return future

    def unwatch(self, request_id: str, future: asyncio.Future) -> None:
        futures = self._waiters.get(request_id)
        if futures is None:
            return
        if future in futures:
            futures.remove(future)
        if not futures:
            del self._waiters[request_id]
            self._forget(request_id)

    def subscribe(self) -> asyncio.Queue:
        """A queue that gets every result of an id this producer submitted, once, as it lands."""
        if self._closed is not None:
            raise self._closed
        queue: asyncio.Queue = asyncio.Queue()
        self._subscribers.add(queue)
        self._mark(list(self._own), Look.RECHECK)  # results that landed unseen (e.g. before a reconnect)
        return queue

    def unsubscribe(self, queue: asyncio.Queue) -> None:
        self._subscribers.discard(queue)

    def woke(self, request_ids: list[str]) -> None:
        """Wake-ups for these ids (each is checked against its result key). An id of ours that nobody
        waits for is forgotten: its result is in, and a later wait's first look finds it."""
        due = []
        for request_id in request_ids:
            if request_id in self._waiters or (self._subscribers and request_id in self._own):
                due.append(request_id)
            else:
                self._own.pop(request_id, None)
        self._mark(due, Look.WOKE)

    def look_at(self, request_ids: list[str]) -> None:
        """Read these ids with the next batch (results that may have landed without a wake-up yet)."""
        self._mark([i for i in request_ids if i in self._waiters], Look.RECHECK)

    async def read_through(self) -> None:
        """Return once the reader has read everything marked so far."""
        if self._closed is not None:
            return
        future = asyncio.get_running_loop().create_future()
        self._read_waiters.append(future)
        self._mark([], Look.RECHECK)  # start the reader if it is idle
        self._wakeup.set()
        await future

    def recheck(self) -> None:
        """A listener reconnected: any wake-up may have been lost, so look at every id still waited for
        (and, while someone iterates `results()`, at every id of ours without a result yet)."""
        self._mark([*self._waiters, *(self._own if self._subscribers else ())], Look.RECONNECT)

    def waits_for(self, request_id: str) -> bool:
        return request_id in self._waiters

    def is_own(self, request_id: str) -> bool:
        return request_id in self._own

    def close(self, exc: BaseException) -> None:
        """Fail every pending wait and subscription with `exc`; stop reading."""
        self._closed = exc
        for futures in self._waiters.values():
            for future in futures:
                if not future.done():
                    future.set_exception(exc)
        self._waiters.clear()
        for queue in self._subscribers:
            queue.put_nowait(exc)
        for task in [self._task, *self._checks]:
            if task is not None:
                task.cancel()
        for future in self._read_waiters:
            future.cancel()

    # -- the reader --------------------------------------------------------------------------------
    def _mark(self, request_ids, why: Look) -> None:
        if (not request_ids and not self._read_waiters) or self._closed is not None:
            return
        for request_id in request_ids:
            if self._due.get(request_id, -1) < why:
                self._due[request_id] = why
        self._wakeup.set()
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._read_loop(), name="embedfleet wait reader")
            self._task.add_done_callback(self._reader_ended)

    def _look_again(self, request_ids: list[str]) -> None:
        self._mark(request_ids, Look.RECHECK)

    def _reader_ended(self, task: asyncio.Task) -> None:
        if not task.cancelled() and task.exception() is not None:  # never silent: fail the waits it served
            log.error("wait reader died", exc_info=task.exception())
            self.close(task.exception())

    async def _read_loop(self) -> None:
        # Until closed, not merely until cancelled: close() cancels this task while a read may be in flight,
        # and redis-py can take that cancel in a command that the closing connection then fails, which would
        # bring the loop back to wait on _wakeup for ever (and hang the event loop's shutdown).
        moving_pause = slotmoves.FIRST_PAUSE
        while self._closed is None:
            await self._wakeup.wait()
            self._wakeup.clear()
            due, self._due = self._due, {}
            read, self._read_waiters = self._read_waiters, []
            due = {i: why for i, why in due.items() if i in self._waiters or (self._subscribers and i in self._own)}
            try:
                if due:
                    await self._read(due)
            except (redis.RedisError, redis.exceptions.RedisClusterException) as exc:
                if outage(exc):  # unreachable, or serving nothing for now (LOADING, BUSY, CLUSTERDOWN)
                    log.warning("reading %d results: Redis cannot answer (%s); looking again in %.1f s", len(due),
                                exc, OUTAGE_RECHECK)
                    pause = OUTAGE_RECHECK
                elif not slotmoves.slot_moving(exc):
                    self._refused(due, read, exc)
                    continue
                else:  # a Redis Cluster resharding their slot (redis-py followed TRYAGAIN / ASK for a while):
                    # nothing is wrong, the read is only sent again, with slotmoves.py's backoff, until the move ends
                    log.info("reading %d results: their slot is being moved (%s); looking again in %.2f s",
                             len(due), exc, moving_pause)
                    pause, moving_pause = moving_pause, min(moving_pause * 2, slotmoves.MAX_PAUSE)
            else:
                moving_pause = slotmoves.FIRST_PAUSE
                for future in read:
                    if not future.done():
                        future.set_result(None)
                continue
            for request_id, why in due.items():
                if self._due.get(request_id, -1) < why:
                    self._due[request_id] = why
            if self._closed is not None:
                return
            self._read_waiters += read  # they wait for a read that happened
            await asyncio.sleep(pause)
            self._wakeup.set()

    def _refused(self, due: dict[str, Look], read: list[asyncio.Future], exc: redis.RedisError) -> None:
        """Redis refused a read (an ACL without one of its commands, say): the waits it was for fail with that
        error, said as ours; the reader goes on for the others (a reader that died would fail every wait)."""
        log.error("reading %d results: Redis refused (%s); their waits fail", len(due), exc)
        said = unavailable(exc)  # what it means, where it is a Redis fault (an ACL: docs/security.md's line)
        error = UnavailableError(f"Redis refused reading the result: {said.message if said else exc}")
        for request_id in due:
            self._fail(request_id, error)
        for future in read:
            if not future.done():
                future.set_result(None)

    async def _read(self, due: dict[str, Look]) -> None:
        ids, missing, start = list(due), [], 0
        while start < len(ids):
            chunk = ids[start:start + read_size(self._result_bytes, first=start == 0)]
            start += len(chunk)
            pipe = self.connection.pipeline(transaction=False)
            # (as a raw command: a cluster's pipeline refuses mget(); a link's ids share one slot there)
            pipe.execute_command("MGET", *[keys.result_key(i) for i in chunk])
            blobs = (await pipe.execute())[0]
            self._result_bytes = result_bytes(self._result_bytes, blobs)
            for request_id, blob in zip(chunk, blobs):
                if blob is None:
                    missing.append(request_id)
                else:
                    self._land(request_id, blob)
        # Own ids too: their wake-up comes through the reply stream, but a job that vanished (its hash
        # deleted or expired, or lost with a Redis restarted empty: no result) never sends one, and the wait
        # would last its whole timeout. A first look and a look after a reconnect make sure the job is there.
        suspects = [i for i in missing if due[i] in (Look.FIRST, Look.RECONNECT)]
        if suspects:
            await self._look_up(suspects)
        follow = []
        for request_id in missing:
            if request_id not in self._waiters:
                continue
            if due[request_id] is Look.WOKE:  # a wake-up without its result: forged, or expired
                task = asyncio.get_running_loop().create_task(self._check_pending(request_id))
                self._checks.add(task)
                task.add_done_callback(self._checks.discard)
            elif not self.is_own(request_id):
                follow.append(request_id)
        if follow:
            await self._follow(follow)

    def _land(self, request_id: str, blob: bytes) -> None:
        try:
            result: Result | EmbedfleetError = read_result(request_id, blob)
        except DecodeError as err:
            result = err
        for future in self._waiters.pop(request_id, []):
            if not future.done():
                if isinstance(result, Result):
                    future.set_result(result)
                else:
                    future.set_exception(result)
        self._forget(request_id)
        if self._own.pop(request_id, None) is not None and isinstance(result, Result):
            for queue in self._subscribers:
                queue.put_nowait(result)

    def _fail(self, request_id: str, error: EmbedfleetError) -> None:
        for future in self._waiters.pop(request_id, []):
            if not future.done():
                future.set_exception(error)
        self._forget(request_id)

    def _forget(self, request_id: str) -> None:
        """Nobody waits for `request_id` any more: the listeners leave it."""
        self._paths.pop(request_id, None)
        if self.notify is not None:
            self.notify.discard(request_id)
        if self.replies is not None:
            self.replies.discard(request_id)

    def _prune(self) -> None:
        """Ids whose job expired unserved never get a result: forget them after the job's TTL."""
        horizon = time.monotonic() - JOB_TTL
        if self._own and next(iter(self._own.values())) < horizon:
            self._own = {i: t for i, t in self._own.items() if t >= horizon}
