"""What one request costs the Redis that carries a fleet, on the whole queue path (the producer's wait included),
side by side in one run with a raw loop and plain rq: Redis commands, producer round trips, Redis main-thread CPU
and bytes per request (issue 38).

    PYTHONPATH=. .venv/bin/python bench/capacity.py [--requests 3000] [--sync-requests 600]
        [--requests-64 300] [--in-flight 256] [--rows raw,rq,sync,async,tiny] [--worker-args "..."]
        [--dtypes float16,binary] [--repeat 1] [--breakdown 64] [--json OUT]

Rows, each on a redis-server of its own, each timed after a warm-up:
  raw loop     one request at a time: the producer LPUSHes the request (its msgpack bytes), a worker process
               BRPOPs it and answers with SET EX + RPUSH (one pipeline), the producer BLPOPs the wake-up and
               GETs the result: 6 commands, the least a queue with a result and a wake-up can do; 1 and 64 texts
  plain rq     rq 3.0 alone, one request at a time: Queue.enqueue, rq's SimpleWorker (a process) runs a job
               that returns the result bytes, the producer waits with Job.latest_result(timeout)
  sync         embedfleet's Producer.embed, one request at a time, on `worker --model null:384`
  async        embedfleet's AsyncProducer.embed, --in-flight requests at once (1 and 64 texts), same worker;
               64 texts again with each of --dtypes as the request's embed_dtype (what a smaller blob buys)
  tiny         AsyncProducer, --in-flight at once, on a tiny real model (a random 1-layer BERT with MiniLM's
               tokenizer, bench/cpuside.py) with the worker's defaults: the vector cache and in-flight dedup
               on; unique texts (every one a cache miss), then the same texts again (every one a hit)

Per row, over the timed requests: Redis commands (INFO commandstats deltas: commands run inside Lua scripts
included), producer round trips (counted in this process as redis-py sends: one command, pipeline or EVALSHA
is one; bench/_roundtrips.py), the worker's round trips (the same counter in the worker process), Redis
main-thread CPU (INFO cpu: used_cpu_user_main_thread + used_cpu_sys_main_thread), Redis network bytes in +
out, and Redis memory kept (used_memory) per request. The cost of the INFO reads themselves is measured on
the idle server and taken off. A worker's background (its heartbeat every 2 s: lease renewals, recovery,
adverts) is in the counts as it is in production: a few commands a second, well under 0.1 per request here.
Commands per request are deterministic up to that background; the CPU ratio against the raw loop is the
figure to compare, on a quiet machine.

--breakdown N then sends N more requests of each embedfleet row under MONITOR (not timed: MONITOR costs
Redis CPU) and prints where each command of a request goes: per script (enqueue, take, finish, ...) with the
commands it runs inside Redis, and per plain command of the producer and of the worker.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _roundtrips
from _common import (Process, RedisServer, describe_machine, load_corpus, short_texts, table, wait_advertised)

from embedfleet.common.policy import FAILURE_TTL, JOB_TTL, RESULT_TTL
from embedfleet.common.protocol import scripts
from embedfleet.common.request import EmbedRequest
from embedfleet.common.result import Result

NULL_SIZE = 384
NULL_NAME, TINY_NAME = "null", "tiny"
WARM_UP = 20
SNAPSHOT_SECTIONS = ("cpu", "commandstats", "stats", "memory")
TARGETS = ("targets (issue 38): async 1-text <= 10 commands and <= 0.75x the raw loop's Redis CPU; sync 1-text "
           "<= 25 commands, <= 3 producer round trips, <= 2.5x; async 64-text <= 1.3x the raw loop at 64 texts")


# -- what Redis says -------------------------------------------------------------------------------
@dataclass
class Snapshot:
    cpu: float
    commands: Counter
    usec: Counter  # microseconds Redis spent in each command (a script's own commands inside its EVALSHA's)
    net: int
    memory: int

    @classmethod
    def take(cls, conn) -> Snapshot:
        info = conn.info(*SNAPSHOT_SECTIONS)
        stats = {name.removeprefix("cmdstat_"): value for name, value in info.items() if name.startswith("cmdstat_")}
        return cls(info["used_cpu_user_main_thread"] + info["used_cpu_sys_main_thread"],
                   Counter({name: value["calls"] for name, value in stats.items()}),
                   Counter({name: value["usec"] for name, value in stats.items()}),
                   info["total_net_input_bytes"] + info["total_net_output_bytes"], info["used_memory"])

    def __sub__(self, other: Snapshot) -> Snapshot:
        commands, usec = Counter(self.commands), Counter(self.usec)
        commands.subtract(other.commands)
        usec.subtract(other.usec)
        return Snapshot(self.cpu - other.cpu, commands, usec, self.net - other.net, self.memory - other.memory)


class Meter:
    """Deltas of one Redis over a stretch of requests, less what reading them costs (INFO itself)."""

    def __init__(self, url: str):
        self.conn = redis.Redis.from_url(url)
        first = Snapshot.take(self.conn)
        second = Snapshot.take(self.conn)
        self.own = Snapshot.take(self.conn) - second  # one INFO read: its call, its reply's bytes, its CPU
        del first

    def measure(self, run, requests: int, counted: Path | None = None) -> dict:
        """Run `run()` (which sends `requests` requests) and return the per-request figures."""
        worker_trips = _roundtrips.read(counted) if counted else 0
        trips = _roundtrips.count
        before = Snapshot.take(self.conn)
        started = time.perf_counter()
        run()
        seconds = time.perf_counter() - started
        after = Snapshot.take(self.conn)
        trips = _roundtrips.count - trips - 1  # less the second INFO
        if counted:
            time.sleep(0.02)  # the worker rewrites its count every 5 ms
            worker_trips = _roundtrips.read(counted) - worker_trips
        spent = after - before
        spent.commands.pop("info", None)
        spent.usec.pop("info", None)
        commands = sum(spent.commands.values())
        return {"requests": requests, "seconds": seconds,
                "commands": commands / requests,
                "producer_round_trips": trips / requests,
                "worker_round_trips": worker_trips / requests if counted else float("nan"),
                "redis_cpu_us": max(spent.cpu - self.own.cpu, 0.0) * 1e6 / requests,
                "net_bytes": (spent.net - self.own.net) / requests,
                "kept_bytes": spent.memory / requests,
                "by_command": {name: calls / requests for name, calls in spent.commands.most_common() if calls},
                "usec_by_command": {name: usec / requests for name, usec in spent.usec.most_common() if usec}}

    def close(self) -> None:
        self.conn.close()


# -- where each command goes (MONITOR) --------------------------------------------------------------
def monitored(url: str, run, requests: int, worker_pid: int) -> dict[str, float]:
    """The MONITOR breakdown of `run()`, which sends `requests` requests to the worker process `worker_pid`."""
    conn = redis.Redis.from_url(url)
    lines: list[tuple[str, str, str]] = []
    stop = f"bench-monitor-stop-{time.monotonic_ns()}"
    ready = threading.Event()

    def listen() -> None:
        with conn.monitor() as monitor:
            ready.set()
            for entry in monitor.listen():
                if stop in entry["command"]:
                    return
                lines.append((entry["client_type"], f"{entry['client_address']}:{entry['client_port']}",
                              entry["command"]))

    thread = threading.Thread(target=listen, daemon=True)
    thread.start()
    ready.wait(10)
    time.sleep(0.2)
    run()
    time.sleep(0.2)
    workers = _addresses_of(worker_pid)
    other = redis.Redis.from_url(url)
    other.get(stop)
    thread.join(30)
    other.close()
    scripts_by_sha = {script.sha: script.name for script in scripts.ALL}
    counts: Counter = Counter()
    current = None
    for client_type, address, command in lines:
        name = command.split(" ", 1)[0].lower().strip('"')
        if client_type == "lua":
            if current is not None:
                counts[current] += 1
            continue
        side = "worker" if address in workers else "producer"
        if name in ("evalsha", "eval"):
            sha = command.split(" ", 2)[1].strip('"')
            current = f"{side} {scripts_by_sha.get(sha, 'script?') if name == 'evalsha' else 'eval'} (script)"
            counts[current] += 1
        else:
            current = None
            counts[f"{side} {name}"] += 1
    return {what: round(n / requests, 3) for what, n in sorted(counts.items())}


def _addresses_of(pid: int) -> set[str]:
    """The 127.0.0.1:<port> addresses of the TCP connections process `pid` holds (Linux /proc): how Redis's
    CLIENT LIST and MONITOR name its clients."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = fd.readlink().name
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[9] in inodes:
            found.add(f"127.0.0.1:{int(fields[1].split(':')[1], 16)}")
    return found


