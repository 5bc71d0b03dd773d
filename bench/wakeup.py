"""Wake-up latency, side by side in one run: from a result landing in Redis to the waiting code resuming.

    PYTHONPATH=. .venv/bin/python bench/wakeup.py [--requests 300] [--bursts 64,1000] [--json OUT]

A thread of this process writes the results once the waiters are blocked, the way a worker's finish
script does: one Lua script sets each blob, pushes its notify list and adds its id to the reply stream;
a TIME pipelined right behind it reads the server's clock as the script's effects became visible (a
script's own TIME is frozen at its start). The clock stops when the
waiting coroutine (or thread) resumes with its result (time.time(); server and client share the host).

Rows: AsyncProducer.wait on its own request (reply stream), on a request another producer submitted (its
notify list; also 64 landing together: one BLPOP over all their lists), bursts of waits whose results land
in one script (a worker's round of 64, and 1000: coalesced reads), and the sync Producer.wait (BLPOP on
the notify list) as the baseline. No model and no worker: the requests stay queued
and only their results are written.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RedisServer, describe_machine, percentile, table

import redis

from embedfleet.common.capabilities import ModelCapabilities
from embedfleet.common.policy import RESULT_TTL
from embedfleet.common.protocol import scripts
from embedfleet.common.result import Result
from embedfleet import AsyncProducer, Producer
from embedfleet.worker.serving.advertise import Advertiser

MODEL = "wakeup"
SETTLE = 0.005  # seconds a waiter is given to block before its result is written


class Writer:
    """Lands results the one way answers land (the protocol's publish, lib.lua), all in one transaction as a
    worker's round does; returns the server time at which they landed."""

    def __init__(self, url: str, reply_to: str | None):
        self.connection = redis.Redis.from_url(url)
        self.reply_to = reply_to or ""

    def land(self, request_ids: list[str]) -> float:
        blobs = [Result.success(i, MODEL, np.ones((1, 4), np.float32), "float32", "little", 1).encode()
                 for i in request_ids]
        pipe = self.connection.pipeline(transaction=True)
        for request_id, blob in zip(request_ids, blobs):
            scripts.PUBLISH.queue(pipe, [], [request_id, blob, RESULT_TTL, "0", self.reply_to], by_source=True)
        pipe.time()
        seconds, micros = pipe.execute()[-1]
        return seconds + micros / 1e6


async def async_waits(url: str, requests: int, burst: int, foreign: bool) -> list[float]:
    """Milliseconds from landing to resuming, one request at a time (burst=1) or `burst` at once."""
    latencies = []
    async with AsyncProducer(url) as producer:
        stream = producer._links[producer.redis_url].replies.stream
        writer = Writer(url, None if foreign else stream)
        with Producer(url) as other:
            for _ in range(max(requests // burst, 1)):
                if foreign:
                    ids = other.submit_many([["x"]] * burst, MODEL)
                else:
                    ids = await producer.submit_many([["x"]] * burst, MODEL)

                async def resumed(request_id):
                    await producer.wait(request_id, timeout=30)
                    return time.time()

                tasks = [asyncio.ensure_future(resumed(i)) for i in ids]
                await asyncio.sleep(SETTLE if burst == 1 else 0.2)
                started = await asyncio.to_thread(writer.land, ids)
                latencies += [(t - started) * 1000 for t in await asyncio.gather(*tasks)]
    return latencies


def sync_waits(url: str, requests: int) -> list[float]:
    latencies = []
    writer = Writer(url, None)
    with Producer(url) as producer:
        for _ in range(requests):
            request_id = producer.submit(["x"], MODEL)
            landed: list[float] = []
            timer = threading.Timer(SETTLE, lambda i=request_id, out=landed: out.append(writer.land([i])))
            timer.start()
            producer.wait(request_id, timeout=30)
            resumed = time.time()
            timer.join()
            latencies.append((resumed - landed[0]) * 1000)
    return latencies


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300, help="waits measured per one-at-a-time row")
    parser.add_argument("--bursts", default="64,1000", help="waits whose results land together (64: a "
                        "worker's round)")
    parser.add_argument("--json", type=Path, help="write the figures here too")
    args = parser.parse_args()
    print(describe_machine(), flush=True)
    with RedisServer() as server:
        connection = redis.Redis.from_url(server.url)
        caps = ModelCapabilities(name=MODEL, max_model_len=32, embedding_size=4, vocab_size=100)
        Advertiser(connection, caps, "wakeup-bench", ttl=3600).advertise()
        runs = {
            "AsyncProducer.wait, own request (reply stream)": asyncio.run(
                async_waits(server.url, args.requests, 1, foreign=False)),
            "AsyncProducer.wait, another producer's request (notify list)": asyncio.run(
                async_waits(server.url, args.requests, 1, foreign=True)),
            **{f"AsyncProducer.wait, {burst} waits landing together": asyncio.run(
                async_waits(server.url, max(burst * 5, args.requests), burst, foreign=False))
               for burst in map(int, args.bursts.split(","))},
            "AsyncProducer.wait, 64 of another producer's landing together": asyncio.run(
                async_waits(server.url, max(64 * 5, args.requests), 64, foreign=True)),
            "Producer.wait (sync, BLPOP), baseline": sync_waits(server.url, args.requests),
        }
    baseline = percentile(runs["Producer.wait (sync, BLPOP), baseline"], 50)
    rows = [[name, len(ms), percentile(ms, 50), percentile(ms, 90), percentile(ms, 99),
             percentile(ms, 50) / baseline] for name, ms in runs.items()]
    print(table(["wait", "waits", "p50 ms", "p90 ms", "p99 ms", "p50 x sync"], rows,
                "Wake-up latency: result written -> waiter resumed"))
    if args.json:
        args.json.write_text(json.dumps({name: {"p50": r[2], "p90": r[3], "p99": r[4], "n": r[1]}
                                         for name, r in zip(runs, rows)}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
