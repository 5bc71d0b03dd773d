"""Batch API lines/s by quarter of the batch: does the cost of a line grow as the batch goes on?

    PYTHONPATH=. .venv/bin/python bench/batches.py [--lines 20000,50000] [--trees /work/main,.]
        [--model null:384] [--in-flight 256] [--timeout 1800] [--json OUT] [--corpus PATH]

For each tree (a checkout: `/work/main` is "before", `.` this one) and each line count, a private
redis-server, one `python -P -m embedfleet.worker --model MODEL` and one `python -P -m embedfleet.producer.gateway`,
both run from that tree (-P: the checkout in the current directory is not put first), then one batch of N lines through
the `openai` client's files.create + batches.create (line i: a short corpus text and i, so that each is new
to the worker's vector cache and the quarters hold the same mix of lengths). The batch's request_counts
are polled every 0.25 s; each quarter's rate is its lines over the time from the first poll at or past its
start to the first poll at or past its end; "s from the last line" is the time from the last line counted
to the batch's end (writing its output files). CPU ms per line by quarter for the gateway, the worker
(/proc stat) and Redis (INFO cpu) show where a cost grows even when other jobs change the rates. The ratio
last/first quarter is what the issue targets (>= 0.7). The null model (`null:<dim>`) keeps the worker
cheap, so what is measured is the queue and the gateway's runner; `--model PATH` runs a real model.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import time
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (Process, RedisServer, add_corpus_flags, describe_machine, free_port, load_corpus, module_in,
                     short_texts, table, wait_advertised, wait_http)

SERVED = "bench"


def batch_file(texts: list[str], lines: int) -> bytes:
    out = io.BytesIO()
    for i in range(lines):
        body = {"model": SERVED, "input": f"{texts[i % len(texts)]} {i}"}  # unique: the vector cache never answers
        out.write(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/embeddings",
                              "body": body}).encode() + b"\n")
    return out.getvalue()


def run_one(tree: Path, model: str, lines: int, texts: list[str], in_flight: int, timeout: float) -> dict:
    import openai

    with RedisServer() as server:
        worker = Process([sys.executable, "-P", "-m", module_in(tree, "worker"), "--redis-url", server.url, "--model",
                          model, "--served-model-name", SERVED], "worker", pythonpath=(tree,))
        port = free_port()
        gateway = Process([sys.executable, "-P", "-m", module_in(tree, "producer.gateway"), "--redis-url", server.url,
                           "--port", str(port), "--log-level", "warning", "--max-queue-depth", "1000000",
                           "--batch-in-flight", str(in_flight), "--batch-poll-seconds", "0.2"],
                          "gateway", pythonpath=(tree,))
        with worker, gateway:
            wait_advertised(worker, server.url, SERVED)
            base = f"http://127.0.0.1:{port}"
            wait_http(gateway, base + "/health", 60, any_status=True)
            client = openai.OpenAI(base_url=base + "/v1", api_key="bench", max_retries=0, timeout=600)
            uploaded = client.files.create(file=("bench.jsonl", batch_file(texts, lines)), purpose="batch")
            batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/embeddings",
                                          completion_window="24h")
            samples: list[tuple] = []
            deadline = time.monotonic() + timeout
            stats = redis.Redis.from_url(server.url)
            while True:
                found = client.batches.retrieve(batch.id)
                done = found.request_counts.completed + found.request_counts.failed
                cpu = stats.info("cpu")
                samples.append((time.monotonic(), done, cpu_seconds(gateway.pid), cpu_seconds(worker.pid),
                                cpu["used_cpu_user"] + cpu["used_cpu_sys"]))
                if found.status in ("completed", "failed", "expired", "cancelled"):
                    break
                if time.monotonic() > deadline:
                    raise SystemExit(f"{tree}: {lines} lines not done within {timeout:g} s ({done} done)")
                time.sleep(0.25)
            ended = time.monotonic()
            stats.close()
            last_line = next(s[0] for s in samples if s[1] >= lines)
            return {"tree": str(tree), "lines": lines, "status": found.status, "done": done,
                    "quarters": quarters(samples, lines), "seconds": ended - samples[0][0],
                    "finalize": ended - last_line}


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used (/proc/<pid>/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def quarters(samples: list[tuple], lines: int) -> list[dict]:
    """Each quarter of the batch, from the polled (time, lines done, gateway / worker / Redis CPU s)
    samples: its lines/s, and the CPU milliseconds per line each process spent in it (what a busy machine
    does not skew: a cost that grows with the batch shows there, whatever the rate)."""
    def first_at(count: int) -> tuple:
        return next(s for s in samples if s[1] >= count)

    found = []
    for q in range(4):
        start, end = first_at(lines * q // 4), first_at(lines * (q + 1) // 4)
        count = max(end[1] - start[1], 1)
        found.append({"rate": count / max(end[0] - start[0], 1e-9),
                      **{name: 1000 * (end[i] - start[i]) / count
                         for i, name in ((2, "gateway"), (3, "worker"), (4, "redis"))}})
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lines", default="20000,50000")
    parser.add_argument("--trees", default="/work/main,.")
    parser.add_argument("--model", default="null:384")
    parser.add_argument("--in-flight", type=int, default=256)
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--json", type=Path)
    add_corpus_flags(parser, None)
    args = parser.parse_args()
    texts = short_texts(load_corpus(args.corpus, args.limit))
    rows, results = [], []
    for count in [int(n) for n in args.lines.split(",")]:
        for tree in [Path(t).resolve() for t in args.trees.split(",")]:
            found = run_one(tree, args.model, count, texts, args.in_flight, args.timeout)
            results.append(found)
            q = found["quarters"]
            rows.append([str(tree), count, found["status"], *[f"{r['rate']:.0f}" for r in q],
                         f"{q[3]['rate'] / q[0]['rate']:.2f}", f"{found['seconds']:.0f}", f"{found['finalize']:.1f}",
                         *[" / ".join(f"{r[name]:.2f}" for r in q) for name in ("gateway", "worker", "redis")]])
            print(rows[-1], flush=True)
    print(describe_machine())
    print(table(["tree", "lines", "status", "Q1 l/s", "Q2 l/s", "Q3 l/s", "Q4 l/s", "Q4/Q1", "s in all",
                 "s from the last line to the end (output files)", "gateway CPU ms/line Q1..Q4",
                 "worker CPU ms/line Q1..Q4", "Redis CPU ms/line Q1..Q4"], rows,
                f"Batch API lines/s by quarter, model {args.model}, --batch-in-flight {args.in_flight}"))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
