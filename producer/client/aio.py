"""AsyncProducer: the asyncio client of the fleet, for web apps and the gateway. Its methods and their docstrings are
producer/client/surface.py's, shared with Producer, as coroutines; this module holds what it alone does: coalesced
submits, waits on a hub, `as_completed` and `results`, and the hooks that run the shared steps on asyncio.

Per Redis (shard, producer/client/alink.py) it holds at most four connections, however many requests wait: two for
short commands (coalesced submits and result reads), one blocked on its reply stream (producer/client/replies.py:
wakes the requests it submitted, and those of other producers it waits on, on their streams) and, once it
waits on ids submitted without a reply stream, one blocked on their notify lists (producer/client/notify.py).
Every wait is a future in a WaitHub (producer/client/waiters.py) that reads the results of ids that woke
together in one round trip. Submits are native asyncio and coalesced (producer/client/asubmit.py).
Every read is one of producer/client/reads.py, run on asyncio pipelines: no thread, no call into the blocking client.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import time
from collections.abc import AsyncIterator, Iterable, Mapping

import redis

from embedfleet.common.errors import ResultTimeoutError, UnavailableError
from embedfleet.common.fleetstate import resolve_redis_url
from embedfleet.common.names import tag_of
from embedfleet.common.params import PoolingParams
from embedfleet.common.protocol import answering, keys, rqkeys, slotmoves
from embedfleet.common.redisclient import check_access_async, cluster_tag, is_cluster
from embedfleet.common.result import Result
from embedfleet.common.shards import ShardMap, resolve_shards
from embedfleet.producer.client import reads, traced
from embedfleet.producer.client.alink import Link
from embedfleet.producer.client.core import (Served, build_request, by_url, chosen_ids, looked_at, read_result,
                                             resolve_target, tagged_ids)
from embedfleet.producer.client.redisfaults import redis_errors
from embedfleet.producer.client.remembered import Placements
from embedfleet.producer.client.exchanges import run_async
from embedfleet.producer.client.placement import Placer, naming, place_async, unavailable
from embedfleet.producer.client.surface import Surface


class AsyncProducer(Surface, awaits=True):
    """A client of the fleet: Producer's methods, as coroutines (see Producer for the arguments; no `connection`),
    plus `as_completed` and `results` to consume results as they land."""

    def __init__(self, redis_url: str | None = None, *, shards: Mapping[str, str] | None = None,
                 max_queue_depth: int | None = None):
        self.redis_url = resolve_redis_url(redis_url)
        self.shards = ShardMap(self.redis_url, resolve_shards(shards))
        self._max_queue_depth = max_queue_depth
        self._links = {url: Link(url, self.status, max_queue_depth) for url in self.shards.urls()}
        # On a Redis Cluster every wake-up key of a request lies in its model's slot: a link (reply stream,
        # notify listener, submits) per URL and hash tag there, sharing the URL's command connections
        self._tagged: dict[tuple[str, str], Link] = {}
        self.links = {url: link.redis for url, link in self._links.items()}  # what reads run on
        self.redis = self._links[self.redis_url].redis  # the default Redis
        self.where = looked_at(self.shards.urls())
        self._served = Served()
        self._placed = Placements()
        self._placer = Placer(self.shards)
        self._models_read: asyncio.Future | None = None  # the adverts read in flight, shared (models())

    async def close(self) -> None:
        for link in [*self._tagged.values(), *self._links.values()]:
            await link.close()

    async def check(self) -> list[UnavailableError]:
        down = []
        for url, connection in self.links.items():
            try:
                await check_access_async(connection, url)
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                if not self.shards.spare(url):
                    raise
                down.append(unavailable(self.shards, url, exc))
        return down

    async def __aenter__(self) -> AsyncProducer:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    @property
    def max_queue_depth(self) -> int | None:
        return self._max_queue_depth

    async def _link_of(self, request_id: str) -> Link:
        url = await self.url_of(request_id)
        return self._link_at(url, tag_of(request_id))

    def _link_at(self, url: str, tag: str) -> Link:
        """The link of `url` for keys of hash tag `tag` (its own on a Redis Cluster, else the URL's one)."""
        if not tag or not is_cluster(url):
            return self._links[url]
        if (url, tag) not in self._tagged:
            self._tagged[url, tag] = Link(url, self.status, self._max_queue_depth, tag, self._links[url].redis)
        return self._tagged[url, tag]

    # -- the hooks of the shared methods (surface.py), on asyncio --------------------------------------
    async def _read(self, read: reads.Read):
        return await run_async(self.links, read, self.shards)

    @staticmethod
    async def _then(step, fn):
        value = fn(await step)
        return (await value) if inspect.isawaitable(value) else value

    async def _ask(self, timeout: float, inputs, model: str | None = None, **submit) -> Result:
        return await self.wait(await self.submit(inputs, model, **submit), timeout)

    def _read_adverts(self) -> asyncio.Future:
        """One read at a time: concurrent callers (thousands of submits when the cached read goes stale) share
        the read in flight instead of each sending their own."""
        if self._models_read is None or self._models_read.done():
            self._models_read = asyncio.ensure_future(self._read_models())
        return asyncio.shield(self._models_read)  # a caller that gives up does not cancel the others' read

    async def _read_models(self) -> None:
        self._served.update(await self._read(reads.models(self.shards)))

    async def _result_at(self, url: str, request_id: str) -> Result | None:
        with naming(self.shards, url), redis_errors():
            raw = await self.links[url].get(keys.result_key(request_id))
        return read_result(request_id, raw)

    async def _results_at(self, urls: list[str], request_ids: list[str]) -> list[Result | None]:
        found: list[Result | None] = [None] * len(request_ids)
        for url, positions in by_url(urls).items():
            link, wanted = self.links[url], [keys.result_key(request_ids[i]) for i in positions]
            with naming(self.shards, url), redis_errors():  # (several keys: refused while their slot moves)
                raw = await slotmoves.while_moving_async(functools.partial(link.mget, wanted)) \
                    if slotmoves.is_cluster(link) else await link.mget(wanted)
            for i, blob in zip(positions, raw):
                found[i] = read_result(request_ids[i], blob)
        return found

    async def _cancel_at(self, target: reads.Cancel, request_id: str) -> bool:
        link = self._link_at(target.url, tag_of(request_id))
        with redis_errors():
            cancelled = await answering.cancel_async(link.redis, target.queue, target.answer, target.reply_to)
        if cancelled:
            link.hub.woke([request_id])  # its result is there now; its reply may come later
        return cancelled

    async def _exists(self, request_id: str) -> bool:
        connection = await self.connection_of(request_id)  # (two keys: refused while their slot is being moved)
        with redis_errors():
            return bool(await slotmoves.while_moving_async(
                lambda: connection.exists(keys.result_key(request_id), rqkeys.rq_job_key(request_id))))

    # -- submit --------------------------------------------------------------------------------------
    @traced.submits
    async def submit_many(self, batches: list, model: str | None = None, *,
                          params: PoolingParams | None = None, reply_to: str | None = None,
                          text_pair: list[str] | None = None, priority: str | int | None = None,
                          deadline: float | None = None, timeout: float | None = None,
                          request_ids: list[str] | None = None, **fields) -> list[str]:
        # (its docstring: surface.py's) those on one partition in one send, coalesced with concurrent submits
        chosen = chosen_ids(request_ids, len(batches))
        served = await self.models(refresh=False)
        if model not in served:  # a worker may have come up since the cached read
            served = await self.models()
        caps, level, when = resolve_target(model, served, self._served.known, priority, deadline, timeout,
                                           self.where)
        name = caps if isinstance(caps, str) else caps.name

        async def send(url: str, indices: list[int]) -> list[str]:  # on one partition (placement.py)
            tag = cluster_tag(url, name)  # a Redis Cluster: the model's (or its partition's) slot (keys.py)
            link = self._link_at(url, tag)
            ids = tagged_ids([chosen[i] for i in indices], tag)
            requests = [build_request(batches[i], caps, params, fields, reply_to or link.replies.stream, text_pair,
                                      when, request_id) for i, request_id in zip(indices, ids)]
            return await self._submit_on(link, name, requests, level, reply_to is None, request_ids is None)

        async def group(order: list[str], indices: list[int]) -> tuple[list[int], list[str]]:
            url, ids = await place_async(self._placer, order, lambda url: send(url, indices))
            if self.shards:
                self._placed.remember(ids, url)
            return indices, ids

        plan = self._placer.plan(name, chosen)
        if len(plan) == 1:  # one partition (the usual case): awaited as it is, no task to schedule
            placed = [await group(*plan[0])]
        else:
            placed = await asyncio.gather(*(group(order, indices) for order, indices in plan))
        ids: list[str] = [""] * len(batches)
        for indices, group_ids in placed:
            for index, request_id in zip(indices, group_ids):
                ids[index] = request_id
        return ids

    @staticmethod
    async def _submit_on(link: Link, name: str, requests: list, level: str, replies: bool, fresh: bool) -> list[str]:
        """Enqueue `requests` on one Redis, coalesced with concurrent submits; their ids."""
        ids = [r.id for r in requests]
        if replies:  # before the enqueue: a fast worker's reply may come before it returns
            link.hub.expect(ids)
            link.replies.start()
        try:
            with redis_errors():  # refused alone if the queue is full
                await link.submitter.submit(name, requests, level, fresh=fresh)
        except BaseException:
            link.hub.unexpect(ids)
            raise
        return ids

    # -- waits --------------------------------------------------------------------------------------
    @traced.waits
    async def wait(self, request_id: str, timeout: float = 60.0) -> Result:
        # (its docstring: surface.py's) no round trip of its own: the wait joins the hub's coalesced reads
        link = await self._link_of(request_id)
        with naming(self.shards, link.url):  # on a partition of a model: which one
            result = await self._wait_result(link, request_id, timeout)
        result.raise_for_error()
        return result

    async def _wait_result(self, link: Link, request_id: str, timeout: float) -> Result:
        """The result, ok or error (not raised); NotFoundError for an unknown id, ResultTimeoutError."""
        future = link.hub.watch(request_id)
        try:
            return await asyncio.wait_for(future, max(timeout, 0))
        except asyncio.TimeoutError:
            raise await self._timeout(request_id, timeout) from None
        finally:
            link.hub.unwatch(request_id, future)

    async def as_completed(self, request_ids: Iterable[str], timeout: float | None = None
                           ) -> AsyncIterator[Result]:
        """Yield each request's result as it lands, in landing order; a failed request's result is yielded
        too (check `.ok` or call `.raise_for_error()`), so that one failure does not end the iteration.

        Raises NotFoundError for an id never submitted, and ResultTimeoutError once `timeout` seconds (for
        the whole set) have passed with results still missing.
        """
        ids = list(dict.fromkeys(request_ids))
        deadline = None if timeout is None else time.monotonic() + timeout
        watched = {}
        try:
            for request_id in ids:
                link = await self._link_of(request_id)
                watched[link.hub.watch(request_id)] = (link, request_id)
            pending = set(watched)
            while pending:
                left = None if deadline is None else max(deadline - time.monotonic(), 0)
                done, pending = await asyncio.wait(pending, timeout=left, return_when=asyncio.FIRST_COMPLETED)
                if not done:
                    raise ResultTimeoutError(f"{len(pending)} of {len(ids)} results did not land within "
                                             f"{timeout:g} s")
                for future in done:
                    yield future.result()
        finally:
            for future, (link, request_id) in watched.items():
                link.hub.unwatch(request_id, future)

    async def results(self) -> AsyncIterator[Result]:
        """Yield every result of a request this producer submitted (with its own reply stream), once, as it
        lands, from now until the producer is closed (then UnavailableError) or the loop is left. Results
        that landed before the iteration began are not yielded, except those a reconnect found unseen."""
        link = self._links[self.redis_url] if len(self._links) == 1 else None
        links = [link] if link is not None else list(self._links.values())
        links += list(self._tagged.values())  # (links made after this call are not followed)
        queues = [(lk, lk.hub.subscribe()) for lk in links]
        merged: asyncio.Queue = asyncio.Queue()
        pumps = [asyncio.ensure_future(_pump(queue, merged)) for _, queue in queues]
        try:
            while True:
                item = await merged.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            for pump in pumps:
                pump.cancel()
            for lk, queue in queues:
                lk.hub.unsubscribe(queue)

    async def _timeout(self, request_id: str, timeout: float) -> ResultTimeoutError:
        return ResultTimeoutError(f"no result for request {request_id} after {timeout:g} s "
                                  f"(status: {await self.status(request_id)})")


async def _pump(source: asyncio.Queue, sink: asyncio.Queue) -> None:
    while True:
        sink.put_nowait(await source.get())