# -- the raw loop ----------------------------------------------------------------------------------
RAW_WORKER = r"""
import sys, redis
conn = redis.Redis.from_url(sys.argv[1])
conn.client_setname("bench-worker-raw")
blob = open(sys.argv[2], "rb").read()
while True:
    popped = conn.brpop("raw:queue", timeout=5)
    if popped is None:
        continue
    request_id = popped[1][:32].decode()
    if request_id == "stop" * 8:
        break
    pipe = conn.pipeline(transaction=False)
    pipe.set("raw:result:" + request_id, blob, ex=3600)
    pipe.rpush("raw:notify:" + request_id, 1)
    pipe.execute()
"""


def result_blob(texts: int) -> bytes:
    rows = np.zeros((texts, NULL_SIZE), np.float32)
    rows[:, 0] = 1
    return Result.success("x" * 32, NULL_NAME, rows, "float32", "native", texts).encode()


def raw_row(texts: list[list[str]]) -> dict:
    blob_file = Path(tempfile.mkstemp(prefix="bench-raw-blob-")[1])
    blob_file.write_bytes(result_blob(len(texts[0])))
    with RedisServer() as server:
        worker = Process([sys.executable, "-c", RAW_WORKER, server.url, str(blob_file)], "raw-worker")
        conn = redis.Redis.from_url(server.url)
        meter = Meter(server.url)

        def one(inputs: list[str]) -> None:
            request = EmbedRequest(model=NULL_NAME, inputs=inputs)
            conn.lpush("raw:queue", request.id.encode() + request.encode())
            conn.blpop([f"raw:notify:{request.id}"], timeout=60)
            if conn.get(f"raw:result:{request.id}") is None:
                raise SystemExit("the raw loop lost a result")

        try:
            for inputs in texts[:WARM_UP]:
                one(inputs)
            figures = meter.measure(lambda: [one(inputs) for inputs in texts[WARM_UP:]], len(texts) - WARM_UP)
            conn.lpush("raw:queue", b"stop" * 8)
        finally:
            worker.stop()
            meter.close()
            conn.close()
            blob_file.unlink(missing_ok=True)
    return figures


