"""Redis Cluster against one Redis, side by side in one run (issue 39): the same load of three models (each with
its own `worker --model null:384` process, each model's requests sent by one AsyncProducer, --in-flight at a
time) on one plain redis-server, then on a local cluster of three masters (tests/rediscluster.py) where the
three model names are chosen so that their hash tags lie on three masters. Per Redis: its main-thread CPU
(INFO cpu: used_cpu_user_main_thread + used_cpu_sys_main_thread) and commands (INFO commandstats, a script's
own commands included) over the timed requests, and that CPU as a share of what the one Redis spent.

With --partitions N: ONE model, N partitions of it on the cluster (the partition map `URL#pA,URL#pB,...`,
common/shards.py, partition names whose hash tags lie on N distinct masters), one worker process given that
map, against the same model on one plain redis-server.

    PYTHONPATH=. .venv/bin/python bench/cluster.py [--requests 3000] [--in-flight 256] [--partitions 3]
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

from embedfleet.common.names import slot_tag
from embedfleet.common.protocol import keys
from embedfleet.common.redisclient import connect
from embedfleet import AsyncProducer
from tests.rediscluster import LocalCluster


PARTITIONED = "bench"  # --partitions: the one model's name


def names_on_masters(url: str, count: int = 3) -> list[str]:
    """`count` model names whose hash tags lie on `count` distinct masters of the cluster at `url`."""
    client, chosen = connect(url), {}
    for index in range(1000):
        chosen.setdefault(client.get_node_from_key(slot_tag(f"bench{index}")).name, f"bench{index}")
        if len(chosen) == count:
            break
    client.close()
    return list(chosen.values())


def partitions_on_masters(url: str, model: str, count: int) -> list[str]:
    """`count` partition names of `model` whose hash tags lie on `count` distinct masters (tests/fleet's pick)."""
    client, chosen = connect(url), {}
    for index in range(1000):
        chosen.setdefault(client.get_node_from_key(slot_tag(model, f"p{index}")).name, f"p{index}")
        if len(chosen) == count:
            break
    client.close()
    if len(chosen) < count:
        raise SystemExit(f"--partitions {count}: the cluster has {len(chosen)} masters")
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


def start_workers(url: str, models: list[str], shards: dict[str, list[str]] | None = None) -> list[Process]:
    """A `null:384` worker per model; `shards`: a model's partition URLs (its worker's --redis-shards)."""
    workers = [Process([sys.executable, "-m", "embedfleet.worker", "--redis-url", url, "--model", "null:384",
                        "--served-model-name", model, "--no-log-rounds",
                        *(["--redis-shards", f"{model}={','.join(shards[model])}"] if model in (shards or {}) else [])],
                       f"worker-{model}") for model in models]
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


async def load(url: str, models: list[str], requests: int, in_flight: int, shards=None) -> float:
    """Seconds for `requests` one-text requests per model, `in_flight` at a time per model."""
    async def one_model(producer: AsyncProducer, model: str) -> None:
        gate = asyncio.Semaphore(in_flight)

        async def one(index: int) -> None:
            async with gate:
                await producer.embed([f"text {index} of {model}"], model, timeout=120)

        await asyncio.gather(*(one(i) for i in range(requests)))

    async with AsyncProducer(url, shards=shards) as producer:  # warm-up: adverts read, scripts on every partition
        await asyncio.gather(*(producer.embed([f"warm-up {i}"], model, timeout=120)
                               for model in models for i in range(len((shards or {}).get(model, [""])))))
        began = time.perf_counter()
        await asyncio.gather(*(one_model(producer, model) for model in models))
        return time.perf_counter() - began


def measure(url: str, ports: list[int], models: list[str], requests: int, in_flight: int,
            shards: dict[str, list[str]] | None = None) -> tuple[float, dict]:
    workers = start_workers(url, models, shards)
    try:
        before = usage(ports)
        seconds = asyncio.run(load(url, models, requests, in_flight, shards))
        after = usage(ports)
    finally:
        for worker in workers:
            worker.stop()
    return seconds, {port: (after[port][0] - before[port][0], after[port][1] - before[port][1]) for port in ports}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000, help="one-text requests per model")
    parser.add_argument("--in-flight", type=int, default=256, help="requests in flight per model")
    parser.add_argument("--partitions", type=int, default=0,
                        help="one model with this many partitions on the cluster (as many masters), not 3 models")
    args = parser.parse_args()
    if args.partitions < 0:
        parser.error(f"--partitions must be 0 (three models) or a count of partitions, not {args.partitions}")
    print(describe_machine())
    masters = max(3, args.partitions)
    with tempfile.TemporaryDirectory() as folder, \
            LocalCluster(Path(folder) / "cluster", masters=masters) as cluster, \
            RedisServer(Path(folder) / "plain") as plain:
        if args.partitions:
            models, shards = [PARTITIONED], {PARTITIONED: [f"{cluster.url}#{name}" for name in partitions_on_masters(
                cluster.url, PARTITIONED, args.partitions)]}
            title = (f"1 model in {args.partitions} partitions on a {masters}-master cluster x {args.requests} "
                     f"one-text requests, {args.in_flight} in flight")
        else:
            models, shards = names_on_masters(cluster.url), None
            title = f"3 models x {args.requests} one-text requests, {args.in_flight} in flight per model"
        total = len(models) * args.requests
        one_seconds, one = measure(plain.url, [plain.port], models, args.requests, args.in_flight)
        seconds, per_master = measure(cluster.url, cluster.master_ports(), models, args.requests, args.in_flight,
                                      shards)
    alone = one[plain.port][0]
    rows = [["one Redis", plain.port, f"{one[plain.port][1] / total:.1f}", one[plain.port][0] * 1000,
             one[plain.port][0] / one_seconds, 1.0, total / one_seconds]]
    rows += [["cluster master", port, f"{commands / total:.1f}", cpu * 1000, cpu / seconds, ratio(cpu, alone),
              total / seconds] for port, (cpu, commands) in per_master.items()]
    print(table(["layout", "port", "commands / request (all)", "Redis CPU ms", "Redis CPU s/s", "x one Redis's CPU",
                 "requests/s (all)"], rows, title=title))


if __name__ == "__main__":
    main()
