"""A worker on a shared CPU: beside busy loops that run for the whole window, and pinned to one core while it
sees two, before and after issue 30 (threads sized to the CPU, PASSIVE OpenMP waits, a shape floor), side by
side in one run. all-MiniLM-L6-v2 workers (real processes, real Redis), one at a time:

    quiet              nothing else of ours running
    N hogs             `--hogs` `python -c "while True: pass"` loops, started before the worker and running
                       until its row is measured (its start-up probe and every pass see them)
    taskset -c 0       the worker pinned to core 0 of the two it sees (a container's CPU limit below its
                       visible cores), with one hog on that core too

"before" runs the worker of an older tree (`--before REV`, default the commit before issue 30, extracted with
`git archive`), i.e. threads = all CPUs of the affinity, OpenMP's default spinning waits, the probe's shape
however small; "after" runs this tree's defaults.

    PYTHONPATH=. .venv/bin/python bench/shaping.py [--seconds 20] [--hogs 2] [--texts 8] [--before bb06e1a]

Per row: the seconds one request of `--request` corpus texts takes (after one warm-up request), texts/s over
`--seconds` with a feeder keeping requests of `--texts` texts queued, the shape at start and at the end, and
both as x the same tree's quiet row. Targets (issue 30): under two hogs, the request <= 3x its quiet time and
texts/s >= 0.5x quiet.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import redis

from bench._common import (REPO, Process, RedisServer, add_corpus_flags, describe_machine, load_corpus,
                           model_path, module_in, ratio, table, wait_advertised)
from embedfleet import Producer
from embedfleet.common.protocol import keys, rqkeys

NAME = "shaping"
BEFORE = "bb06e1a"  # the tree before issue 30


def hogs(count: int, prefix: list[str]) -> list[subprocess.Popen]:
    return [subprocess.Popen([*prefix, sys.executable, "-c", "while True: pass"]) for _ in range(count)]


def advert(conn) -> dict:
    from embedfleet.producer.client.core import parse_worker_info

    for key in conn.scan_iter(match=keys.worker_info_key("*")):
        info = parse_worker_info(key.decode().rsplit(":", 1)[-1], conn.get(key))
        if info:
            return info
    return {}


def shape(info: dict) -> str:
    return f"{info.get('max_batch_tokens')} tok / {info.get('max_batch_size')} rows"


def one_request(url: str, texts: list[str], timeout: float) -> float:
    """Seconds for one request of `texts` (a warm-up request first)."""
    with Producer(url) as producer:
        try:
            producer.embed(texts[:8], NAME, truncate_prompt_tokens=-1, timeout=timeout)
        except TimeoutError:
            return float("inf")
        began = time.monotonic()
        try:
            producer.embed(texts, NAME, truncate_prompt_tokens=-1, timeout=timeout)
        except TimeoutError:  # the symptom: reported as "> timeout", the row goes on
            return float("inf")
        return time.monotonic() - began


def throughput(url: str, texts: list[str], per_request: int, seconds: float) -> float:
    """texts/s answered while a feeder keeps the queue full, over `seconds`."""
    conn = redis.Redis.from_url(url)
    queue = keys.queue_name(NAME)
    stop = threading.Event()

    def feed(producer: Producer) -> None:
        sent = 0  # texts sent so far: each request takes the next `per_request` of the corpus, none repeated
        while not stop.is_set():
            if conn.llen(rqkeys.rq_queue_key(queue)) < 32:
                batch = [[texts[(sent + i * per_request + j) % len(texts)] for j in range(per_request)]
                         for i in range(16)]
                producer.submit_many(batch, NAME, truncate_prompt_tokens=-1)
                sent += 16 * per_request
            else:
                time.sleep(0.01)

    with Producer(url) as producer:
        feeder = threading.Thread(target=feed, args=(producer,), daemon=True)
        feeder.start()
        time.sleep(min(2.0, seconds / 5))  # the queue fills, a round is under way
        done, took = finished_rate(conn, rqkeys.rq_finished_key(queue), seconds)
        stop.set()
        feeder.join(10)
    conn.close()
    return done * per_request / took


def finished_rate(conn, finished: str, seconds: float) -> tuple[int, float]:
    """(requests finished, seconds) from the first round that ends in the window to the last: requests finish a
    round at a time (~32 here), so a count over a fixed window would be off by up to a round (~8% of 20 s)."""
    deadline = time.monotonic() + seconds
    first = last = None  # (when, count) of the first and the last change of the finished count seen
    count = conn.zcard(finished)
    while time.monotonic() < deadline:
        now = conn.zcard(finished)
        if now != count:
            count, seen = now, (time.monotonic(), now)
            first, last = first or seen, seen
        time.sleep(0.005)
    if first is None or last is first:
        return 0, seconds  # fewer than two rounds ended: nothing to measure between
    return last[1] - first[1], last[0] - first[0]


def has_records_flag(root: Path) -> bool:
    """Whether the worker of the tree at `root` takes --rq-records (lean records write no finished registry)."""
    config = root / "worker" / "serving" / "config.py"
    return config.exists() and "rq_records" in config.read_text()


def run_one(label: str, tree: str | None, texts: list[str], args, hog_count: int, pinned: bool) -> dict:
    prefix = ["taskset", "-c", "0"] if pinned else []
    with RedisServer() as server:
        busy = hogs(hog_count, prefix)
        try:
            # -P: the working directory (this checkout) does not come before PYTHONPATH's older tree.
            # finished_rate counts rq's finished registry: a tree with --rq-records writes it with `full` only (the
            # few commands it adds a request are nothing beside a MiniLM pass); older trees always wrote it.
            records = ["--rq-records", "full"] if has_records_flag(Path(tree) if tree else REPO) else []
            worker = Process([*prefix, sys.executable, "-P", "-m", module_in(tree and Path(tree), "worker"),
                              "--redis-url", server.url, "--model", model_path(), "--served-model-name", NAME,
                              "--no-cache", *records], f"worker-{NAME}", pythonpath=(tree,) if tree else ())
            try:
                wait_advertised(worker, server.url, NAME, timeout=600)
                conn = redis.Redis.from_url(server.url)
                start = advert(conn)
                request = one_request(server.url, texts[:args.request], args.timeout)
                rate = throughput(server.url, texts, args.texts, args.seconds)
                end = advert(conn)
                conn.close()
                threads = [line.split("engine torch, ")[1].split(")")[0] + ")" for line in worker.lines("serving model")
                           if "engine torch, " in line and "thread" in line]
            finally:
                worker.stop()
        finally:
            for hog in busy:
                hog.kill()
                hog.wait()
    row = {"start": shape(start), "end": shape(end), "request_s": request, "texts_per_s": rate,
           "threads": threads[0] if threads else "affinity's CPUs, OpenMP default waits"}
    print(f"  {label}: {json.dumps(row)}", flush=True)
    return row


def times(value: float, quiet: float) -> str:
    """value as x the quiet row's; "-" where either is unknown (a request past its timeout, nothing served)."""
    finite = all(0 < v < float("inf") for v in (value, quiet))
    return f"{ratio(value, quiet):.2f}" if finite else "-"


