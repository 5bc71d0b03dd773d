"""Queue-path requests/s with no model, side by side in one run: the worker serving its null model vs rq's
SimpleWorker on no-op jobs vs a raw Redis loop doing the least a queue must, for 1-text and 64-text requests,
with Redis commands per request and round trips per 64 requests (one take of 64 jobs).

    PYTHONPATH=. .venv/bin/python bench/nullmodel.py [--requests 20000] [--requests-64 1000]
        [--simple-requests 2000] [--seconds 60] [--sizes 1,64] [--skip worker,simple,raw] [--json OUT]

Worker row: the queue is filled first (the Producer's job format), then
`python -m embedfleet.worker --model null:384 --served-model-name null` starts; the clock runs from its first take to
the last result blob. SimpleWorker row: rq's own worker in burst mode on no-op jobs with the same payloads (its
start and teardown, measured on an empty queue, are subtracted). Raw loop row: LPOP 64 ids, MGET their payloads,
one pipeline of SET result blob + RPUSH/EXPIRE notify per id. Commands come from INFO commandstats deltas (this
script's own polls subtracted); round trips are counted on the client side, as redis-py sends (one command, or
one pipeline/transaction/EVALSHA, is one round trip; bench/_roundtrips.py, injected into the worker through a
sitecustomize). Client CPU: what the side that serves spends per request, user + system, all its threads (the
worker process's from /proc; SimpleWorker's and the raw loop's, this process's): a figure that a busy machine
blurs less than requests/s. Each row has its own private redis-server and stops by itself: --seconds bounds each
drain.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import time
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _roundtrips
from _common import (Process, RedisServer, Timer, describe_machine, load_corpus, prefill, ratio,
                     redis_commands, short_texts, table, wait_all_results)

from embedfleet.common.policy import FAILURE_TTL, JOB_TIMEOUT, JOB_TTL, RESULT_TTL
from embedfleet.common.protocol import keys
from embedfleet.common.protocol.keys import queue_name
from embedfleet.common.request import EmbedRequest
from embedfleet.common.result import Result

SIZE = 384  # the null model's embedding size
NAME = "null"
INFO_CALLS = 1  # the INFO that opens a count is counted in the one that closes it


def noop(payload: bytes) -> None:
    """SimpleWorker's job: nothing, so only rq's own bookkeeping costs time."""


def batches_of(texts: list[str], requests: int, size: int) -> list[list[str]]:
    return [[texts[(i * size + j) % len(texts)] for j in range(size)] for i in range(requests)]


# -- the worker's null model -----------------------------------------------------------------------
def worker_args(redis_url: str) -> list[str]:
    entry = ["-m", "embedfleet.worker"]
    return [sys.executable, *entry, "--redis-url", redis_url, "--model", f"null:{SIZE}",
            "--served-model-name", NAME]


def worker_row(texts, size: int, requests: int, seconds: float) -> dict:
    """Fill the queue, start the worker, time it from its first take to the last result blob."""
    hook, counted = _roundtrips.child_hook()
    with RedisServer() as server:
        ids = prefill(server.url, NAME, batches_of(texts, requests, size))
        conn = redis.Redis.from_url(server.url)
        queue_key = f"rq:queue:{queue_name(NAME)}"
        worker = Process(worker_args(server.url), "null-worker", env={_roundtrips.ENV: str(counted)},
                         pythonpath=(hook,))
        try:
            deadline = time.monotonic() + 180
            while conn.llen(queue_key) == len(ids):
                if not worker.alive():
                    raise worker.fail("the worker exited before taking a job")
                if time.monotonic() > deadline:
                    raise worker.fail("took no job within 180 s of starting")
                time.sleep(0.002)
            start, trips, cpu = time.perf_counter(), _roundtrips.read(counted), process_cpu(worker.pid)
            before = redis_commands(conn)
            found, own = wait_all_results(conn, ids, time.monotonic() + seconds, process=worker)
            elapsed, cpu = time.perf_counter() - start, process_cpu(worker.pid) - cpu
            commands = redis_commands(conn) - before - own - INFO_CALLS
            time.sleep(0.02)  # the child rewrites its count every 5 ms
            trips = _roundtrips.read(counted) - trips
        finally:
            worker.stop()
            conn.close()
            shutil.rmtree(hook, ignore_errors=True)
    if found < len(ids):
        print(f"  note: {found} of {len(ids)} results within --seconds {seconds:g}", flush=True)
    return {"requests_s": found / elapsed, "commands": commands / max(found, 1),
            "round_trips": trips / max(found, 1) * 64, "cpu_us": cpu / max(found, 1) * 1e6}


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system, all threads) process `pid` has used: its /proc stat (Linux); nan elsewhere."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# -- rq's SimpleWorker on no-op jobs ---------------------------------------------------------------
class SimpleBurst:
    """rq's SimpleWorker in burst mode over a queue of no-op jobs."""

    def __init__(self, url: str):
        from rq import Queue

        from embedfleet.common.serializer import MsgpackSerializer

        self.serializer = MsgpackSerializer
        self.conn = redis.Redis.from_url(url)
        self.queue = Queue("noop-simple", connection=self.conn, serializer=MsgpackSerializer)

    def fill(self, payloads: list[bytes]) -> None:
        from rq import Queue

        self.queue.enqueue_many([Queue.prepare_data(noop, (p,), ttl=JOB_TTL, result_ttl=RESULT_TTL,
                                                    failure_ttl=FAILURE_TTL, timeout=JOB_TIMEOUT)
                                 for p in payloads])

    def run(self) -> float:
        from embedfleet.worker.serving.rqpubsub import PromptSimpleWorker  # rq's SimpleWorker, its teardown bounded

        with Timer() as timer:
            PromptSimpleWorker([self.queue], connection=self.conn, serializer=self.serializer).work(
                burst=True, logging_level="WARNING")
        return timer.seconds


