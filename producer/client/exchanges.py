"""How each client moves the bytes of a read (producer/client/reads.py): every exchange (one round trip) as one
pipeline per Redis, its replies sent back into the read until it returns. A Redis that cannot be reached answers
its error in place of each reply (a read of a partitioned model goes on with the others); Redis errors that the
read raises become the clients' own (redisfaults.redis_errors)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping

import redis
import redis.asyncio as aioredis

from embedfleet.common.errors import UnavailableError
from embedfleet.common.shards import ShardMap
from embedfleet.producer.client.redisfaults import redis_errors
from embedfleet.producer.client.placement import unavailable
from embedfleet.producer.client.reads import Read, T


class Unreachable(redis.ConnectionError):
    """The reply of a Redis that an exchange could not reach: its URL, so that the error can say which it was."""

    def __init__(self, url: str, cause: Exception):
        super().__init__(str(cause))
        self.url = url
        self.__cause__ = cause  # what Redis said (LOADING is a ConnectionError too): redisfaults.py reads it


@contextlib.contextmanager
def _named(shards: ShardMap | None):
    """An UnavailableError from a Redis that is a partition of a model says which (producer/client/placement.py)."""
    try:
        yield
    except UnavailableError as exc:
        if shards is None or not isinstance(exc.__cause__, Unreachable):
            raise
        raise unavailable(shards, exc.__cause__.url, exc) from exc.__cause__


def run(connection_at: Mapping[str, redis.Redis], read: Read[T], shards: ShardMap | None = None) -> T:
    """Run `read` on blocking clients, one Redis after the other within an exchange (`shards`: to name a partition
    that could not be reached)."""
    with _named(shards), redis_errors():
        try:
            asked = next(read)
            while True:
                replies = {}
                for url, commands in asked.items():
                    try:
                        with connection_at[url].pipeline(transaction=False) as pipe:
                            for command in commands:
                                pipe.execute_command(*command)
                            replies[url] = pipe.execute(raise_on_error=False)
                    except (redis.ConnectionError, redis.TimeoutError) as exc:  # that Redis only: the read decides
                        replies[url] = [Unreachable(url, exc)] * len(commands)
                asked = read.send(replies)
        except StopIteration as done:
            return done.value


async def run_async(connection_at: Mapping[str, aioredis.Redis], read: Read[T], shards: ShardMap | None = None) -> T:
    """Run `read` on asyncio clients, every Redis of an exchange at once (`shards`: as `run`'s)."""
    with _named(shards), redis_errors():
        try:
            asked = next(read)
            while True:
                urls = list(asked)
                replies = await asyncio.gather(*(_pipeline(url, connection_at[url], asked[url]) for url in urls))
                asked = read.send(dict(zip(urls, replies)))
        except StopIteration as done:
            return done.value


async def _pipeline(url: str, connection: aioredis.Redis, commands: list[tuple]) -> list:
    pipe = connection.pipeline(transaction=False)
    for command in commands:
        pipe.execute_command(*command)
    try:
        return await pipe.execute(raise_on_error=False)
    except (redis.ConnectionError, redis.TimeoutError) as exc:  # that Redis only: the read decides (reads.ok)
        return [Unreachable(url, exc)] * len(commands)
