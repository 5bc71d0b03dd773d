"""A result larger than Redis's proto-max-bulk-len (issue 36, item 2): one /v1/embeddings request of 1,000 inputs
against a Redis at `proto-max-bulk-len 1mb`, and what small requests sent right behind it wait.

    PYTHONPATH=. .venv/bin/python bench/bigresult.py [--inputs 1000] [--small 5] [--before /work/main] [--json OUT]

Per checkout, a redis-server of its own (proto-max-bulk-len 1mb), a worker (all-MiniLM-L6-v2: 384 dimensions,
so 1,000 float32 rows are 1.5 MB) and a gateway, run from this checkout and, with --before TREE, from that one
(the code before the fix) in the same run. Printed: the big request's HTTP status, error code and seconds to
its answer; how many times the worker computed it (the rq job's deliveries, less the take that only failed it as
poison) and how many times its lease lapsed; the small requests' seconds (sent one after another from 0.2 s
after the big one), against the same small request alone.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, describe_machine, model_path, post_json, start_from, table, wait_advertised, wait_http

import redis

from embedfleet.common.redisserver import RedisServer, free_port

MODEL = "bench"
DELAY = 0.2  # seconds between the big request and the first small one


def job_of(connection: redis.Redis, inputs: int) -> dict[bytes, bytes]:
    """The rq job hash of the request with `inputs` inputs (its description names the count)."""
    for key in connection.scan_iter("rq:job:*"):
        fields = connection.hgetall(key)
        if f"embed {inputs} input(s)".encode() in fields.get(b"description", b""):
            return fields
    return {}


def run(tree: Path, label: str, inputs: int, small_count: int) -> list:
    with tempfile.TemporaryDirectory(prefix="bench-bigresult-") as folder:
        config = Path(folder) / "redis.conf"
        config.write_text("proto-max-bulk-len 1mb\n")
        with RedisServer(Path(folder) / "data", config_file=config) as server:
            worker = start_from(tree, "worker", ["--redis-url", server.url, "--model", model_path(),
                                                 "--served-model-name", MODEL], f"worker-{label}")
            gateway = None
            try:
                wait_advertised(worker, server.url, MODEL)
                port = free_port()
                gateway = start_from(tree, "producer.gateway", ["--redis-url", server.url, "--port", str(port),
                                                                "--log-level", "warning"], f"gateway-{label}")
                base = f"http://127.0.0.1:{port}"
                wait_http(gateway, base + "/health", 60, any_status=True)
                url = base + "/v1/embeddings"
                small = {"model": MODEL, "input": "a small request"}
                alone = min(post_json(url, small)[1] for _ in range(5))
                big = {"model": MODEL, "input": [f"text number {i} of the large request" for i in range(inputs)]}
                out: dict = {}
                thread = threading.Thread(target=lambda: out.update(big=post_json(url, big)))
                thread.start()
                time.sleep(DELAY)
                waits = [post_json(url, {**small, "input": f"a small request {k}"})[1] for k in range(small_count)]
                thread.join()
                status, seconds, answer = out["big"]
                code = (answer.get("error") or {}).get("code", "") if isinstance(answer, dict) else ""
                connection = redis.Redis.from_url(server.url)
                job = job_of(connection, inputs)
                connection.close()
                deliveries = int(job.get(b"deliveries", 0))
                computed = deliveries - 1 if code == "poison" else deliveries  # the poison take runs nothing
                return [label, status, code or "-", f"{seconds:.2f}", computed, int(job.get(b"lapses", 0)),
                        f"{statistics.median(waits):.3f}", f"{max(waits):.3f}", f"{alone:.3f}"]
            finally:
                if gateway is not None:
                    gateway.stop()
                worker.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--inputs", type=int, default=1000, help="inputs of the large request")
    parser.add_argument("--small", type=int, default=5, help="small requests sent behind it, one after another")
    parser.add_argument("--before", type=Path, default=None, help="a checkout of the code before, run first")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    print(describe_machine())
    trees = ([(args.before, "before")] if args.before else []) + [(REPO, "after")]
    rows = [run(tree, label, args.inputs, args.small) for tree, label in trees]
    headers = ["code", "status", "error", "s to its answer", "computed", "lapses", "small p50 s", "small max s",
               "small alone s"]
    print(table(headers, rows, title=f"one request of {args.inputs} inputs (1.5 MB of float32 at 1,000) on a Redis "
                                     "at proto-max-bulk-len 1mb, small requests behind it"))
    if args.json:
        args.json.write_text(json.dumps([dict(zip(headers, row)) for row in rows], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
