"""One model over 1, 2 and 3 redis-servers (its partitions, common/shards.py) at the same offered load, side by
side in one run: each Redis's main-thread CPU per second and per request, relative to one Redis alone, and
requests/s (issue 39).

    PYTHONPATH=. .venv/bin/python bench/partitions.py [--rate 400] [--seconds 10] [--partitions 1,2,3]
        [--texts 1,64] [--json OUT]

Per row: fresh redis-servers, one `embedfleet worker --model null:384` given the map `null=URL1,...` (it starts an
engine per partition: the null model, no compute, so the queue path is all there is), and an AsyncProducer that
offers --rate requests/s for --seconds (open loop: a request is sent on its schedule whether or not the earlier
ones are answered), each embed() of --texts short texts (a table per size: 1 text, where per-round costs weigh
most, and 64, where per-request costs do), then waits for every answer. Each Redis is read with
INFO cpu (used_cpu_user_main_thread + used_cpu_sys_main_thread) and INFO commandstats before and after, as
bench/capacity.py does. Targets: over 2 Redis each <= 0.6x the CPU per second of one Redis alone, over 3 each
<= 0.4x, every request answered. The box's load (`uptime`) is printed with the figures: CPU time is what counts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from contextlib import ExitStack
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import Process, RedisServer, describe_machine, table

from embedfleet import AsyncProducer
from embedfleet.common.protocol import keys

NAME, MODEL = "null", "null:384"
TARGETS = {2: 0.6, 3: 0.4}  # issue 39: each Redis's CPU per second, x one Redis alone


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=400.0, help="requests offered per second")
    parser.add_argument("--seconds", type=float, default=10.0, help="how long the load is offered")
    parser.add_argument("--partitions", default="1,2,3", help="row per partition count")
    parser.add_argument("--texts", default="1,64", help="texts per request, a table per value")
    parser.add_argument("--json", type=Path, help="write the rows here too")
    args = parser.parse_args()
    counts = [int(c) for c in args.partitions.split(",")]
    print(describe_machine())
    found = {}
    for texts in [int(t) for t in args.texts.split(",")]:
        rows = {count: run_row(count, args, texts) for count in counts}
        print(f"load: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f} (uptime 1/5/15)")
        print(table(HEADERS, _lines(rows, counts), f"one model over N Redis, {texts}-text requests at {args.rate:g} "
                                                    f"requests/s offered for {args.seconds:g} s"))
        found[texts] = rows
    if args.json:
        args.json.write_text(json.dumps({"rows": found, "load": os.getloadavg()}, indent=1))


HEADERS = ["Redis", "#", "requests", "main-thread CPU ms/s", "x one Redis", "target", "CPU us/req", "commands/req",
           "answered", "req/s"]


def _lines(rows: dict, counts: list[int]) -> list[list]:
    base = rows[counts[0]]["per_redis"][0]["cpu_per_s"] if counts[0] == 1 else float("nan")
    out = []
    for count, row in rows.items():
        for index, redis_row in enumerate(row["per_redis"]):
            relative = redis_row["cpu_per_s"] / base if base else float("nan")
            target = TARGETS.get(count)
            out.append([count, index + 1, f"{redis_row['requests']}", f"{redis_row['cpu_per_s'] * 1e3:.1f}",
                        f"{relative:.2f}x", f"<= {target}x {'met' if relative <= target else 'MISSED'}" if target
                        else "-", f"{redis_row['cpu_us_per_request']:.0f}", f"{redis_row['commands_per_request']:.1f}",
                        f"{row['answered']}/{row['sent']}", f"{row['requests_per_s']:.0f}"])
    return out


def run_row(count: int, args, texts: int) -> dict:
    with ExitStack() as stack:
        servers = [stack.enter_context(RedisServer()) for _ in range(count)]
        urls = [s.url for s in servers]
        worker = stack.enter_context(Process([sys.executable, "-m", "embedfleet.worker", "--redis-url", urls[0],
                                               "--redis-shards", f"{NAME}={','.join(urls)}", "--model", MODEL,
                                               "--served-model-name", NAME, "--no-log-rounds"], f"worker-{count}"))
        clients = [redis.Redis.from_url(u) for u in urls]
        _wait_served(worker, clients)
        sent, answered, seconds, spent = asyncio.run(_offer(urls, args, texts, clients))
        for client in clients:
            client.close()
    per_redis = [{"requests": requests, "cpu_per_s": cpu / seconds, "cpu_us_per_request": cpu * 1e6 / max(requests, 1),
                  "commands_per_request": commands / max(requests, 1)} for cpu, commands, requests in spent]
    return {"sent": sent, "answered": answered, "requests_per_s": answered / seconds, "per_redis": per_redis}


def _wait_served(worker: Process, clients: list, timeout: float = 300.0) -> None:
    """Until every partition has its engine's advert."""
    deadline = time.monotonic() + timeout
    while not all(c.zcard(keys.model_workers_key(NAME)) for c in clients):
        if not worker.alive():
            raise worker.fail(f"exited with {worker.popen.returncode} during start-up")
        if time.monotonic() > deadline:
            raise worker.fail(f"not every partition was served within {timeout:g} s")
        time.sleep(0.1)


def _results(clients: list) -> list[int]:
    """Result keys on each Redis: the requests placed there, once answered."""
    return [sum(1 for _ in c.scan_iter(keys.result_key("*"), count=1000)) for c in clients]


def _reading(client) -> tuple[float, int]:
    info = client.info("cpu", "commandstats")
    calls = sum(v["calls"] for k, v in info.items() if k.startswith("cmdstat_") and k != "cmdstat_info")
    return info["used_cpu_user_main_thread"] + info["used_cpu_sys_main_thread"], calls


async def _offer(urls: list[str], args, size: int, clients: list
                 ) -> tuple[int, int, float, list[tuple[float, int, int]]]:
    """(sent, answered, seconds, per Redis (CPU seconds, commands, requests placed there)) of one open-loop run."""
    texts = [f"text number {i}" for i in range(size)]
    async with AsyncProducer(urls[0], shards={NAME: urls}) as producer:
        await producer.embed(texts, NAME)  # warm: adverts read, scripts loaded
        before, results_before = [_reading(c) for c in clients], _results(clients)
        tasks, began = [], time.perf_counter()
        total = int(args.rate * args.seconds)
        for i in range(total):
            delay = began + i / args.rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.ensure_future(producer.embed(texts, NAME, timeout=120)))
        done = await asyncio.gather(*tasks, return_exceptions=True)
        seconds = time.perf_counter() - began
        after = [_reading(c) for c in clients]
    placed = [a - b for a, b in zip(_results(clients), results_before)]
    answered = sum(1 for d in done if not isinstance(d, BaseException))
    return total, answered, seconds, [(a[0] - b[0], a[1] - b[1], n) for a, b, n in zip(after, before, placed)]


if __name__ == "__main__":
    main()
