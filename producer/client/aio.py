"""AsyncProducer: the asyncio face of Producer, for web apps and the gateway.

Per Redis (shard) it holds at most four connections, however many requests wait: two for short
commands (coalesced submits and result reads), one blocked on its reply stream (producer/client/replies.py:
wakes the requests it submitted, and those of other producers it waits on, on their streams) and, once it
waits on ids submitted without a reply stream, one blocked on their notify lists (producer/client/notify.py).
Every wait is a future in a WaitHub (producer/client/waiters.py) that reads the results of ids that woke
together in one round trip. Submits are native asyncio and coalesced (producer/client/asubmit.py).
Everything else is a read of producer/client/reads.py, shared with Producer, run on asyncio pipelines: no
thread, no call into the blocking client.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np
import redis.asyncio as aioredis

from embedfleet.common.capabilities import ModelCapabilities
from embedfleet.common.errors import ResultTimeoutError, UnavailableError
from embedfleet.common.fleetstate import resolve_redis_url
from embedfleet.common.params import PoolingParams
from embedfleet.common.protocol import keys, operations
from embedfleet.common.redisclient import close_async, cluster_tag, connect_async, is_cluster
from embedfleet.common.result import Result, SparseVector
from embedfleet.common.shards import ShardMap, resolve_shards
from embedfleet.producer.client import asubmit, fleetview, reads, traced
from embedfleet.producer.client.core import (Placements, Served, build_request, chosen_ids, looked_at, read_result,
                                             redis_errors, resolve_target, tagged_ids)
from embedfleet.producer.client.fleet import LevelStats, level_stats
from embedfleet.producer.client.notify import NotifyListener
from embedfleet.producer.client.placement import Placer, naming, place_async
from embedfleet.producer.client.replies import ReplyListener
from embedfleet.producer.client.exchanges import run_async
from embedfleet.producer.client.tasks import check_rerank, rank, score_pairs
from embedfleet.producer.client.waiters import WaitHub

COMMAND_CONNECTIONS = 2  # per Redis: submits and reads share them (a WATCH transaction holds one briefly)


@dataclass
class _Link:
    """One Redis (shard) of the fleet: short commands, the wait hub, and the two listeners that wake it."""

    url: str
    status: object  # the producer's status coroutine function
    max_queue_depth: int | None
    tag: str = ""  # on a Redis Cluster: the hash tag of the models it serves (keys.slot_tag); '' else
    shared: aioredis.Redis | None = None  # the command connections of the URL's first link, if not its own
    redis: aioredis.Redis = field(init=False)
    hub: WaitHub = field(init=False)
    replies: ReplyListener = field(init=False)
    notify: NotifyListener = field(init=False)
    submitter: asubmit.Submitter = field(init=False)

    def __post_init__(self):
        self.redis = self.shared or connect_async(self.url, max_connections=COMMAND_CONNECTIONS)
        self.hub = WaitHub(self.redis, self.status)
        self.replies = ReplyListener(connect_async(self.url, max_connections=1), self.hub, self.redis, self.tag)
        self.notify = NotifyListener(lambda: connect_async(self.url, max_connections=1), self.redis, self.hub,
                                     self.tag)
        self.hub.notify, self.hub.replies = self.notify, self.replies
        self.submitter = asubmit.Submitter(self.redis, self.max_queue_depth, self.tag)

    async def close(self) -> None:
        self.hub.close(UnavailableError("the producer was closed while waiting for a result"))
        await self.submitter.close()
        await self.notify.close()
        await self.replies.close()
        if self.shared is None:
            await close_async(self.redis)


class AsyncProducer:
    """Same methods as Producer, as coroutines (see Producer for the arguments), plus `as_completed` and
    `results` to consume results as they land."""

    def __init__(self, redis_url: str | None = None, *, shards: Mapping[str, str] | None = None,
                 max_queue_depth: int | None = None):
        self.redis_url = resolve_redis_url(redis_url)  # resolved once (flag, env, running `up`, default)
        self.shards = ShardMap(self.redis_url, resolve_shards(shards))
        self._max_queue_depth = max_queue_depth
        self._links = {url: _Link(url, self.status, max_queue_depth) for url in self.shards.urls()}
        # On a Redis Cluster every wake-up key of a request lies in its model's slot: a link (reply stream,
        # notify listener, submits) per URL and hash tag there, sharing the URL's command connections
        self._tagged: dict[tuple[str, str], _Link] = {}
        self._connections = {url: link.redis for url, link in self._links.items()}  # what reads run on
        self.redis = self._links[self.redis_url].redis  # the default Redis
        self.where = looked_at(self.shards.urls())  # named by a NoWorkerError: which Redis had no worker
        self._served = Served()
        self._placed = Placements()
        self._placer = Placer(self.shards)
        self._models_read: asyncio.Future | None = None  # the adverts read in flight, shared (models())

    async def close(self) -> None:
        """Fail pending waits and drop every connection. Bounded: each step that talks to Redis gets
        CLOSE_TIMEOUT, so a Redis that stopped answering cannot hang a shutdown."""
        for link in [*self._tagged.values(), *self._links.values()]:
            await link.close()

    async def connection_of(self, request_id: str) -> aioredis.Redis:
        """The asyncio client of the shard that holds `request_id` (the only one, unless sharded)."""
        return (await self._link_of(request_id)).redis

    def urls(self) -> list[str]:
        """The URL of each Redis (shard) this producer talks to, the default one first."""
        return list(self._links)

    def connection_at(self, url: str) -> aioredis.Redis:
        """The asyncio client (command connections) of the Redis at `url`, one of `urls()`."""
        return self._links[url].redis

    async def url_of(self, request_id: str) -> str:
        """The URL of the shard that holds `request_id` (the default Redis, unless sharded)."""
        return await self._read(reads.locate(self.shards, self._placed, request_id))

    async def _link_of(self, request_id: str) -> _Link:
        url = await self.url_of(request_id)
        return self._link_at(url, keys.tag_of(request_id))

    def _link_at(self, url: str, tag: str) -> _Link:
        """The link of `url` for keys of hash tag `tag` (its own on a Redis Cluster, else the URL's one)."""
        if not tag or not is_cluster(url):
            return self._links[url]
        if (url, tag) not in self._tagged:
            self._tagged[url, tag] = _Link(url, self.status, self._max_queue_depth, tag, self._links[url].redis)
        return self._tagged[url, tag]

    async def __aenter__(self) -> AsyncProducer:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    @property
    def max_queue_depth(self) -> int | None:
        return self._max_queue_depth

    async def _read(self, read: reads.Read):
        return await run_async(self._connections, read, self.shards)

    async def models(self, refresh: bool = True) -> dict[str, ModelCapabilities]:
        """Models served by at least one live worker, with their capabilities (see Producer.models).

        One read at a time: concurrent callers (thousands of submits when the cached read goes stale) share
        the read in flight instead of each sending their own."""
        if self._served.stale(refresh):
            if self._models_read is None or self._models_read.done():
                self._models_read = asyncio.ensure_future(self._read_models())
            await asyncio.shield(self._models_read)  # a caller that gives up does not cancel the others' read
        return self._served.models

    async def _read_models(self) -> None:
        self._served.update(await self._read(reads.models(self.shards)))

    def known_models(self) -> set[str]:
        """Every model ever advertised, as of the last models() read."""
        return set(self._served.known)

    async def live_workers(self, model: str) -> int:
        return await self._read(reads.live_workers(self.shards, model, time.time()))

    async def workers(self, model: str) -> list[dict]:
        return await self._read(reads.workers(self.shards, model, time.time()))

    async def fleet(self) -> dict:
        return await self._read(fleetview.snapshot(self.shards))

    async def queue_depth(self, model: str) -> int:
        return await self._read(reads.queue_depth(self.shards, model))

    async def level_stats(self, model: str) -> list[LevelStats]:
        return await self._read(level_stats(self.shards, model))

    async def submit(self, inputs, model: str | None = None, *, params: PoolingParams | None = None,
                     reply_to: str | None = None, text_pair: list[str] | None = None,
                     request_id: str | None = None, **fields) -> str:
        return (await self.submit_many([inputs], model, params=params, reply_to=reply_to, text_pair=text_pair,
                                       request_ids=None if request_id is None else [request_id], **fields))[0]

    @traced.submits
    async def submit_many(self, batches: list, model: str | None = None, *,
                          params: PoolingParams | None = None, reply_to: str | None = None,
                          text_pair: list[str] | None = None, priority: str | int | None = None,
                          deadline: float | None = None, timeout: float | None = None,
                          request_ids: list[str] | None = None, **fields) -> list[str]:
        """Enqueue one request per element of `batches`, those on one partition in one transaction (all of them,
        unless the model is partitioned: placement.py); returns their ids (the keywords as in
        Producer.submit_many)."""
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

        placed = await asyncio.gather(*(group(order, indices) for order, indices in self._placer.plan(name, chosen)))
        ids: list[str] = [""] * len(batches)
        for indices, group_ids in placed:
            for index, request_id in zip(indices, group_ids):
                ids[index] = request_id
        return ids

    @staticmethod
    async def _submit_on(link: _Link, name: str, requests: list, level: str, replies: bool, fresh: bool) -> list[str]:
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

    async def get(self, request_id: str) -> Result | None:
        url = await self.url_of(request_id)
        with naming(self.shards, url), redis_errors():
            raw = await self._links[url].redis.get(keys.result_key(request_id))
        return read_result(request_id, raw)

    @traced.waits
    async def wait(self, request_id: str, timeout: float = 60.0) -> Result:
        """Block until the result lands; raises TimeoutError or the request's own error.

        No round trip of its own: the wait joins the producer's coalesced reads. It rides out a Redis
        outage shorter than its timeout, and a wake-up counts only once the result it announces is there.
        """
        link = await self._link_of(request_id)
        with naming(self.shards, link.url):  # on a partition of a model: which one
            result = await self._wait_result(link, request_id, timeout)
        result.raise_for_error()
        return result

    async def _wait_result(self, link: _Link, request_id: str, timeout: float) -> Result:
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

    async def embed(self, inputs, model: str | None = None, *, timeout: float = 60.0, **fields) -> np.ndarray:
        """Submit and wait: the embeddings as a numpy array of shape (n, d)."""
        return (await self.wait(await self.submit(inputs, model, **fields), timeout)).embeddings

    # -- the other tasks: see Producer ----------------------------------------------------------------
    async def score(self, text_1, text_2, model: str | None = None, *, timeout: float = 60.0,
                    **fields) -> np.ndarray:
        firsts, seconds = score_pairs(text_1, text_2)
        request_id = await self.submit(firsts, model, text_pair=seconds, task="score", **fields)
        return (await self.wait(request_id, timeout)).scores

    async def rerank(self, query: str, documents: list[str], model: str | None = None, *,
                     top_n: int | None = None, return_documents: bool = False, timeout: float = 60.0,
                     **fields) -> list[dict]:
        documents = check_rerank(query, documents, top_n)
        scores = await self.score(query, documents, model, timeout=timeout, **fields)
        return rank(scores, documents, top_n, return_documents)

    async def classify(self, inputs, model: str | None = None, *, timeout: float = 60.0, **fields) -> Result:
        return await self.wait(await self.submit(inputs, model, task="classify", **fields), timeout)

    async def token_embed(self, inputs, model: str | None = None, *, timeout: float = 60.0,
                          **fields) -> list[np.ndarray]:
        return (await self.wait(await self.submit(inputs, model, task="token_embed", **fields),
                                timeout)).multi_vectors

    async def sparse_embed(self, inputs, model: str | None = None, *, timeout: float = 60.0,
                           **fields) -> list[SparseVector]:
        return (await self.wait(await self.submit(inputs, model, task="sparse_embed", **fields), timeout)).sparse

    async def encode(self, inputs, model: str | None = None, *, outputs=("dense", "sparse", "colbert"),
                     timeout: float = 60.0, **fields) -> Result:
        return await self.wait(await self.submit(inputs, model, outputs=list(outputs), **fields), timeout)

    async def tokenize(self, inputs, model: str | None = None, *, timeout: float = 60.0, **fields) -> list[dict]:
        return (await self.wait(await self.submit(inputs, model, task="tokenize", **fields), timeout)).items

    async def detokenize(self, token_ids, model: str | None = None, *, timeout: float = 60.0,
                         **fields) -> list[str]:
        return (await self.wait(await self.submit(token_ids, model, task="detokenize", **fields), timeout)).items

    async def status(self, request_id: str) -> str:
        """queued | started | finished | failed | cancelled | not_found (see Producer.status): one exchange on the
        command connections (10,000 waits timing out together stay within them)."""
        return await self._read(reads.status(self.shards, self._placed, request_id))

    async def cancel(self, request_id: str) -> bool:
        target = await self._read(reads.cancel(self.shards, self._placed, request_id))
        if target is None:  # answered already
            return False
        link = self._link_at(target.url, keys.tag_of(request_id))
        with redis_errors():
            cancelled = await operations.cancel_async(link.redis, target.queue, target.answer, target.reply_to)
        if cancelled:
            link.hub.woke([request_id])  # its result is there now; its reply may come later
        return cancelled


async def _pump(source: asyncio.Queue, sink: asyncio.Queue) -> None:
    while True:
        sink.put_nowait(await source.get())