# -- plain rq --------------------------------------------------------------------------------------
RQ_WORKER = r"""
import sys
import redis
from rq import Queue, SimpleWorker
from embedfleet.common.serializer import MsgpackSerializer
conn = redis.Redis.from_url(sys.argv[1])
SimpleWorker([Queue("plain", connection=conn, serializer=MsgpackSerializer)], connection=conn,
             serializer=MsgpackSerializer, name="bench-worker-rq").work(logging_level="WARNING")
"""


def rq_job(payload: bytes) -> bytes:
    """Plain rq's job: answer with a result of the null model's size (what an embedding job returns)."""
    return RQ_BLOB


RQ_BLOB = result_blob(1)


def rq_row(texts: list[list[str]]) -> dict:
    from rq import Queue

    from embedfleet.common.serializer import MsgpackSerializer

    with RedisServer() as server:
        worker = Process([sys.executable, "-c", RQ_WORKER, server.url], "rq-worker",
                         pythonpath=(Path(__file__).resolve().parent,))
        conn = redis.Redis.from_url(server.url)
        queue = Queue("plain", connection=conn, serializer=MsgpackSerializer)
        meter = Meter(server.url)

        def one(inputs: list[str]) -> None:
            job = queue.enqueue("capacity.rq_job", EmbedRequest(model=NULL_NAME, inputs=inputs).encode(),
                                result_ttl=RESULT_TTL, ttl=JOB_TTL, failure_ttl=FAILURE_TTL)
            if job.latest_result(timeout=60) is None:
                raise worker.fail("plain rq answered no job within 60 s")

        try:
            for inputs in texts[:WARM_UP]:
                one(inputs)
            figures = meter.measure(lambda: [one(inputs) for inputs in texts[WARM_UP:]], len(texts) - WARM_UP)
        finally:
            worker.stop()
            meter.close()
            conn.close()
    return figures


