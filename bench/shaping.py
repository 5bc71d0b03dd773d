"""A worker started while the machine is busy, then the load ends: does its speed come back? Side by side in
one run, all-MiniLM-L6-v2 workers (real processes, real Redis), each measured alone afterwards:

    loaded, learning   started while two CPU hogs run (its start-up probe sees a busy machine), the hogs
                       stop, then `--seconds` of texts/s under a full queue (the shape keeps being learned)
    loaded, fixed      the same start, `--no-learn-shape`: the probe's guess kept for life (the old way)
    quiet              started on a quiet machine: the reference

    PYTHONPATH=. .venv/bin/python bench/shaping.py [--seconds 60] [--hogs 2] [--texts 8]

Load: requests of `--texts` corpus texts (truncated to the model's 256 tokens) kept queued by a feeder, so
the worker never waits for work; texts/s counts the texts answered in the window. Printed per worker: the
shape it started with, the shape it ends with, texts/s over the window and over its last third, and the
ratio to the quiet start (the target: >= 0.9 within 60 s after the load ends).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time

import redis

from bench._common import (RedisServer, add_corpus_flags, describe_machine, load_corpus, model_path, ratio,
                           start_worker, table)
from common.protocol import keys
from producer import Producer


def hogs(count: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


def advert(conn, worker_name_prefix: str = "") -> dict:
    from producer.client.core import parse_worker_info

    for key in conn.scan_iter(match=keys.worker_info_key("*")):
        info = parse_worker_info(key.decode().rsplit(":", 1)[-1], conn.get(key))
        if info:
            return info
    return {}


def measure(url: str, name: str, texts: list[str], per_request: int, seconds: float) -> dict:
    """texts/s answered while a feeder keeps the queue full, over `seconds` (and its last third)."""
    conn = redis.Redis.from_url(url)
    queue = keys.queue_name(name)
    stop = threading.Event()

    def feed(producer: Producer) -> None:
        k = 0
        while not stop.is_set():
            if conn.llen(keys.rq_queue_key(queue)) < 64:
                batch = [[texts[(k + j) % len(texts)] for j in range(per_request)] for k in range(k, k + 16)]
                producer.submit_many(batch, name, truncate_prompt_tokens=-1)
                k += 16
            else:
                time.sleep(0.01)

    points: list[tuple[float, int]] = []
    with Producer(url) as producer:
        start = advert(conn)
        feeder = threading.Thread(target=feed, args=(producer,), daemon=True)
        feeder.start()
        began, base = time.monotonic(), conn.zcard(keys.rq_finished_key(queue))
        while (now := time.monotonic() - began) < seconds:
            time.sleep(0.5)
            points.append((now, (conn.zcard(keys.rq_finished_key(queue)) - base) * per_request))
        stop.set()
        feeder.join(10)
        end = advert(conn)
    conn.close()
    third = [point for point in points if point[0] >= seconds * 2 / 3]
    late = (third[-1][1] - third[0][1]) / max(third[-1][0] - third[0][0], 1e-9) if len(third) > 1 else 0.0
    return {"start": f"{start.get('max_batch_tokens')} tok / {start.get('max_batch_size')} rows",
            "end": f"{end.get('max_batch_tokens')} tok / {end.get('max_batch_size')} rows",
            "texts_per_s": points[-1][1] / points[-1][0] if points else 0.0, "late_texts_per_s": late}


def run_one(label: str, texts: list[str], args, loaded: bool, learn: bool) -> dict:
    with RedisServer() as server:
        busy = hogs(args.hogs) if loaded else []
        try:
            extra = [] if learn else ["--no-learn-shape"]
            worker = start_worker(server.url, model_path(), "shaping", "--no-cache", *extra)
        finally:
            for hog in busy:
                hog.kill()
                hog.wait()
        try:
            print(f"  {label}: started", flush=True)
            return measure(server.url, "shaping", texts, args.texts, args.seconds)
        finally:
            worker.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=60.0, help="measured window after the load ends")
    parser.add_argument("--hogs", type=int, default=2, help="busy processes while the loaded workers start")
    parser.add_argument("--texts", type=int, default=8, help="texts per request")
    parser.add_argument("--json", help="write the figures here too")
    add_corpus_flags(parser, None)
    args = parser.parse_args()
    texts = load_corpus(args.corpus, args.limit)
    print(describe_machine(), flush=True)
    rows = {}
    for label, loaded, learn in (("quiet", False, True), ("loaded, learning", True, True),
                                 ("loaded, fixed (--no-learn-shape)", True, False)):
        rows[label] = run_one(label, texts, args, loaded, learn)
    quiet = rows["quiet"]["texts_per_s"]
    print(table(["worker", "shape at start", "shape at the end", "texts/s", "last third", "x quiet"],
                [[label, r["start"], r["end"], f"{r['texts_per_s']:.1f}", f"{r['late_texts_per_s']:.1f}",
                  f"{ratio(r['texts_per_s'], quiet):.2f}"] for label, r in rows.items()],
                f"worker speed after a loaded start ({args.seconds:g} s window, {args.texts} texts/request)"))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(rows, out, indent=2)


if __name__ == "__main__":
    main()
