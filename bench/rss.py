"""Worker memory with a deep queue: its RSS idle vs its peak RSS while 100,000 requests are queued and it works.

    PYTHONPATH=. .venv/bin/python bench/rss.py [--requests 100000] [--seconds 30] [--model null:384] [--json OUT]

A private redis-server and one `python -m embedfleet.worker` (default: the bundled all-MiniLM-L6-v2; `--model null:384`
for the queue path alone). Idle RSS: sampled from /proc for 2 s after the worker advertises. Then --requests
one-short-text requests are enqueued (Producer.submit_many, 5,000 per round trip) and the worker's RSS is
sampled every 0.1 s while they are enqueued and for --seconds after; the run stops there, queue not drained.
A worker that prefetches only what its next batches need keeps the peak near the idle figure.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (RedisServer, Timer, describe_machine, load_corpus, model_path, ratio, rss_mib,
                     short_texts, start_worker, table)

SERVED = "bench"


class Sampler:
    """RSS of one process every `interval` seconds, in a thread, until stopped."""

    def __init__(self, pid: int, interval: float = 0.1):
        self.pid, self.interval, self.samples = pid, interval, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.samples.append(rss_mib(self.pid))
            except FileNotFoundError:
                return
            self._stop.wait(self.interval)

    def stop(self) -> list[float]:
        self._stop.set()
        self._thread.join()
        return self.samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=100_000, help="requests enqueued")
    parser.add_argument("--seconds", type=float, default=30, help="sampling time after the enqueue")
    parser.add_argument("--model", default=None, help="worker --model (default: the bundled all-MiniLM-L6-v2)")
    parser.add_argument("--corpus", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()

    from embedfleet.common.protocol.keys import queue_name
    from embedfleet import Producer

    texts = short_texts(load_corpus(args.corpus))
    model = args.model or model_path()
    print(f"{describe_machine()}; worker --model {model}", flush=True)
    with RedisServer() as server, start_worker(server.url, model, SERVED) as worker, \
            Producer(server.url) as producer:
        conn = redis.Redis.from_url(server.url)
        queue_key = f"rq:queue:{queue_name(SERVED)}"
        sampler = Sampler(worker.pid)
        time.sleep(2)
        idle = sampler.stop()
        sampler, depths = Sampler(worker.pid), []
        with Timer() as enqueue:
            for start in range(0, args.requests, 5000):
                batch = [[texts[i % len(texts)]] for i in range(start, min(start + 5000, args.requests))]
                producer.submit_many(batch, SERVED)
                depths.append(conn.llen(queue_key))
                if not worker.alive():
                    raise worker.fail("exited while requests were enqueued")
        print(f"  enqueued {args.requests} requests in {enqueue.seconds:.1f} s", flush=True)
        deadline = time.monotonic() + args.seconds
        while time.monotonic() < deadline:
            depths.append(conn.llen(queue_key))
            if not worker.alive():
                raise worker.fail("exited while serving a deep queue")
            time.sleep(0.5)
        busy = sampler.stop()
        end_depth = conn.llen(queue_key)
        redis_mib = conn.info("memory")["used_memory"] / 2**20
        conn.close()

    served = args.requests - end_depth
    rows = [["worker idle (2 s after start)", max(idle), "-", "-"],
            [f"worker, {args.requests:,} requests queued, {args.seconds:g} s of work", max(busy), max(depths),
             served]]
    print(table(["state", "RSS MiB (max)", "queue depth (max)", "requests taken"], rows,
                f"Worker RSS with a deep queue (peak / idle = {ratio(max(busy), max(idle)):.2f}x; "
                f"Redis used {redis_mib:.0f} MiB)"))
    if args.json:
        args.json.write_text(json.dumps({"idle_mib": max(idle), "peak_mib": max(busy), "max_depth": max(depths),
                                         "taken": served, "redis_mib": redis_mib}, indent=1))


if __name__ == "__main__":
    main()
