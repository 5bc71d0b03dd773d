"""How far one Redis carries a fleet: Redis CPU and commands per request on the queue path, measured with
the null model (no compute), and the requests/s one Redis sustains before its single main thread is busy.

    PYTHONPATH=. .venv/bin/python bench/capacity.py [--requests 20000] [--requests-64 1000] [--json OUT]

Per row: the queue is filled first (the Producer's rq job format), then one `python -m worker --model
null:384` drains it; the clock runs from its first take to the last result blob. Redis's own main-thread CPU
(INFO cpu: used_cpu_user_main_thread + used_cpu_sys_main_thread) and commands (INFO stats) are read before
and after, minus this script's own polls. Redis executes commands on one thread, so

    requests/s per Redis (saturated)  = 1 / (Redis CPU seconds per request)
    planning figure                   = 70% of that (headroom for producers' waits, status, failover)

Both the producer's side (enqueue, wait) and the worker's side are in the CPU count: the producer's enqueue
happens during the fill (measured separately and added), its wait is one BLPOP or stream read per request.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common.protocol import keys  # noqa: E402
from common.redisserver import RedisServer  # noqa: E402
from common.request import EmbedRequest  # noqa: E402
from common.protocol import operations  # noqa: E402

NAME, SIZE = "null", 384
PLANNING_SHARE = 0.7


def redis_cpu(conn) -> float:
    info = conn.info("cpu")
    return info["used_cpu_user_main_thread"] + info["used_cpu_sys_main_thread"]


def redis_commands(conn) -> int:
    return conn.info("stats")["total_commands_processed"]


def fill(conn, requests: int, texts: int) -> list[str]:
    ids = []
    for start in range(0, requests, 2000):
        batch = [EmbedRequest(model=NAME, inputs=[f"text {start + i} {j}" for j in range(texts)])
                 for i in range(min(2000, requests - start))]
        operations.enqueue(conn, operations.enqueue_args(keys.queue_name(NAME), batch))  # as the Producer does
        ids += [r.id for r in batch]
    return ids


def row(requests: int, texts: int, seconds: float) -> dict:
    with RedisServer() as server:
        conn = redis.Redis.from_url(server.url)
        cpu0, cmd0 = redis_cpu(conn), redis_commands(conn)
        ids = fill(conn, requests, texts)
        enqueue_cpu, enqueue_cmds = redis_cpu(conn) - cpu0, redis_commands(conn) - cmd0 - 2
        worker = subprocess.Popen([sys.executable, "-m", "worker", "--redis-url", server.url, "--model",
                                   f"null:{SIZE}", "--served-model-name", NAME], cwd=ROOT,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            queue_key = f"rq:queue:{keys.queue_name(NAME)}"
            deadline = time.monotonic() + seconds  # a bound against a broken worker: its first take is the event
            while conn.llen(queue_key) == len(ids):
                if worker.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit("the null worker took no job; run `python -m worker --model null:384` "
                                     "by hand to see why")
                time.sleep(0.002)
            start, cpu1, cmd1 = time.perf_counter(), redis_cpu(conn), redis_commands(conn)
            polls, last = 0, keys.result_key(ids[-1])
            end_by = time.monotonic() + seconds
            while not conn.exists(last) and time.monotonic() < end_by:
                polls += 1
                time.sleep(0.005)
            elapsed = time.perf_counter() - start
            served = sum(conn.exists(keys.result_key(i)) for i in ids[-100:]) and conn.llen(queue_key) == 0
            cpu, cmds = redis_cpu(conn) - cpu1, redis_commands(conn) - cmd1 - polls - 4
        finally:
            worker.terminate()
            worker.wait()  # its drain ends with the round on the device; --drain-timeout bounds that
            conn.close()
    if not served:
        raise SystemExit(f"the queue was not drained within {seconds:g} s; pass --seconds")
    per_request = (cpu + enqueue_cpu) / requests
    return {"texts_per_request": texts, "requests": requests, "worker_requests_s": requests / elapsed,
            "worker_texts_s": requests * texts / elapsed,
            "redis_cpu_us_per_request": per_request * 1e6,
            "redis_commands_per_request": (cmds + enqueue_cmds) / requests,
            "redis_saturated_requests_s": 1 / per_request,
            "redis_planning_requests_s": PLANNING_SHARE / per_request,
            "redis_busy_share_one_worker": (cpu / elapsed)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=20000, help="1-text requests")
    parser.add_argument("--requests-64", type=int, default=1000, help="64-text requests")
    parser.add_argument("--seconds", type=float, default=120.0, help="longest drain per row")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rows = [row(args.requests, 1, args.seconds), row(args.requests_64, 64, args.seconds)]
    print("| texts/request | one null worker req/s | texts/s | Redis CPU us/request | Redis commands/request "
          "| one Redis saturates at req/s | plan for req/s (70%) | Redis busy with one worker |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['texts_per_request']} | {r['worker_requests_s']:,.0f} | {r['worker_texts_s']:,.0f} | "
              f"{r['redis_cpu_us_per_request']:.1f} | {r['redis_commands_per_request']:.1f} | "
              f"{r['redis_saturated_requests_s']:,.0f} | {r['redis_planning_requests_s']:,.0f} | "
              f"{r['redis_busy_share_one_worker']:.0%} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
