"""Which partition of a model a producer puts each request on (common/shards.py: a model over several Redis).

Round robin over the model's partitions, request by request: a submit of many spreads over them, one enqueue
per partition it uses (placing by depth would read every partition's queue length before each submit); since
every worker of the model takes from every partition, equal arrivals keep the depths equal. A partition whose
Redis just refused a submit (down, full, read-only) goes to the back of the order for DOWN_SECONDS, so new
requests go to the others at once; then it takes its turn again (a submit it refuses moves on to the next
partition, and marks it again), so it rejoins within DOWN_SECONDS of its return.

A request with the caller's own id (an idempotent submit) goes to that id's home and is never moved: the
partition its id's hash picks among the model's partitions taken as a set (sorted, whatever order a producer's
map lists them in), so that one id has one home whoever submits it. The duplicate check runs on that Redis: a
retry with the same id, from any producer or gateway replica, meets the first try there, and a home that is
down refuses it (503) rather than a second copy being enqueued elsewhere.
"""

from __future__ import annotations

import contextlib
import itertools
import time
import zlib
from collections.abc import Awaitable, Callable
from typing import TypeVar

from embedfleet.common.errors import UnavailableError
from embedfleet.common.redisclient import redact
from embedfleet.common.shards import ShardMap
from embedfleet.producer.client.redisfaults import redis_errors

T = TypeVar("T")

DOWN_SECONDS = 2.0  # how long a partition that refused a submit is tried last


class Placer:
    """The partitions to try for each submit, in order (a producer's own: no state is shared through Redis)."""

    def __init__(self, shards: ShardMap):
        self.shards = shards
        self._turns: dict[str, itertools.count] = {}
        self._down: dict[str, float] = {}  # URL -> monotonic time until which it is tried last

    def order(self, model: str) -> list[str]:
        """The partitions of `model` to try for a new request, best first: the next in turn, those that refused
        lately last."""
        urls = self.shards.partitions(model)
        if len(urls) == 1:
            return urls
        start = next(self._turns.setdefault(model, itertools.count())) % len(urls)
        turn = urls[start:] + urls[:start]
        now = time.monotonic()
        return [u for u in turn if self._down.get(u, 0.0) <= now] + [u for u in turn if self._down.get(u, 0.0) > now]

    def plan(self, model: str, chosen: list[str | None]) -> list[tuple[list[str], list[int]]]:
        """One submit's requests by where they go: [(the partitions to try, best first; their indices)]. New ids
        take the partitions in turn, a request each; the caller's own ids go each to its home, alone."""
        urls = self.shards.partitions(model)
        if len(urls) == 1:
            return [(urls, list(range(len(chosen))))]
        groups: dict[str, list[int]] = {}
        if chosen and chosen[0] is not None:  # all chosen or none (core.chosen_ids)
            for index, request_id in enumerate(chosen):
                groups.setdefault(partition_of(urls, request_id), []).append(index)
            return [([url], indices) for url, indices in groups.items()]
        order = self.order(model)
        now = time.monotonic()
        up = [u for u in order if self._down.get(u, 0.0) <= now] or order
        for index in range(len(chosen)):
            groups.setdefault(up[index % len(up)], []).append(index)
        return [([url, *(u for u in order if u != url)], indices) for url, indices in groups.items()]

    def refused(self, url: str) -> None:
        self._down[url] = time.monotonic() + DOWN_SECONDS

    def accepted(self, url: str) -> None:
        self._down.pop(url, None)


def partition_of(urls: list[str], chosen: str) -> str:
    """The home of the caller's own id `chosen` among `urls` (a model's partitions, in any order): fixed by the id
    and the set of partitions, so that a submit sent again with it, by any producer, meets the first one (and is
    refused as a duplicate)."""
    ordered = sorted(urls)
    return ordered[zlib.crc32(chosen.encode()) % len(ordered)]


def place(placer: Placer, order: list[str], send: Callable[[str], T]) -> tuple[str, T]:
    """(URL, reply) of `send(URL)` on the first partition of `order` that takes it: one that refuses (an
    UnavailableError: down, full, read-only) is tried last for a while and the next one is asked; when all refuse,
    the last refusal, naming its partition."""
    refused = None
    for url in order:
        try:
            with redis_errors():
                reply = send(url)
        except UnavailableError as exc:
            placer.refused(url)
            refused = unavailable(placer.shards, url, exc)
            continue
        placer.accepted(url)
        return url, reply
    raise refused


async def place_async(placer: Placer, order: list[str], send: Callable[[str], Awaitable[T]]) -> tuple[str, T]:
    """`place` for a coroutine `send`."""
    refused = None
    for url in order:
        try:
            with redis_errors():
                reply = await send(url)
        except UnavailableError as exc:
            placer.refused(url)
            refused = unavailable(placer.shards, url, exc)
            continue
        placer.accepted(url)
        return url, reply
    raise refused


def unavailable(shards: ShardMap, url: str, cause: Exception) -> UnavailableError:
    """`cause` (an UnavailableError of redis_errors, a 503) naming the partition at `url`: which one of which
    model; as it was for a Redis that is no partition."""
    named = [f"partition {urls.index(url) + 1} of {len(urls)} of model '{model}'"
             for model, urls in shards.shards.items() if url in urls and len(urls) > 1]
    if not named or getattr(cause, "partition", None) == url:  # no partition, or named already
        return cause if isinstance(cause, UnavailableError) else UnavailableError(str(cause))
    error = UnavailableError(f"{', '.join(named)} (Redis {redact(url)}) is unavailable: {cause}")
    error.partition = url
    return error


@contextlib.contextmanager
def naming(shards: ShardMap, url: str):
    """Within it, an UnavailableError (from redisfaults.redis_errors) names the partition at `url` (`unavailable`)."""
    try:
        yield
    except UnavailableError as exc:
        raise unavailable(shards, url, exc) from exc