def before_tree(rev: str, folder: str) -> str:
    """`rev`'s common/, producer/ and worker/ extracted into `folder` (what a worker process imports)."""
    parts = ["common", "producer", "worker"]
    listed = subprocess.run(["git", "-C", str(REPO), "ls-tree", "--name-only", rev], capture_output=True, text=True,
                            check=True).stdout.split()
    parts += ["embedfleet"] if "embedfleet" in listed else []  # the package that holds the parts, since it exists
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev, *parts],
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", folder], input=archive, check=True)
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=20.0, help="texts/s window per row")
    parser.add_argument("--hogs", type=int, default=2, help="busy loops beside the loaded rows")
    parser.add_argument("--texts", type=int, default=8, help="texts per request of the texts/s window")
    parser.add_argument("--request", type=int, default=300, help="texts in the one timed request")
    parser.add_argument("--timeout", type=float, default=120.0, help="the timed request's wait, seconds")
    parser.add_argument("--before", default=BEFORE, help="the older tree's git revision; '' skips its rows")
    parser.add_argument("--json", help="write the figures here too")
    add_corpus_flags(parser, None)
    args = parser.parse_args()
    texts = load_corpus(args.corpus, args.limit)
    print(describe_machine(), flush=True)
    cases = [("quiet", 0, False), (f"{args.hogs} hogs", args.hogs, False), ("taskset -c 0, 1 hog", 1, True)]
    rows: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="bench-before-") as folder:
        trees = [("after", None)]
        if args.before:
            try:
                trees.append(("before", before_tree(args.before, folder)))
            except (subprocess.CalledProcessError, OSError) as exc:  # no git checkout (a device machine's copy)
                print(f"  no 'before' rows: cannot extract {args.before}: {exc}", flush=True)
        for case, hog_count, pinned in cases:
            for when, tree in trees:  # before and after of a case back to back: the same machine
                rows[f"{case}, {when}"] = run_one(f"{case}, {when}", tree, texts, args, hog_count, pinned)
    out = []
    for label, row in rows.items():
        quiet = rows[f"quiet, {label.rsplit(', ', 1)[1]}"]
        took = f"> {args.timeout:g}" if row["request_s"] == float("inf") else f"{row['request_s']:.1f}"
        out.append([label, row["threads"], row["start"], row["end"], took, times(row["request_s"], quiet["request_s"]),
                    f"{row['texts_per_s']:.1f}", times(row["texts_per_s"], quiet["texts_per_s"])])
    print(table(["worker", "threads", "shape at start", "shape at the end", f"{args.request}-text request s",
                 "x quiet", "texts/s", "x quiet"], out,
                f"a worker on a shared CPU ({args.seconds:g} s window, {args.texts} texts/request)"))
    if args.json:
        with open(args.json, "w") as file:
            json.dump(rows, file, indent=2)


if __name__ == "__main__":
    main()
