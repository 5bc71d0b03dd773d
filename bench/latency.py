"""Latency of one short text, side by side in one run: the bare forward pass in this process vs embedfleet end to
end on an idle fleet, then under open-loop Poisson load at fractions of the fleet's measured maximum; draws
throughput and latency against offered load to a PNG.

    PYTHONPATH=. .venv/bin/python bench/latency.py [--idle-requests 200] [--block 25] [--seconds 10]
        [--fractions 0.25,0.5,0.75,0.9,1.0] [--dtype float32] [--plot bench/load.png] [--json OUT]

Requests carry one short corpus text (10-60 characters), each a text no earlier request of the run sent (the
worker's vector cache would answer a repeat without computing: a saturation burst of repeats once read 734
requests/s on a machine that computes ~170/s); past the corpus, texts come round again with a number after them
(one token more). Idle: sequential Producer.embed calls. Maximum: a burst
of --burst requests submitted at once and awaited (requests/s). Load: for --seconds, arrivals at exponential
gaps at fraction x maximum, each submitted by an AsyncProducer at its scheduled time whatever the backlog (open
loop); latency counts from the scheduled arrival to the result. Bare forward pass: tokenise, forward, mean-pool,
normalise one text with transformers, as often as --idle-requests: back to back (the target's reference), and
again each after --bare-gap ms idle, as an idle fleet's pass comes (its threads asleep, its caches cold: on a
2-core VM one such pass took 8-10 ms against 5-6 back to back). The client shares the machine with the fleet.

The idle fleet and the two bare rows are measured side by side: in turns of --block requests (bare back to
back, bare after gaps, the fleet), SETTLE seconds apart (libgomp's threads in this process spin a few ms after
a pass: they stop before the fleet's turn). A VM's speed drifts within a minute (one short text's pass read 9 ms
and 14 ms two runs apart, steal 0%): rows measured one after the other compare two machines.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (RedisServer, Timer, describe_machine, load_corpus, model_path, percentile,
                     short_texts, start_worker, table)

SERVED = "bench"


SETTLE = 0.05  # seconds between two turns of the side-by-side idle rows


def bare_latencies(bare, texts: list[str], start: int, n: int, gap: float = 0.0) -> list[float]:
    """Seconds of each of `n` one-text passes of the bare loop, back to back, or each after `gap` seconds idle."""
    out = []
    for i in range(start, start + n):
        if gap:
            time.sleep(gap)
        out.append(1 / bare.run([texts[i % len(texts)]], 1))
    return out


def side_by_side(bare, texts: list[str], producer, unsent: Unsent, n: int, gap: float,
                 block: int) -> tuple[list[float], list[float], list[float]]:
    """(bare back to back, bare each after `gap` s idle, the idle fleet): `n` seconds each, measured in turns of
    `block`, so that the machine's drift falls on every row alike."""
    for text in texts[:5]:
        bare.run([text], 1)
    idle_latencies(producer, unsent, 0)  # the fleet's warm-up
    back_to_back: list[float] = []
    after_gap: list[float] = []
    fleet: list[float] = []
    for start in range(0, n, block):
        size = min(block, n - start)
        time.sleep(SETTLE)
        back_to_back += bare_latencies(bare, texts, start, size)
        time.sleep(SETTLE)
        after_gap += bare_latencies(bare, texts, start, size, gap)
        time.sleep(SETTLE)
        fleet += idle_latencies(producer, unsent, size, warm_up=0)
    return back_to_back, after_gap, fleet


class Unsent:
    """The corpus's short texts in order, each handed out once; past the end, round again with " <lap>" after
    each, so that no request repeats an earlier one (a repeat is a cache hit)."""

    def __init__(self, texts: list[str]):
        self.texts, self.next = texts, 0

    def take(self, n: int) -> list[str]:
        out = []
        for _ in range(n):
            lap, index = divmod(self.next, len(self.texts))
            out.append(self.texts[index] if lap == 0 else f"{self.texts[index]} {lap}")
            self.next += 1
        return out


