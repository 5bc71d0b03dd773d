"""Huge single inputs (issue 32): what a 7 MB text costs before and after bounding it before the tokenizer, side by
side in one run.

    PYTHONPATH=. .venv/bin/python bench/hugeinputs.py [--mb 7] [--before /work/main] [--json OUT]

Part 1, in this process (all-MiniLM-L6-v2, max length 256): the worker's preprocess of one request, "before" as
the worker did it (the whole text tokenised, then judged: worker/engine/preprocess.prepare and the tokenize task
alone) and "after" (worker/engine/inputbounds.bound_inputs first). Seconds, and the growth of peak resident
memory (VmHWM, reset before each case through /proc/self/clear_refs).
Part 2, end to end: a real gateway and worker (subprocesses) on a real Redis; the huge body POSTed while a small
request is sent 0.2 s later; the small request's latency against the same request alone, and the worker's peak
resident memory growth. With --before TREE, the same against a gateway and worker run from another checkout
(the code before this change) in the same run.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, describe_machine, model_path, post_json, start_from, table, wait_advertised, wait_http

from embedfleet.common.redisserver import RedisServer, free_port
from embedfleet.common.request import EmbedRequest
from embedfleet.worker.engine.inputbounds import bound_inputs
from embedfleet.worker.engine.models.loader import load_model
from embedfleet.worker.engine.preprocess import prepare
from embedfleet.worker.engine.tasks.inputs import prepare_task


def peak_mib(pid: str | int = "self") -> float:
    return int(re.search(r"VmHWM:\s+(\d+)", Path(f"/proc/{pid}/status").read_text()).group(1)) / 1024


def reset_peak(pid: str | int = "self") -> None:
    Path(f"/proc/{pid}/clear_refs").write_text("5")


def worker_side(model, mb: float) -> list[list]:
    huge = "word " * int(mb * 200_000)
    cases = [("refused (no truncation)", {}), ("truncate_prompt_tokens=-1", {"truncate_prompt_tokens": -1}),
             ("/tokenize", {"task": "tokenize"})]
    rows = []
    for name, params in cases:
        request = EmbedRequest(model="bench", inputs=[huge], params=params)
        for variant in ("before", "after"):
            reset_peak()
            base = peak_mib()
            began = time.perf_counter()
            try:
                resolved = bound_inputs(model, request) if variant == "after" else request
                out = prepare_task(model, resolved) if params.get("task") else prepare(model, resolved)
                answer = f"{sum(len(i['ids']) for i in out.items):,} token ids" if params.get("task") else \
                    f"{out.prompt_tokens} tokens"
            except Exception as exc:  # noqa: BLE001 - the refusal is the answer measured
                answer = f"{type(exc).__name__}"
            rows.append([name, variant, f"{len(huge) / 1e6:.1f} MB", f"{time.perf_counter() - began:.3f}",
                         f"{peak_mib() - base:.0f}", answer])
    return rows


def post(url: str, body: dict, timeout: float = 600) -> tuple[int, float]:
    status, seconds, _ = post_json(url, body, timeout)
    return status, seconds


def end_to_end(tree: Path, label: str, mb: float, redis_url: str) -> list[list]:
    worker = start_from(tree, "worker", ["--redis-url", redis_url, "--model", model_path(), "--served-model-name",
                                    "bench"], f"worker-{label}")
    wait_advertised(worker, redis_url, "bench")
    port = free_port()
    gateway = start_from(tree, "producer.gateway", ["--redis-url", redis_url, "--port", str(port), "--log-level",
                                                    "warning", "--max-body-bytes", str(int(mb * 2e6))],
                         f"gateway-{label}")
    base = f"http://127.0.0.1:{port}"
    wait_http(gateway, base + "/health", 60, any_status=True)
    huge = "word " * int(mb * 200_000)
    small = {"model": "bench", "input": "a small request"}
    rows = []
    try:
        alone = min(post(base + "/v1/embeddings", small)[1] for _ in range(5))
        for name, path, body in [("refused (no truncation)", "/v1/embeddings", {"model": "bench", "input": huge}),
                                 ("truncate_prompt_tokens=-1", "/v1/embeddings",
                                  {"model": "bench", "input": huge, "truncate_prompt_tokens": -1}),
                                 ("/tokenize", "/tokenize", {"model": "bench", "prompt": huge})]:
            reset_peak(worker.pid)
            before = peak_mib(worker.pid)
            out = {}
            thread = threading.Thread(target=lambda p=path, b=body, o=out: o.update(huge=post(base + p, b)))
            thread.start()
            time.sleep(0.2)
            out["small"] = post(base + "/v1/embeddings", small)
            thread.join()
            rows.append([name, label, out["huge"][0], f"{out['huge'][1]:.2f}", f"{peak_mib(worker.pid) - before:.0f}",
                         f"{out['small'][1]:.3f}", f"{alone:.3f}"])
    finally:
        gateway.stop()
        worker.stop()
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=float, default=7.0, help="size of the huge text ('word ' repeated), in MB")
    parser.add_argument("--before", type=Path, default=None, help="a checkout of the code before, for part 2")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    model = load_model(model_path(), served_name="bench")
    print(describe_machine())
    part1 = worker_side(model, args.mb)
    print(table(["input", "code", "size", "s", "peak RSS growth MiB", "answer"], part1,
                title="1. the worker's preprocess of one huge text (all-MiniLM-L6-v2, max length 256)"))
    part2 = []
    with RedisServer() as server:
        trees = ([(args.before, "before")] if args.before else []) + [(REPO, "after")]
        for tree, label in trees:
            part2 += end_to_end(tree, label, args.mb, server.url)
    print(table(["huge request", "code", "status", "s", "worker peak RSS growth MiB", "small request s (meanwhile)",
                 "small request s (alone)"], part2, title="2. end to end: gateway + worker + Redis"))
    if args.json:
        args.json.write_text(json.dumps({"worker": part1, "end_to_end": part2}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