def simple_row(texts, size: int, requests: int) -> dict:
    """Its start and teardown are measured on an empty queue and subtracted."""
    payloads = [EmbedRequest(model=NAME, inputs=b).encode() for b in batches_of(texts, requests, size)]
    with RedisServer() as server:
        bench, conn = SimpleBurst(server.url), redis.Redis.from_url(server.url)
        bench.run()  # imports, first registration
        before, trips = redis_commands(conn), _roundtrips.count
        fixed = bench.run()
        empty, empty_trips = redis_commands(conn) - before - INFO_CALLS, _roundtrips.count - trips - 1
        bench.fill(payloads)
        before, trips, cpu = redis_commands(conn), _roundtrips.count, time.process_time()
        seconds = bench.run() - fixed
        cpu = time.process_time() - cpu
        commands = redis_commands(conn) - before - INFO_CALLS - empty
        trips = _roundtrips.count - trips - 1 - empty_trips
        conn.close()
    return {"requests_s": requests / seconds, "commands": commands / requests, "round_trips": trips / requests * 64,
            "cpu_us": cpu / requests * 1e6}  # (its start and teardown included)


# -- the raw Redis loop ----------------------------------------------------------------------------
def raw_fill(conn, payloads: list[bytes]) -> None:
    ids = [f"{i:08d}" for i in range(len(payloads))]
    pipe = conn.pipeline(transaction=False)
    for request_id, payload in zip(ids, payloads, strict=True):
        pipe.set(f"raw:payload:{request_id}", payload)
    pipe.rpush("raw:queue", *ids)
    pipe.execute()


