"""Head-of-line (issue 36, item 4): a one-text request sent 0.3 s after a request of 2,048 inputs (the gateway's
most, one round of many forward passes): how long it waits, against the same request alone, and the big
request's total.

    PYTHONPATH=. .venv/bin/python bench/headofline.py [--inputs 2048] [--delay 0.3] [--repeat 3]
        [--before /work/main] [--json OUT]

Per checkout, a redis-server of its own, a worker (all-MiniLM-L6-v2, default flags) and a gateway, run from this
checkout and, with --before TREE, from that one (the code before the fix) in the same run. The large request is
the corpus's first texts (truncated to the model's length), sent with `cache: false` so that repeats compute it
again. Printed per checkout: the small request's seconds (median and worst of the repeats), alone, and the large
request's seconds; the last column is the small request's wait over what was left of the large one when it was
sent (about 1 when it waits for the whole large request).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (REPO, add_corpus_flags, describe_machine, load_corpus, model_path, post_json, start_from, table,
                     wait_advertised, wait_http)

from embedfleet.common.redisserver import RedisServer, free_port

MODEL = "bench"


def run(tree: Path, label: str, texts: list[str], delay: float, repeat: int) -> list:
    with RedisServer() as server:
        worker = start_from(tree, "worker", ["--redis-url", server.url, "--model", model_path(),
                                             "--served-model-name", MODEL], f"worker-{label}")
        gateway = None
        try:
            wait_advertised(worker, server.url, MODEL)
            port = free_port()
            gateway = start_from(tree, "producer.gateway", ["--redis-url", server.url, "--port", str(port),
                                                            "--log-level", "warning", "--request-timeout", "600",
                                                            "--max-body-bytes", str(64 << 20)], f"gateway-{label}")
            base = f"http://127.0.0.1:{port}"
            wait_http(gateway, base + "/health", 60, any_status=True)
            url = base + "/v1/embeddings"
            small = {"model": MODEL, "input": "a one-text request", "cache": False}
            alone = min(post_json(url, small)[1] for _ in range(5))
            big = {"model": MODEL, "input": texts, "truncate_prompt_tokens": -1, "cache": False}
            post_json(url, {**big, "input": texts[:64]})  # warm: the worker has timed a round of this kind
            waits, totals = [], []
            for _ in range(repeat):
                out: dict = {}
                thread = threading.Thread(target=lambda o=out: o.update(big=post_json(url, big)))
                thread.start()
                time.sleep(delay)
                status, wait, _ = post_json(url, small)
                thread.join()
                big_status, total, _ = out["big"]
                if status != 200 or big_status != 200:
                    raise SystemExit(f"{label}: answered {status} (small) and {big_status} (large)")
                waits.append(wait)
                totals.append(total)
            wait, total = statistics.median(waits), statistics.median(totals)
            return [label, f"{wait:.3f}", f"{max(waits):.3f}", f"{alone:.3f}", f"{total:.2f}",
                    f"{wait / (total - delay):.2f}"]
        finally:
            if gateway is not None:
                gateway.stop()
            worker.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_corpus_flags(parser, None)
    parser.add_argument("--inputs", type=int, default=2048, help="inputs of the large request (the gateway's most)")
    parser.add_argument("--delay", type=float, default=0.3, help="seconds between the large and the small request")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--before", type=Path, default=None, help="a checkout of the code before, run first")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    corpus = load_corpus(args.corpus, args.limit)
    texts = [corpus[i % len(corpus)] + (f" ({i // len(corpus)})" if i >= len(corpus) else "")
             for i in range(args.inputs)]
    print(describe_machine())
    trees = ([(args.before, "before")] if args.before else []) + [(REPO, "after")]
    rows = [run(tree, label, texts, args.delay, args.repeat) for tree, label in trees]
    headers = ["code", "small p50 s", "small max s", "small alone s", "large s (p50)",
               "small wait / large's rest"]
    print(table(headers, rows, title=f"a one-text request {args.delay:g} s behind one of {args.inputs} inputs"))
    if args.json:
        args.json.write_text(json.dumps([dict(zip(headers, row)) for row in rows], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
