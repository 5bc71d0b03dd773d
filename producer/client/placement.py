"""Which partition of a model a producer puts a request on (common/shards.py: a model over several Redis).

Round robin over the model's partitions: it costs no round trip (placing by depth would read every partition's
queue length before each submit), and since every worker of the model takes from every partition, equal arrivals
keep the depths equal. A partition whose Redis just refused a submit (down, full, read-only) goes to the back of
the order for DOWN_SECONDS, so new requests go to the others at once; then it takes its turn again (a submit it
refuses moves on to the next partition, and marks it again), so it rejoins within DOWN_SECONDS of its return.

Requests with the caller's own ids (an idempotent submit) are placed by their first id's hash over all the
partitions and never moved: the duplicate check runs on that one Redis, so a retry with the same ids lands where
the first try did, and a partition that is down refuses them (503) rather than enqueueing a second copy elsewhere.
"""

from __future__ import annotations

import contextlib
import itertools
import time
import zlib
from collections.abc import Awaitable, Callable
from typing import TypeVar

from common.errors import UnavailableError
from common.redisclient import redact
from common.shards import ShardMap
from producer.client.core import redis_errors

T = TypeVar("T")

DOWN_SECONDS = 2.0  # how long a partition that refused a submit is tried last


class Placer:
    """The partitions to try for each submit, in order (a producer's own: no state is shared through Redis)."""

    def __init__(self, shards: ShardMap):
        self.shards = shards
        self._turns: dict[str, itertools.count] = {}
        self._down: dict[str, float] = {}  # URL -> monotonic time until which it is tried last

    def order(self, model: str, chosen: str | None = None) -> list[str]:
        """The URLs to try for a submit to `model`, best first; `chosen`: the caller's first request id."""
        urls = self.shards.partitions(model)
        if len(urls) == 1:
            return urls
        if chosen is not None:
            return [partition_of(urls, chosen)]
        start = next(self._turns.setdefault(model, itertools.count())) % len(urls)
        turn = urls[start:] + urls[:start]
        now = time.monotonic()
        return [u for u in turn if self._down.get(u, 0.0) <= now] + [u for u in turn if self._down.get(u, 0.0) > now]

    def refused(self, url: str) -> None:
        self._down[url] = time.monotonic() + DOWN_SECONDS

    def accepted(self, url: str) -> None:
        self._down.pop(url, None)


def partition_of(urls: list[str], chosen: str) -> str:
    """The partition (of `urls`, a model's partitions) a submit with the caller's own id `chosen` goes to: fixed
    by the id, so that a submit sent again with it meets the first one (and is refused as a duplicate)."""
    return urls[zlib.crc32(chosen.encode()) % len(urls)]


def place(placer: Placer, model: str, chosen: str | None, send: Callable[[str], T]) -> tuple[str, T]:
    """(URL, reply) of `send(URL)` on the first partition of `model` that takes it: one that refuses (an
    UnavailableError: down, full, read-only) is tried last for a while and the next one is asked; when all refuse,
    the last refusal, naming its partition."""
    refused = None
    for url in placer.order(model, chosen):
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


async def place_async(placer: Placer, model: str, chosen: str | None,
                      send: Callable[[str], Awaitable[T]]) -> tuple[str, T]:
    """`place` for a coroutine `send`."""
    refused = None
    for url in placer.order(model, chosen):
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
    """`cause` (an UnavailableError of core.redis_errors, a 503) naming the partition at `url`: which one of which
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
    """Within it, an UnavailableError (from core.redis_errors) names the partition at `url` (`unavailable`)."""
    try:
        yield
    except UnavailableError as exc:
        raise unavailable(shards, url, exc) from exc