def raw_serve(conn, blob: bytes, take: int = 64) -> float:
    """Seconds to serve the queue the least-work way: LPOP 64, MGET, one pipeline of writes per take."""
    with Timer() as timer:
        while True:
            taken = conn.lpop("raw:queue", take)
            if not taken:
                break
            ids = [t.decode() for t in taken]
            conn.mget([f"raw:payload:{i}" for i in ids])  # the worker must read what it serves
            pipe = conn.pipeline(transaction=False)
            for request_id in ids:
                pipe.set(keys.result_key(request_id), blob, ex=RESULT_TTL)
                pipe.rpush(keys.notify_key(request_id), 1)
                pipe.expire(keys.notify_key(request_id), RESULT_TTL)
            pipe.execute()
    return timer.seconds


def raw_row(texts, size: int, requests: int) -> dict:
    import numpy as np

    payloads = [EmbedRequest(model=NAME, inputs=b).encode() for b in batches_of(texts, requests, size)]
    rows = np.zeros((size, SIZE), np.float32)
    rows[:, 0] = 1
    blob = Result.success("x" * 32, NAME, rows, "float32", "native", size).encode()
    with RedisServer() as server:
        conn = redis.Redis.from_url(server.url)
        raw_fill(conn, payloads[:64])
        raw_serve(conn, blob)  # warm-up
        conn.flushdb()
        raw_fill(conn, payloads)
        before, trips, cpu = redis_commands(conn), _roundtrips.count, time.process_time()
        seconds = raw_serve(conn, blob)
        cpu = time.process_time() - cpu
        commands = redis_commands(conn) - before - INFO_CALLS
        trips = _roundtrips.count - trips - 1
        conn.close()
    return {"requests_s": requests / seconds, "commands": commands / requests, "round_trips": trips / requests * 64,
            "cpu_us": cpu / requests * 1e6}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20000, help="1-text requests the worker and raw loop serve")
    parser.add_argument("--requests-64", type=int, default=1000, help="64-text requests (each result is ~100 kB)")
    parser.add_argument("--simple-requests", type=int, default=2000, help="requests for rq's SimpleWorker (slow)")
    parser.add_argument("--seconds", type=float, default=60, help="bound on each timed drain")
    parser.add_argument("--sizes", default="1,64", help="texts per request, comma list")
    parser.add_argument("--skip", default="", help="comma list of rows to leave out: worker, simple, raw")
    parser.add_argument("--corpus", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    _roundtrips.install()
    texts = short_texts(load_corpus(args.corpus))
    skip = set(filter(None, args.skip.split(",")))
    print(f"{describe_machine()}; null model of size {SIZE}", flush=True)

    worker_label = "embedfleet worker --model null:384"
    rows, figures = [], []
    for size in (int(s) for s in args.sizes.split(",")):
        requests = args.requests if size == 1 else args.requests_64
        measured = {}
        if "worker" not in skip:
            measured[worker_label] = worker_row(texts, size, requests, args.seconds)
        if "simple" not in skip:
            simple = min(args.simple_requests, requests)
            measured["rq SimpleWorker, no-op jobs"] = simple_row(texts, size, simple)
        if "raw" not in skip:
            measured["raw Redis loop (LPOP 64, MGET, SET+notify)"] = raw_row(texts, size, requests)
        raw = measured.get("raw Redis loop (LPOP 64, MGET, SET+notify)", {}).get("requests_s", float("nan"))
        for name, m in measured.items():
            print(f"  {name}, {size} text(s)/request: {m['requests_s']:.0f} requests/s", flush=True)
            rows.append([name, size, m["requests_s"], m["requests_s"] * size, m["commands"],
                         m["round_trips"] if m["round_trips"] is not None else float("nan"),
                         m["cpu_us"], ratio(m["requests_s"], raw)])
            figures.append({"path": name, "texts_per_request": size, **m})
    print(table(["path", "texts/request", "requests/s", "texts/s", "Redis commands/request",
                 "round trips/64 requests", "client CPU us/request", "x raw loop"], rows,
                "Null model: queue path only (targets: 1-text >= 0.4x raw loop; 64-text >= 100,000 texts/s)"))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