def idle_latencies(producer, texts: Unsent, n: int, warm_up: int = 5) -> list[float]:
    """Seconds of each of `n` sequential one-text requests, after `warm_up` more."""
    for text in texts.take(warm_up):
        producer.embed(text, SERVED, timeout=120)
    out = []
    for text in texts.take(n):
        with Timer() as timer:
            producer.embed(text, SERVED, timeout=120)
        out.append(timer.seconds)
    return out


def saturated_rate(producer, texts: Unsent, n: int) -> float:
    """Requests/s with `n` one-text requests submitted at once, then awaited."""
    batch = [[text] for text in texts.take(n)]
    with Timer() as timer:
        ids = producer.submit_many(batch, SERVED)
        for request_id in ids:
            producer.wait(request_id, timeout=600)
    return n / timer.seconds


async def open_loop(redis_url: str, unsent: Unsent, rate: float, seconds: float, seed: int) -> dict:
    """Poisson arrivals at `rate`/s for `seconds`; latency from each scheduled arrival to its result."""
    from embedfleet import AsyncProducer

    rng = random.Random(seed)
    arrivals, t = [], rng.expovariate(rate)
    while t < seconds:
        arrivals.append(t)
        t += rng.expovariate(rate)
    texts = unsent.take(len(arrivals) + 1)
    latencies: list[float] = []
    done_at: list[float] = []
    async with AsyncProducer(redis_url) as producer:
        await producer.embed(texts[-1], SERVED, timeout=120)  # connections, reply listener
        loop = asyncio.get_running_loop()
        origin = loop.time() + 0.05

        async def one(index: int, at: float) -> None:
            await asyncio.sleep(max(0.0, origin + at - loop.time()))
            await producer.embed(texts[index], SERVED, timeout=600)
            now = loop.time()
            latencies.append(now - (origin + at))
            done_at.append(now - origin)

        await asyncio.gather(*(one(i, at) for i, at in enumerate(arrivals)))
    span = max(done_at, default=seconds)
    return {"offered_s": len(arrivals) / seconds, "achieved_s": len(done_at) / span, "requests": len(arrivals),
            "p50_ms": percentile(latencies, 50) * 1000, "p99_ms": percentile(latencies, 99) * 1000}