# -- embedfleet ------------------------------------------------------------------------------------
class Fleet:
    """A redis-server and one `python -m embedfleet.worker` on it, its round trips counted."""

    def __init__(self, model: str, name: str, extra: list[str]):
        self.server = RedisServer().start()
        self.hook, self.counted = _roundtrips.child_hook()
        self.name = name
        self.worker = Process([sys.executable, "-m", "embedfleet.worker", "--redis-url", self.server.url, "--model",
                               model, "--served-model-name", name, *extra], f"worker-{name}",
                              env={_roundtrips.ENV: str(self.counted)}, pythonpath=(self.hook,))
        wait_advertised(self.worker, self.server.url, name)
        self.meter = Meter(self.server.url)

    @property
    def url(self) -> str:
        return self.server.url

    def close(self) -> None:
        self.worker.stop()
        self.meter.close()
        self.server.stop()
        shutil.rmtree(self.hook, ignore_errors=True)


def sync_row(fleet: Fleet, texts: list[list[str]], breakdown: int) -> dict:
    from embedfleet import Producer

    with Producer(fleet.url) as producer:
        def run(batch):
            for inputs in batch:
                producer.embed(inputs, fleet.name, timeout=60)

        run(texts[:WARM_UP])
        timed = texts[WARM_UP:len(texts) - breakdown]
        figures = fleet.meter.measure(lambda: run(timed), len(timed), fleet.counted)
        if breakdown:
            figures["breakdown"] = monitored(fleet.url, lambda: run(texts[-breakdown:]), breakdown, fleet.worker.pid)
    return figures


def async_row(fleet: Fleet, texts: list[list[str]], in_flight: int, breakdown: int, again: bool = False,
              **fields) -> dict:
    """AsyncProducer.embed of every element of `texts`, `in_flight` at a time; with `again`, a second row of the
    same texts once more (the tiny model's cache hits). `fields`: request fields (embed_dtype)."""
    from embedfleet import AsyncProducer

    loop = asyncio.new_event_loop()

    async def open_producer():
        return AsyncProducer(fleet.url)

    producer = loop.run_until_complete(open_producer())

    async def embed_all(batch):
        gate = asyncio.Semaphore(in_flight)

        async def one(inputs):
            async with gate:
                await producer.embed(inputs, fleet.name, timeout=300, **fields)

        await asyncio.gather(*(one(inputs) for inputs in batch))

    def run(batch):
        loop.run_until_complete(embed_all(batch))

    try:
        run(texts[:WARM_UP])
        timed = texts[WARM_UP:len(texts) - breakdown]
        figures = fleet.meter.measure(lambda: run(timed), len(timed), fleet.counted)
        if breakdown:
            figures["breakdown"] = monitored(fleet.url, lambda: run(texts[-breakdown:]), breakdown, fleet.worker.pid)
        if again:
            hits = fleet.meter.measure(lambda: run(timed), len(timed), fleet.counted)
            figures = {"misses": figures, "hits": hits}
    finally:
        loop.run_until_complete(producer.close())
        loop.close()
    return figures


def null_rows(args, corpus: list[str]) -> dict[str, dict]:
    extra = args.worker_args.split()
    rows = {}
    plan = [("sync, 1 text, one at a time", 1, args.sync_requests, "sync", "float32"),
            ("async, 1 text, in flight", 1, args.requests, "async", "float32"),
            ("async, 64 texts, in flight", 64, args.requests_64, "async", "float32")]
    plan += [(f"async, 64 texts, in flight, embed_dtype {dtype}", 64, args.requests_64, "async", dtype)
             for dtype in filter(None, args.dtypes.split(","))]
    for label, texts_per_request, count, kind, dtype in plan:
        if kind not in args.rows:
            continue
        texts = batches(corpus, count + WARM_UP + args.breakdown, texts_per_request)
        fleet = Fleet(f"null:{NULL_SIZE}", NULL_NAME, extra)
        try:
            if kind == "sync":
                rows[label] = sync_row(fleet, texts, args.breakdown)
            else:
                rows[label] = async_row(fleet, texts, args.in_flight, 0 if dtype != "float32" else args.breakdown,
                                        **({} if dtype == "float32" else {"embed_dtype": dtype}))
        finally:
            fleet.close()
        rows[label]["texts_per_request"] = texts_per_request
        print(f"  {label}: {rows[label]['commands']:.1f} commands/request", flush=True)
    return rows


