"""What a request costs the producer's process: CPU (user + system) a request of the sync Producer (one call at
a time) and of the AsyncProducer (--in-flight at once), one-text requests to `worker --model null:384`, which
answers without computing; with --baseline, another checkout's producer and worker measured the same way, in
alternating runs (each in a process of its own), so the machine's drift falls on both.

    PYTHONPATH=. .venv/bin/python bench/producercpu.py [--sync-requests 1500] [--requests 30000]
        [--in-flight 256] [--repeat 3] [--baseline CHECKOUT]

A gateway process is an AsyncProducer: its CPU a request bounds the requests/s one gateway process serves.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve()
SERVED = "n"


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def measure(sync_requests: int, requests: int, in_flight: int) -> dict:
    """One run in this process, on this process's checkout (sys.path): the figures as a dict."""
    from _common import RedisServer, start_worker

    from embedfleet import AsyncProducer, Producer

    with RedisServer() as server, start_worker(server.url, "null:384", SERVED):
        with Producer(server.url) as producer:
            for i in range(200):
                producer.embed(f"warm-up {i}", SERVED)
            cpu, began = cpu_seconds(), time.perf_counter()
            for i in range(sync_requests):
                producer.embed(f"one at a time {i}", SERVED)
            sync_cpu, sync_wall = cpu_seconds() - cpu, time.perf_counter() - began

        async def flight() -> tuple[float, float]:
            async with AsyncProducer(server.url) as aproducer:
                gate = asyncio.Semaphore(in_flight)

                async def one(i: int) -> None:
                    async with gate:
                        await aproducer.embed(f"in flight {i}", SERVED)

                await asyncio.gather(*(one(i) for i in range(1000)))
                cpu, began = cpu_seconds(), time.perf_counter()
                await asyncio.gather(*(one(i) for i in range(1000, 1000 + requests)))
                return cpu_seconds() - cpu, time.perf_counter() - began

        async_cpu, async_wall = asyncio.run(flight())
    return {"sync_cpu_us": sync_cpu / sync_requests * 1e6, "sync_wall_us": sync_wall / sync_requests * 1e6,
            "async_cpu_us": async_cpu / requests * 1e6, "async_per_s": requests / async_wall}


def run_in(checkout: Path, args) -> dict:
    """`measure` in a child process whose code is `checkout`'s (its producer, and its worker)."""
    code = (f"import sys, json; sys.path[:0] = [{str(checkout)!r}, {str(checkout / 'bench')!r}]; "
            f"sys.argv = ['producercpu']; import importlib.util as u; "
            f"spec = u.spec_from_file_location('producercpu', {str(HERE)!r}); m = u.module_from_spec(spec); "
            f"spec.loader.exec_module(m); "
            f"print(json.dumps(m.measure({args.sync_requests}, {args.requests}, {args.in_flight})))")
    out = subprocess.run([sys.executable, "-c", code], cwd=checkout, capture_output=True, text=True, check=False,
                         env={**os.environ, "PYTHONPATH": str(checkout)})
    if out.returncode != 0:
        raise SystemExit(f"the run in {checkout} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sync-requests", type=int, default=1500, help="one-at-a-time calls of the sync Producer")
    parser.add_argument("--requests", type=int, default=30000, help="requests of the AsyncProducer row")
    parser.add_argument("--in-flight", type=int, default=256, help="requests the AsyncProducer keeps in flight")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each checkout, alternating")
    parser.add_argument("--baseline", type=Path, default=None, help="another checkout to measure beside this one")
    args = parser.parse_args()
    sys.path.insert(0, str(HERE.parent))
    from _common import describe_machine, table

    checkouts = {"this checkout": HERE.parent.parent, **({str(args.baseline): args.baseline} if args.baseline else {})}
    print(describe_machine(), flush=True)
    runs: dict[str, list[dict]] = {name: [] for name in checkouts}
    for _ in range(args.repeat):
        for name, checkout in checkouts.items():
            runs[name].append(run_in(checkout.resolve(), args))
            print(f"  {name}: {json.dumps({k: round(v, 1) for k, v in runs[name][-1].items()})}", flush=True)
    first = next(iter(runs))
    rows = []
    for name, got in runs.items():
        median = {key: statistics.median(run[key] for run in got) for key in got[0]}
        mine = {key: statistics.median(run[key] for run in runs[first]) for key in got[0]}
        rows.append([name, f"{median['sync_cpu_us']:.0f}", f"{median['sync_wall_us']:.0f}",
                     f"{median['async_cpu_us']:.0f}", f"{median['async_per_s']:,.0f}",
                     f"{median['async_cpu_us'] / mine['async_cpu_us']:.3f}"])
    print(table(["producer", "sync CPU us/call", "sync wall us/call", "async CPU us/request", "async requests/s",
                 "async CPU x this checkout"], rows,
                f"Producer CPU, one-text requests to a null-model worker (median of {args.repeat} alternating runs)"))


if __name__ == "__main__":
    main()
