"""Long inputs in chunks, side by side in one run: what chunked processing costs against truncation, and what
spreading one request's chunks over the fleet (sub-jobs + join) costs against serving them in one worker.

    PYTHONPATH=. .venv/bin/python bench/longinputs.py [--docs 12] [--tokens 1024] [--repeat 3] [--json OUT]

Each document joins corpus texts up to --tokens tokens (8 chunks of all-MiniLM-L6-v2's 256 at the default).
Rows, each over the same documents, one request per document, submitted at once to a real Redis and served by
real BatchWorkers in this process (threads): truncated to the max length (1 chunk each), chunked in the worker
that took it, chunked and spread as parts of 2 chunks over one worker, then over two. `chunks/s` counts
forward-pass rows of 256 tokens. The rows run interleaved --repeat times and each reports its fastest run; the
ratios against the first chunked row are the figures to compare (absolute times only mean something on a
quiet machine or a GPU).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import describe_machine, load_corpus, model_path, table

import redis

from embedfleet.common.redisserver import RedisServer
from embedfleet import Producer
from embedfleet.worker.engine.engine import Engine
from embedfleet.worker.engine.models.loader import load_model
from embedfleet.worker.serving.builder import build_worker
from embedfleet.worker.serving.config import given_settings


def documents(tokenizer, count: int, tokens: int) -> list[str]:
    texts, docs, current = load_corpus(), [], []
    for text in texts:
        current.append(text)
        if len(tokenizer(" ".join(current))["input_ids"]) >= tokens:
            docs.append(" ".join(current))
            current = []
            if len(docs) == count:
                return docs
    raise SystemExit("the corpus is too short for that many documents")


def serve(model, url: str, docs: list[str], workers: int, chunks_per_job: int, **params) -> dict:
    """Submit every document, serve them with `workers` BatchWorkers, return seconds and counts."""
    connection = redis.Redis.from_url(url)
    connection.flushall()
    # --no-cache: the repeats and the rows compare compute; a repeat answered from the cache would compare nothing
    settings = given_settings(max_jobs=16, poll_timeout=1, chunks_per_job=chunks_per_job, cache=False)
    fleet = [build_worker(settings, Engine(model, max_batch_tokens=8192, max_batch_size=32), connection)
             for _ in range(workers)]
    threads = [threading.Thread(target=w.work, daemon=True) for w in fleet]
    for worker in fleet:
        worker.advertiser.advertise()
    with Producer(url) as producer:
        start = time.perf_counter()
        ids = [producer.submit([doc], "bench", **params) for doc in docs]
        for thread in threads:
            thread.start()
        results = [producer.wait(i, timeout=600) for i in ids]
        elapsed = time.perf_counter() - start
    for worker in fleet:
        worker.stop()
    for thread in threads:
        thread.join(60)
    tokens = sum(r.usage.prompt_tokens for r in results)
    return {"seconds": elapsed, "tokens": tokens, "passes": sum(w.engine.forward_passes for w in fleet),
            "spread": sum(w.chunk_jobs.spread_requests for w in fleet), "vectors": [r.embeddings[0] for r in results]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, default=12)
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    model = load_model(model_path(), served_name="bench", max_embed_len=args.tokens * 2)
    docs = documents(model.tokenizer, args.docs, args.tokens)
    rows, out = [], {}
    with RedisServer() as server:
        serve(model, server.url, docs[:2], 1, 0)  # warm-up
        cases = [("truncated to 256 (1 chunk)", 1, 0, {"truncate_prompt_tokens": -1}),
                 ("chunked, one worker", 1, 0, {}),
                 ("chunked, spread as parts of 2, 1 worker", 1, 2, {}),
                 ("chunked, spread as parts of 2, 2 workers", 2, 2, {})]
        for _ in range(args.repeat):
            for name, workers, per_job, params in cases:
                run = serve(model, server.url, docs, workers, per_job, **params)
                if name not in out or run["seconds"] < out[name]["seconds"]:
                    out[name] = run
    base = out["chunked, one worker"]
    for name, _, _, _ in cases:
        row = out[name]
        chunks = row["tokens"] / 256
        same = min(float((a * b).sum()) for a, b in zip(row["vectors"], base["vectors"]))
        rows.append([name, f"{row['seconds']:.2f}", f"{len(docs) / row['seconds']:.1f}",
                     f"{chunks / row['seconds']:.0f}", f"{base['seconds'] / row['seconds']:.2f}", row["spread"],
                     f"{same:.6f}"])
    print(describe_machine())
    print(table(["row", "s", "docs/s", "chunks/s", "speed vs chunked in 1 worker", "spread requests",
                 "min cosine vs chunked in 1 worker"], rows,
                title=f"{len(docs)} documents of >= {args.tokens} tokens, all-MiniLM-L6-v2 (max length 256), "
                      f"best of {args.repeat}"))
    if args.json:
        args.json.write_text(json.dumps({k: {f: v for f, v in r.items() if f != "vectors"} for k, r in out.items()},
                                        indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