def tiny_rows(args, corpus: list[str]) -> dict[str, dict]:
    from transformers.utils import logging as hf_logging

    from cpuside import build_tiny

    hf_logging.disable_progress_bar()
    folder = tempfile.mkdtemp(prefix="bench-capacity-tiny-")
    try:
        build_tiny(folder)
        # unique texts: each a cache miss the first time (a corpus text with its index: no two alike)
        count = args.requests + WARM_UP + args.breakdown
        texts = [[f"{corpus[i % len(corpus)]} #{i}"] for i in range(count)]
        fleet = Fleet(folder, TINY_NAME, ["--probe-seconds", "1", *args.worker_args.split()])
        try:
            both = async_row(fleet, texts, args.in_flight, args.breakdown, again=True)
        finally:
            fleet.close()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    rows = {"tiny model + cache, 1 text, in flight: misses": both["misses"],
            "tiny model + cache, 1 text, in flight: hits": both["hits"]}
    for row in rows.values():
        row["texts_per_request"] = 1
    return rows


def batches(corpus: list[str], count: int, size: int) -> list[list[str]]:
    return [[corpus[(i * size + j) % len(corpus)] for j in range(size)] for i in range(count)]


# -- the table -------------------------------------------------------------------------------------
HEADERS = ["path", "texts/request", "Redis commands/request", "producer round trips/request",
           "worker round trips/request", "Redis CPU us/request", "x raw loop (same texts)", "Redis net bytes/request",
           "Redis memory kept bytes/request", "requests/s (this run)"]


def report(rows: dict[str, dict]) -> str:
    raw = {r["texts_per_request"]: r["redis_cpu_us"] for label, r in rows.items() if label.startswith("raw")}
    lines = []
    for label, r in rows.items():
        base = raw.get(r["texts_per_request"])
        ratio = r.get("x_raw", r["redis_cpu_us"] / base if base else float("nan"))
        lines.append([label, r["texts_per_request"], r["commands"], r["producer_round_trips"], r["worker_round_trips"],
                      r["redis_cpu_us"], ratio, r["net_bytes"],
                      r["kept_bytes"], r["requests"] / r["seconds"]])
    return table(HEADERS, lines)