def plot(points: list[dict], idle: dict, maximum: float, out: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    offered = [p["offered_s"] for p in points]
    fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(7, 7))
    top.plot(offered, [p["achieved_s"] for p in points], "o-", label="achieved")
    top.plot([0, max(offered, default=1)], [0, max(offered, default=1)], ":", color="grey", label="offered = achieved")
    top.axhline(maximum, ls="--", color="red", label=f"saturated burst {maximum:.0f}/s")
    top.set_ylabel("requests/s")
    top.legend()
    top.set_title(title)
    bottom.plot([0, *offered], [idle["p50_ms"], *(p["p50_ms"] for p in points)], "o-", label="p50")
    bottom.plot([0, *offered], [idle["p99_ms"], *(p["p99_ms"] for p in points)], "s-", label="p99")
    bottom.set_yscale("log")
    bottom.set_xlabel("offered load, one-short-text requests/s (0 = idle, sequential)")
    bottom.set_ylabel("latency, ms")
    bottom.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, default=None)
    parser.add_argument("--idle-requests", type=int, default=200, help="sequential requests (and bare passes)")
    parser.add_argument("--bare-gap", type=float, default=10.0,
                        help="ms idle before each pass of the second bare row (an idle fleet's forward pass comes "
                             "after the queue path's gap, its threads asleep; libgomp spins ~7 ms, then sleeps)")
    parser.add_argument("--block", type=int, default=25,
                        help="requests a turn of the side-by-side idle rows (bare, bare after gaps, the fleet)")
    parser.add_argument("--burst", type=int, default=1000, help="requests of the saturation burst")
    parser.add_argument("--seconds", type=float, default=10, help="length of each open-loop run")
    parser.add_argument("--fractions", default="0.25,0.5,0.75,0.9,1.0", help="offered load / measured maximum")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    parser.add_argument("--device", default=None, help="cpu, cuda (default: cuda when present, else cpu)")
    parser.add_argument("--model", default=None, help="worker --model (default: the bundled all-MiniLM-L6-v2)")
    parser.add_argument("--plot", type=Path, default=Path(__file__).resolve().parent / "load.png")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()

    import torch
    from transformers.utils import logging as hf_logging

    from embedfleet import Producer

    hf_logging.disable_progress_bar()
    torch.set_num_threads(os.cpu_count() or 1)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    texts = short_texts(load_corpus(args.corpus))
    path = model_path()
    print(f"{describe_machine()}; device {device}, {args.dtype}; {len(texts)} short texts", flush=True)

    from throughput import BareLoop

    bare_loop = BareLoop(path, args.dtype, device)
    points = []
    with RedisServer() as server, \
            start_worker(server.url, args.model or path, SERVED, "--dtype", args.dtype, "--device", device), \
            Producer(server.url) as producer:
        unsent = Unsent(texts)
        bare, gapped, idle = side_by_side(bare_loop, texts, producer, unsent, args.idle_requests,
                                          args.bare_gap / 1000, args.block)
        bare_row, gapped_row, idle_row = ({"p50_ms": percentile(row, 50) * 1000, "p99_ms": percentile(row, 99) * 1000}
                                          for row in (bare, gapped, idle))
        print(f"  bare forward pass: p50 {bare_row['p50_ms']:.1f} ms; after {args.bare_gap:g} ms idle: p50 "
              f"{gapped_row['p50_ms']:.1f} ms; idle fleet: p50 {idle_row['p50_ms']:.1f} ms (in turns of "
              f"{args.block})", flush=True)
        maximum = saturated_rate(producer, unsent, args.burst)
        print(f"  saturated: {maximum:.0f} requests/s", flush=True)
        for i, fraction in enumerate(float(f) for f in args.fractions.split(",")):
            point = asyncio.run(open_loop(server.url, unsent, fraction * maximum, args.seconds, seed=i))
            points.append({"fraction": fraction, **point})
            print(f"  {fraction:.0%} load: offered {point['offered_s']:.0f}/s, p50 {point['p50_ms']:.1f} ms, "
                  f"p99 {point['p99_ms']:.1f} ms", flush=True)

    rows = [["bare forward pass (in process)", "-", "-", bare_row["p50_ms"], bare_row["p99_ms"]],
            [f"bare forward pass, each after {args.bare_gap:g} ms idle", "-", "-", gapped_row["p50_ms"],
             gapped_row["p99_ms"]],
            ["embedfleet, idle (sequential)", "-", "-", idle_row["p50_ms"], idle_row["p99_ms"]]]
    rows += [[f"embedfleet, {p['fraction']:.0%} of saturated", p["offered_s"], p["achieved_s"], p["p50_ms"],
              p["p99_ms"]] for p in points]
    print(table(["path", "offered req/s", "achieved req/s", "p50 ms", "p99 ms"], rows,
                f"Latency of one short text, {device} {args.dtype}; saturated = {maximum:.0f} requests/s "
                f"(target: idle p50 <= bare p50 + 5 ms; now +{idle_row['p50_ms'] - bare_row['p50_ms']:.1f} ms; "
                f"+{idle_row['p50_ms'] - gapped_row['p50_ms']:.1f} ms over the bare pass after {args.bare_gap:g} ms "
                "idle)"))
    if args.json:
        args.json.write_text(json.dumps({"bare": bare_row, "bare_after_gap": gapped_row, "idle": idle_row,
                                         "saturated_s": maximum, "load": points}, indent=1))
    try:
        plot(points, idle_row, maximum, args.plot, f"embedfleet, one short text per request, {device} {args.dtype}")
        print(f"\nplot: {args.plot}")
    except ImportError:  # matplotlib is a bench-only extra
        print("\nno plot: matplotlib is not installed (pip install matplotlib)")


if __name__ == "__main__":
    main()
