"""Through HTTP, side by side in one run: the embedfleet gateway (+ Redis + one worker) vs Infinity's server on the
same model folder, same load: the `openai` client, --concurrency 32 requests in flight, 1 and 64 texts per
request, corpus texts in file order (long ones included: truncate_prompt_tokens=-1 for embedfleet; Infinity
truncates to the model's length by itself).

    PYTHONPATH=. .venv/bin/python bench/gateway.py [--requests 1000] [--seconds 30] [--sizes 1,64]
        [--concurrency 32] [--dtype float32] [--infinity-venv ../.infvenv] [--skip embedfleet,infinity] [--json OUT]

Infinity runs from its own venv (never the project's; bench/setup_infinity.sh makes one):
`VENV/bin/infinity_emb v2 --model-id MODEL --engine torch --device cpu|cuda`. Without that venv its rows say
why and are skipped. Each case sends --requests requests or runs --seconds, whichever ends first, after a
warm-up; the servers are started once and stopped on exit.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (REPO, Process, RedisServer, add_corpus_flags, describe_machine, free_port,
                     load_corpus, model_path, percentile, ratio, start_gateway, start_worker, table, wait_http)

SERVED = "all-MiniLM-L6-v2"
DEFAULT_INFINITY_VENV = REPO.parent / ".infvenv"


async def load(base_url: str, texts: list[str], size: int, requests: int, seconds: float, concurrency: int,
               extra_body: dict | None) -> dict:
    """Closed loop: `concurrency` tasks each send a request, await it, send the next."""
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=base_url, api_key="bench", max_retries=0, timeout=600)
    batches = [[texts[(i * size + j) % len(texts)] for j in range(size)] for i in range(requests)]

    async def one(batch: list[str]) -> float:
        start = time.perf_counter()
        answer = await client.embeddings.create(model=SERVED, input=batch, extra_body=extra_body)
        if len(answer.data) != len(batch):
            raise RuntimeError(f"{base_url}: {len(answer.data)} embeddings for {len(batch)} inputs")
        return time.perf_counter() - start

    for batch in batches[:min(concurrency, 8)]:  # warm-up: connections, first shapes
        await one(batch)
    latencies: list[float] = []
    next_index, stop_at = 0, time.monotonic() + seconds

    async def sender() -> None:
        nonlocal next_index
        while next_index < len(batches) and time.monotonic() < stop_at:
            batch, next_index = batches[next_index], next_index + 1
            latencies.append(await one(batch))

    start = time.perf_counter()
    await asyncio.gather(*(sender() for _ in range(concurrency)))
    elapsed = time.perf_counter() - start
    await client.close()
    done = len(latencies)
    print(f"  {base_url}: {done} requests of {size} text(s) in {elapsed:.1f} s", flush=True)
    return {"requests_s": done / elapsed, "texts_s": done * size / elapsed, "requests": done,
            "p50_ms": percentile(latencies, 50) * 1000, "p99_ms": percentile(latencies, 99) * 1000}


def start_infinity(venv: Path, path: str, device: str, dtype: str, batch_size: int) -> tuple[Process, str]:
    port = free_port()
    infinity = Process([str(venv / "bin" / "infinity_emb"), "v2", "--model-id", path, "--served-model-name", SERVED,
                        "--port", str(port), "--engine", "torch", "--device", device, "--dtype",
                        {"float32": "float32", "float16": "float16", "bfloat16": "bfloat16"}[dtype],
                        "--batch-size", str(batch_size)],
                       "infinity", env={"HF_HUB_OFFLINE": "1", "INFINITY_ANONYMOUS_USAGE_STATS": "0",
                                        "DO_NOT_TRACK": "1", "PYTHONPATH": ""})
    base = f"http://127.0.0.1:{port}"
    wait_http(infinity, base + "/models", timeout=300)
    return infinity, base


def infinity_missing(venv: Path) -> str | None:
    if not (venv / "bin" / "infinity_emb").exists():
        return (f"no Infinity at {venv}/bin/infinity_emb: run `bash bench/setup_infinity.sh {venv}` "
                "(or pass --infinity-venv)")
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_corpus_flags(parser, limit=None)
    parser.add_argument("--requests", type=int, default=1000, help="most requests per case")
    parser.add_argument("--seconds", type=float, default=30, help="most seconds per case")
    parser.add_argument("--sizes", default="1,64", help="texts per request, comma list")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    parser.add_argument("--device", default=None, help="cpu, cuda (default: cuda when present, else cpu)")
    parser.add_argument("--infinity-venv", type=Path,
                        default=Path(os.environ.get("INFINITY_VENV", DEFAULT_INFINITY_VENV)),
                        help="venv holding infinity-emb (env INFINITY_VENV)")
    parser.add_argument("--infinity-batch-sizes", default="8,32",
                        help="Infinity's --batch-size values to try; its best per case is the baseline")
    parser.add_argument("--skip", default="", help="comma list of rows to leave out: embedfleet, infinity")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()

    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    sizes = [int(s) for s in args.sizes.split(",")]
    skip = set(filter(None, args.skip.split(",")))
    path, texts = model_path(), load_corpus(args.corpus, args.limit)
    print(f"{describe_machine()}; device {device}, {args.dtype}, concurrency {args.concurrency}", flush=True)

    figures: dict[str, dict[int, dict]] = {}
    if "embedfleet" not in skip:
        with contextlib.ExitStack() as stack:
            server = stack.enter_context(RedisServer())
            stack.enter_context(start_worker(server.url, path, SERVED, "--dtype", args.dtype, "--device", device))
            gateway, base = start_gateway(server.url, "--request-timeout", "600")
            stack.enter_context(gateway)
            base += "/v1"
            figures["embedfleet gateway"] = {
                size: asyncio.run(load(base, texts, size, args.requests, args.seconds, args.concurrency,
                                       {"truncate_prompt_tokens": -1})) for size in sizes}
    why_not = infinity_missing(args.infinity_venv) if "infinity" not in skip else "skipped (--skip)"
    if why_not is None:
        best: dict[int, dict] = {}
        for batch_size in [int(b) for b in args.infinity_batch_sizes.split(",")]:  # its best configuration
            try:
                infinity, base = start_infinity(args.infinity_venv, path, device, args.dtype, batch_size)
            except SystemExit as exc:
                why_not = f"Infinity did not start: {str(exc)[-600:]}"
                break
            with infinity:
                for size in sizes:
                    seen = asyncio.run(load(base, texts, size, args.requests, args.seconds, args.concurrency, None))
                    if seen["texts_s"] > best.get(size, {}).get("texts_s", -1):
                        best[size] = {**seen, "batch_size": batch_size}
        if best:
            why_not = None
            version = infinity_version(args.infinity_venv)
            figures[f"Infinity {version} (best of --batch-size {args.infinity_batch_sizes})"] = best
    infinity_row = next((v for k, v in figures.items() if k.startswith("Infinity")), {})
    rows = []
    for size in sizes:
        for name, by_size in figures.items():
            m = by_size[size]
            rows.append([name, size, m["requests"], m["requests_s"], m["texts_s"], m["p50_ms"], m["p99_ms"],
                         ratio(m["texts_s"], infinity_row.get(size, {}).get("texts_s", float("nan")))])
    print(table(["server", "texts/request", "requests", "requests/s", "texts/s", "p50 ms", "p99 ms", "x Infinity"],
                rows, f"Through HTTP, openai client, concurrency {args.concurrency}, {device} {args.dtype} "
                      "(target: embedfleet >= 1.5x Infinity)"))
    if why_not:
        print(f"\nInfinity row: {why_not}")
    if args.json:
        args.json.write_text(json.dumps({"figures": {k: {str(s): m for s, m in v.items()} for k, v in figures.items()},
                                         "infinity": why_not or "ran"}, indent=1))


def infinity_version(venv: Path) -> str:
    for dist in (venv / "lib").glob("python*/site-packages/infinity_emb-*.dist-info"):
        return dist.name.removesuffix(".dist-info").split("-")[1]
    return "(version unknown)"


if __name__ == "__main__":
    main()
