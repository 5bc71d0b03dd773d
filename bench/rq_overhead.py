"""rq bookkeeping jobs/s, side by side in one run: BatchWorker (no-op engine) vs rq's SimpleWorker (no-op jobs).

    .venv/bin/python bench/rq_overhead.py [--jobs 4000] [--simple-jobs 1000] [--max-jobs 64]

Both serve the same kind of job (msgpack serializer, the producer's TTLs) on a private redis-server; the
engine answers instantly, so the figures are queue, registry and result bookkeeping only. Absolute numbers
drift with machine load; the ratio is the figure to compare.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

import redis
from rq import Queue

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from embedfleet.common.policy import FAILURE_TTL, JOB_TIMEOUT, JOB_TTL, RESULT_TTL
from embedfleet.common.protocol.jobdata import JOB_FUNC
from embedfleet.common.protocol.keys import queue_name
from embedfleet.common.redisserver import RedisServer
from embedfleet.common.request import EmbedRequest
from embedfleet.common.serializer import MsgpackSerializer
from embedfleet.worker.engine.engine import Engine
from embedfleet.worker.engine.models.nullmodel import NullModel
from embedfleet.worker.serving.builder import build_worker
from embedfleet.worker.serving.config import given_settings
from embedfleet.worker.serving.rqpubsub import PromptSimpleWorker


def noop(payload: bytes) -> None:
    """SimpleWorker's job: nothing, so only rq's bookkeeping costs time."""


def enqueue_all(queue: Queue, jobs: list[tuple]) -> None:
    queue.enqueue_many([Queue.prepare_data(func, args, job_id=job_id, ttl=JOB_TTL, result_ttl=RESULT_TTL,
                                           failure_ttl=FAILURE_TTL, timeout=JOB_TIMEOUT)
                        for func, args, job_id in jobs])


def burst(make_worker) -> float:
    start = time.perf_counter()
    make_worker().work(burst=True)
    return time.perf_counter() - start


def measure(conn, make_worker, fill, jobs: int) -> tuple[float, float]:
    """(seconds, commands per job) of a burst over `jobs` jobs, less those of a burst over an empty queue
    (start-up, maintenance and teardown)."""
    burst(make_worker)
    before = commands(conn)
    fixed = burst(make_worker)
    fixed_cmds = commands(conn) - before
    fill()
    before = commands(conn)
    seconds = burst(make_worker) - fixed
    return seconds, (commands(conn) - before - fixed_cmds) / jobs


def commands(conn) -> int:
    return sum(stats["calls"] for stats in conn.info("commandstats").values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=4000, help="jobs for BatchWorker")
    parser.add_argument("--simple-jobs", type=int, default=1000, help="jobs for SimpleWorker (it is slow)")
    parser.add_argument("--max-jobs", type=int, default=64, help="BatchWorker's jobs per dequeue round")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    with RedisServer() as server:
        conn = redis.Redis.from_url(server.url)
        queue = Queue(queue_name("noop"), connection=conn, serializer=MsgpackSerializer)
        requests = [EmbedRequest(model="noop", inputs=["x"]) for _ in range(args.jobs)]
        engine = Engine(NullModel("null:4", "noop"), max_batch_tokens=1 << 20, max_batch_size=4096)
        batch_s, batch_cmds = measure(
            conn, lambda: build_worker(given_settings(max_jobs=args.max_jobs), engine, conn),
            lambda: enqueue_all(queue, [(JOB_FUNC, (r.encode(),), r.id) for r in requests]), args.jobs)

        simple_queue = Queue("noop-simple", connection=conn, serializer=MsgpackSerializer)
        simple_s, simple_cmds = measure(
            conn, lambda: PromptSimpleWorker([simple_queue], connection=conn, serializer=MsgpackSerializer),
            lambda: enqueue_all(simple_queue, [(noop, (b"x",), None) for _ in range(args.simple_jobs)]),
            args.simple_jobs)

    batch_rate, simple_rate = args.jobs / batch_s, args.simple_jobs / simple_s
    print(f"BatchWorker  (max_jobs={args.max_jobs}): {args.jobs:6d} jobs in {batch_s:6.2f} s = "
          f"{batch_rate:8.0f} jobs/s, {batch_cmds:5.1f} Redis commands/job")
    print(f"SimpleWorker (no-op jobs):   {args.simple_jobs:6d} jobs in {simple_s:6.2f} s = "
          f"{simple_rate:8.0f} jobs/s, {simple_cmds:5.1f} Redis commands/job")
    print(f"ratio: BatchWorker serves {batch_rate / simple_rate:.1f}x the jobs/s with "
          f"{simple_cmds / batch_cmds:.1f}x fewer commands per job")


if __name__ == "__main__":
    main()
