"""An AsyncProducer reads large results a few at a time: each MGET asks for about READ_BYTES of them (by the
size of the results it has read), and every wait still gets its own result (producer/client/waiters.py)."""

from __future__ import annotations

import asyncio
import re

import numpy as np

from embedfleet import AsyncProducer
from embedfleet.common.protocol import keys
from embedfleet.producer.client.readsize import FIRST_READ, READ_BYTES, READ_CHUNK, read_size, result_bytes
from tests.nullworker import NULL, null_worker

DIMENSIONS = 1024
TEXTS = 16  # a result of 16 x 1,024 float32: 64 KiB and its header
REQUESTS = 40
_MORE = re.compile(rb" \.\.\. \((\d+) more arguments\)$")


def mgets_of_results(connection) -> list[int]:
    """The number of result keys in each MGET the slow log holds (every command: its threshold is 0)."""
    counts = []
    for entry in connection.slowlog_get(10_000):
        command = entry["command"]
        if command[:5].upper() == b"MGET " and command[5:].startswith(keys.RESULT_PREFIX.encode()):
            keys_, more = command.split(b" ")[1:], _MORE.search(command)
            if more:  # the slow log keeps the first arguments and says how many more there were
                keys_ = keys_[:-4] + [b""] * int(more.group(1))
            counts.append(len(keys_))
    return counts


def test_waits_on_many_large_results_read_them_a_few_at_a_time(redis_url, redis_client):
    with null_worker(redis_url, DIMENSIONS) as worker:
        async def main():
            async with AsyncProducer(redis_url) as producer:
                first = await producer.submit([f"warm-up {i}" for i in range(TEXTS)], NULL)
                ids = [await producer.submit([f"request {r} text {i}" for i in range(TEXTS)], NULL)
                       for r in range(REQUESTS)]
                waits = [asyncio.ensure_future(producer.wait(i, timeout=60)) for i in [first, *ids]]
                await asyncio.sleep(0.2)  # every wait's first look is made (no result yet)
                redis_client.config_set("slowlog-max-len", 10_000)
                redis_client.config_set("slowlog-log-slower-than", 0)
                redis_client.slowlog_reset()
                worker.serve()  # one round answers them all: their wake-ups come together
                return await asyncio.gather(*waits), ids

        try:
            results, ids = asyncio.run(main())
            counts = mgets_of_results(redis_client)
        finally:
            redis_client.config_set("slowlog-log-slower-than", 10_000)
        size = redis_client.strlen(keys.result_key(ids[0]))

    assert len(results) == REQUESTS + 1
    for result in results:
        assert result.ok and result.embeddings.shape == (TEXTS, DIMENSIONS)
        assert np.allclose(result.embeddings, 1 / np.sqrt(DIMENSIONS))
    assert sum(counts) >= REQUESTS + 1, counts  # every result was read
    most = max(1, READ_BYTES // size)
    # the first MGET after none was read yet asks for FIRST_READ; the rest for about READ_BYTES each
    assert max(counts) <= max(most, FIRST_READ), (counts, size)
    assert len(counts) >= (REQUESTS + 1) * size // READ_BYTES, counts


def test_read_size_follows_the_results_read_so_far():
    assert read_size(None, first=True) == FIRST_READ  # nothing read yet: a few first
    assert read_size(None, first=False) == READ_CHUNK  # the first MGET found no result: first looks, all at once
    assert read_size(1_600.0, first=True) == READ_BYTES // 1_600  # one-text results: hundreds a read
    assert read_size(100.0, first=False) == READ_CHUNK  # tiny results: at most READ_CHUNK keys
    assert read_size(READ_BYTES * 3.0, first=False) == 1  # a result larger than a read: one at a time
    assert result_bytes(None, [None, None]) is None
    assert result_bytes(None, [b"x" * 100, None, b"x" * 300]) == 200
    assert result_bytes(200.0, [b"x" * 600]) == 400