def capacity(rows: dict[str, dict]) -> str:
    """Requests/s and texts/s one Redis core carries at each embedfleet row's cost (and 70% of it to plan for)."""
    lines = []
    for label, r in rows.items():
        if label.startswith(("raw", "plain")):
            continue
        per_second = 1e6 / r["redis_cpu_us"] if r["redis_cpu_us"] else float("nan")
        lines.append([label, per_second, per_second * r["texts_per_request"], 0.7 * per_second])
    return table(["path", "requests/s per Redis core", "texts/s per Redis core", "plan for (70%) requests/s"],
                 lines, "What one Redis core carries at these costs")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=3000, help="1-text requests of the async and tiny rows")
    parser.add_argument("--sync-requests", type=int, default=600, help="requests of the one-at-a-time rows")
    parser.add_argument("--requests-64", type=int, default=300, help="64-text requests")
    parser.add_argument("--in-flight", type=int, default=256, help="requests the async rows keep in flight")
    parser.add_argument("--rows", default="raw,rq,sync,async,tiny", help="comma list of the rows to run")
    parser.add_argument("--worker-args", default="", help="extra flags for every `python -m embedfleet.worker`")
    parser.add_argument("--dtypes", default="float16,binary",
                        help="the 64-text async row again with each of these embed_dtype (smaller result blobs)")
    parser.add_argument("--repeat", type=int, default=1,
                        help="run every row this many times, the rows alternating; each row's figures are those of "
                             "its run with the median Redis CPU (the spread is printed), its ratio to the raw loop "
                             "the median of its ratios to the raw loop of the same pass")
    parser.add_argument("--breakdown", type=int, default=0,
                        help="then N more requests per embedfleet row under MONITOR: where each command goes")
    parser.add_argument("--corpus", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()
    args.rows = set(filter(None, args.rows.split(",")))
    _roundtrips.install()
    corpus = short_texts(load_corpus(args.corpus))
    print(f"{describe_machine()}; Redis {redis_version()}", flush=True)

    runs: dict[str, list[dict]] = {}
    breakdown = args.breakdown
    for repeat in range(args.repeat):
        args.breakdown = breakdown if repeat == 0 else 0  # the breakdown is the same in every run: once is enough
        for label, row in one_pass(args, corpus).items():
            runs.setdefault(label, []).append(row)
    args.breakdown = breakdown
    rows = {label: sorted(found, key=lambda r: r["redis_cpu_us"])[(len(found) - 1) // 2]
            for label, found in runs.items()}
    for label, found in runs.items():
        if "breakdown" in found[0]:
            rows[label]["breakdown"] = found[0]["breakdown"]
    if args.repeat > 1:
        print("Redis CPU us/request of each run:")
        for label, found in runs.items():
            print(f"  {label}: " + ", ".join(f"{r['redis_cpu_us']:.1f}" for r in found))
        print("x the raw loop of the same pass (a pass's rows are seconds apart, which damps the machine's drift; "
              "the table's ratio is the median of these):")
        for label, ratios in pass_ratios(runs).items():
            rows[label]["x_raw"] = statistics.median(ratios)
            print(f"  {label}: " + ", ".join(f"{ratio:.3f}" for ratio in ratios))

    print(report(rows))
    print(TARGETS)
    print(capacity(rows))
    print("\nRedis commands per request, by command:")
    for label, r in rows.items():
        top = ", ".join(f"{name} {calls:.2f}" for name, calls in r["by_command"].items())
        print(f"  {label}: {top}")
    print("\nRedis microseconds per request inside commands (INFO commandstats usec; an EVALSHA's include the "
          "commands its script runs; the rest of the CPU is reading, parsing and answering):")
    for label, r in rows.items():
        top = ", ".join(f"{name} {usec:.1f}" for name, usec in r["usec_by_command"].items())
        print(f"  {label}: {sum(r['usec_by_command'].values()):.1f} us: {top}")
    if args.breakdown:
        print(f"\nWhere each command of a request goes (MONITOR over {args.breakdown} requests per row):")
        for label, r in rows.items():
            if "breakdown" in r:
                print(f"  {label}:")
                for what, n in r["breakdown"].items():
                    print(f"    {what}: {n:.2f}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


def pass_ratios(runs: dict[str, list[dict]]) -> dict[str, list[float]]:
    """Per row but the raw loops', its Redis CPU over the raw loop's of the same texts in the same pass."""
    raw = {found[0]["texts_per_request"]: found for label, found in runs.items() if label.startswith("raw")}
    out = {}
    for label, found in runs.items():
        base = raw.get(found[0]["texts_per_request"])
        if base is not None and not label.startswith("raw"):
            out[label] = [r["redis_cpu_us"] / b["redis_cpu_us"] for r, b in zip(found, base) if b["redis_cpu_us"]]
    return out


def one_pass(args, corpus: list[str]) -> dict[str, dict]:
    """Every row asked for, once."""
    rows: dict[str, dict] = {}
    if "raw" in args.rows:
        rows["raw loop, 1 text, one at a time"] = {**raw_row(batches(corpus, args.sync_requests + WARM_UP, 1)),
                                                   "texts_per_request": 1}
        rows["raw loop, 64 texts, one at a time"] = {**raw_row(batches(corpus, args.requests_64 + WARM_UP, 64)),
                                                     "texts_per_request": 64}
    if "rq" in args.rows:
        rows["plain rq, 1 text, one at a time"] = {**rq_row(batches(corpus, args.sync_requests + WARM_UP, 1)),
                                                   "texts_per_request": 1}
    rows.update(null_rows(args, corpus))
    if "tiny" in args.rows:
        rows.update(tiny_rows(args, corpus))
    return rows


def redis_version() -> str:
    with RedisServer() as server:
        conn = redis.Redis.from_url(server.url)
        version = conn.info("server")["redis_version"]
        conn.close()
    return version


if __name__ == "__main__":
    main()
