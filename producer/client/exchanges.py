"""How each client moves the bytes of a read (producer/client/reads.py): every exchange (one round trip) as one
pipeline per Redis, its replies sent back into the read until it returns. Redis errors become the clients' own
(core.redis_errors)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import redis
import redis.asyncio as aioredis

from producer.client.core import redis_errors
from producer.client.reads import Read, T


def run(connection_at: Mapping[str, redis.Redis], read: Read[T]) -> T:
    """Run `read` on blocking clients, one Redis after the other within an exchange."""
    with redis_errors():
        try:
            asked = next(read)
            while True:
                replies = {}
                for url, commands in asked.items():
                    with connection_at[url].pipeline(transaction=False) as pipe:
                        for command in commands:
                            pipe.execute_command(*command)
                        replies[url] = pipe.execute(raise_on_error=False)
                asked = read.send(replies)
        except StopIteration as done:
            return done.value


async def run_async(connection_at: Mapping[str, aioredis.Redis], read: Read[T]) -> T:
    """Run `read` on asyncio clients, every Redis of an exchange at once."""
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
    return await pipe.execute(raise_on_error=False)
