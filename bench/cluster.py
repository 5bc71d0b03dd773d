"""Redis Cluster against one Redis, side by side in one run (issue 39): the same load of three models (each with
its own `worker --model null:384` process, each model's requests sent by one AsyncProducer, --in-flight at a
time) on one plain redis-server, then on a local cluster of three masters (tests/rediscluster.py) where the
three model names are chosen so that their hash tags lie on three masters. Per Redis: its main-thread CPU
(INFO cpu: used_cpu_user_main_thread + used_cpu_sys_main_thread) and commands (INFO commandstats, a script's
own commands included) over the timed requests, and that CPU as a share of what the one Redis spent.

    PYTHONPATH=. .venv/bin/python bench/cluster.py [--requests 3000] [--in-flight 256]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

import redis
from _common import Process, RedisServer, describe_machine, ratio, table

from common.protocol import keys
from common.redisclient import connect
from producer import AsyncProducer
from tests.rediscluster import LocalCluster


def names_on_masters(url: str, count: int = 3) -> list[str]:
    """`count` model names whose hash tags lie on `count` distinct masters of the cluster at `url`."""
    client, chosen = connect(url), {}
    for index in range(1000):
        chosen.setdefault(client.get_node_from_key(keys.slot_tag(f"bench{index}")).name, f"bench{index}")
        if len(chosen) == count:
            break
    client.close()
    return list(chosen.values())


def usage(ports: list[int]) -> dict[int, tuple[float, int]]:
    """Per Redis: (main-thread CPU seconds, commands run so far)."""
    found = {}
    for port in ports:
        with redis.Redis(port=port) as client:
            cpu = client.info("cpu")
            stats = client.info("commandstats")
        found[port] = (cpu["used_cpu_user_main_thread"] + cpu["used_cpu_sys_main_thread"],
                       sum(s["calls"] for s in stats.values()))
    return found


def start_workers(url: str, models: list[str]) -> list[Process]:
    workers = [Process([sys.executable, "-m", "worker", "--redis-url", url, "--model", "null:384",
                        "--served-model-name", model], f"worker-{model}") for model in models]
    client, deadline = connect(url), time.monotonic() + 300
    try:
        while not all(client.exists(keys.model_key(model)) for model in models):
            for worker in workers:
                if not worker.alive():
                    raise worker.fail(f"exited with {worker.popen.returncode} during start-up")
            if time.monotonic() > deadline:
                raise RuntimeError("the workers did not advertise within 300 s")
            time.sleep(0.1)
    finally:
        client.close()
    return workers


async def load(url: str, models: list[str], requests: int, in_flight: int) -> float:
    """Seconds for `requests` one-text requests per model, `in_flight` at a time per model."""
    async def one_model(producer: AsyncProducer, model: str) -> None:
        gate = asyncio.Semaphore(in_flight)

        async def one(index: int) -> None:
            async with gate:
                await producer.embed([f"text {index} of {model}"], model, timeout=120)

        await asyncio.gather(*(one(i) for i in range(requests)))

    async with AsyncProducer(url) as producer:
        await asyncio.gather(*(producer.embed(["warm-up"], model) for model in models))
        began = time.perf_counter()
        await asyncio.gather(*(one_model(producer, model) for model in models))
        return time.perf_counter() - began


def measure(url: str, ports: list[int], models: list[str], requests: int, in_flight: int) -> tuple[float, dict]:
    workers = start_workers(url, models)
    try:
        before = usage(ports)
        seconds = asyncio.run(load(url, models, requests, in_flight))
        after = usage(ports)
    finally:
        for worker in workers:
            worker.stop()
    return seconds, {port: (after[port][0] - before[port][0], after[port][1] - before[port][1]) for port in ports}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000, help="one-text requests per model")
    parser.add_argument("--in-flight", type=int, default=256, help="requests in flight per model")
    args = parser.parse_args()
    print(describe_machine())
    with tempfile.TemporaryDirectory() as folder, LocalCluster(Path(folder) / "cluster", masters=3) as cluster, \
            RedisServer(Path(folder) / "plain") as plain:
        models = names_on_masters(cluster.url)
        total = 3 * args.requests
        one_seconds, one = measure(plain.url, [plain.port], models, args.requests, args.in_flight)
        seconds, per_master = measure(cluster.url, cluster.master_ports(), models, args.requests, args.in_flight)
    alone = one[plain.port][0]
    rows = [["one Redis", plain.port, f"{one[plain.port][1] / total:.1f}", one[plain.port][0] * 1000,
             one[plain.port][0] / one_seconds, 1.0, total / one_seconds]]
    rows += [["cluster master", port, f"{commands / total:.1f}", cpu * 1000, cpu / seconds, ratio(cpu, alone),
              total / seconds] for port, (cpu, commands) in per_master.items()]
    print(table(["layout", "port", "commands / request (all)", "Redis CPU ms", "Redis CPU s/s", "x one Redis's CPU",
                 "requests/s (all)"], rows,
                title=f"3 models x {args.requests} one-text requests, {args.in_flight} in flight per model"))


if __name__ == "__main__":
    main()
