"""How each client moves the bytes of a read (producer/client/reads.py): every round as one pipeline per Redis,
its replies sent back into the read until it returns. A Redis that cannot be reached answers its error in place
of each reply (a read of a partitioned model goes on with the others); Redis errors that the read raises become
the clients' own (core.redis_errors)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import redis
import redis.asyncio as aioredis

from producer.client.core import redis_errors
from producer.client.reads import Read, T


def run(connection_at: Mapping[str, redis.Redis], read: Read[T]) -> T:
    """Run `read` on blocking clients, one Redis after the other within a round."""
    with redis_errors():
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
                        replies[url] = [exc] * len(commands)
                asked = read.send(replies)
        except StopIteration as done:
            return done.value


async def run_async(connection_at: Mapping[str, aioredis.Redis], read: Read[T]) -> T:
    """Run `read` on asyncio clients, every Redis of a round at once."""
    with redis_errors():
        try:
            asked = next(read)
            while True:
                urls = list(asked)
                replies = await asyncio.gather(*(_pipeline(connection_at[url], asked[url]) for url in urls))
                asked = read.send(dict(zip(urls, replies)))
        except StopIteration as done:
            return done.value


async def _pipeline(connection: aioredis.Redis, commands: list[tuple]) -> list:
    pipe = connection.pipeline(transaction=False)
    for command in commands:
        pipe.execute_command(*command)
    try:
        return await pipe.execute(raise_on_error=False)
    except (redis.ConnectionError, redis.TimeoutError) as exc:  # that Redis only: the read decides (reads.ok)
        return [exc] * len(commands)
