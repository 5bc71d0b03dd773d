"""Engines side by side, end to end through the fleet: torch fp32 / bf16, ONNX Runtime fp32 / int8, OpenVINO fp32 /
int8 -- texts/s on the bench corpus and on short texts, each with its min cosine against torch fp32 and a retrieval
check (top-10 overlap of --queries queries over --docs documents against torch fp32).

    PYTHONPATH=. .venv/bin/python bench/engines.py [--limit 1000] [--short 1000] [--docs 2000] [--queries 100]
        [--rows torch,torch-bf16,onnx,onnx-int8,openvino,openvino-int8] [--chunk 16] [--repeat 2] [--json OUT]

Each row is a `python -m embedfleet.worker` subprocess with that row's flags (--engine, --quantize, --dtype; the vector
cache off, so every text is computed) on a private redis-server; the client is Producer.submit_many of requests of
--chunk texts, then Producer.wait on every id (the method of bench/throughput.py). Exports go to a temporary
--engine-cache-dir, made at the row's first start (not timed). Per row and repeat: a warm-up request, the corpus
(file order, long texts included, truncate_prompt_tokens=-1), the short texts (10-60 characters), timed apart;
then, untimed, the retrieval set. The rows alternate --repeat times and each keeps its best rate, so that a drift
of the shared machine favours no row. Vectors (cosines, overlap) come from the first repeat. Ratios are against
the torch fp32 row of the same run.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (RedisServer, Timer, add_corpus_flags, describe_machine, load_corpus, model_path, ratio,
                     short_texts, start_worker, table)

ROWS = {
    "torch": ["--engine", "torch", "--dtype", "float32"],
    "torch-bf16": ["--engine", "torch", "--dtype", "bfloat16"],
    "onnx": ["--engine", "onnx"],
    "onnx-int8": ["--engine", "onnx", "--quantize", "int8"],
    "openvino": ["--engine", "openvino"],
    "openvino-int8": ["--engine", "openvino", "--quantize", "int8"],
}


def embed_all(producer, texts: list[str], chunk: int) -> tuple[float, np.ndarray]:
    """texts/s end to end and the vectors, in order."""
    with Timer() as timer:
        ids = producer.submit_many([texts[i:i + chunk] for i in range(0, len(texts), chunk)], "bench",
                                   truncate_prompt_tokens=-1)
        results = [producer.wait(request_id, timeout=3600) for request_id in ids]
    for result in results:
        result.raise_for_error()
    return len(texts) / timer.seconds, np.vstack([r.embeddings for r in results])


def run_row(flags: list[str], sets: dict[str, list[str]], chunk: int, cache_dir: str,
            want_vectors: bool) -> tuple[dict[str, float], dict[str, np.ndarray], str]:
    from embedfleet import Producer

    extra = [*flags, "--engine-cache-dir", cache_dir, "--no-cache"]
    with RedisServer() as server, start_worker(server.url, model_path(), "bench", *extra, timeout=900) as worker, \
            Producer(server.url) as producer:
        serving = next(iter(worker.lines("serving model")), "")
        producer.embed(sets["short"][:chunk], "bench", timeout=300, truncate_prompt_tokens=-1)  # warm-up
        rates, vectors = {}, {}
        for name in ("corpus", "short"):
            rates[name], vectors[name] = embed_all(producer, sets[name], chunk)
        if want_vectors:
            for name in ("docs", "queries"):
                vectors[name] = embed_all(producer, sets[name], chunk)[1]
    return rates, vectors, serving


def overlap_at_10(docs: np.ndarray, queries: np.ndarray, ref_docs: np.ndarray, ref_queries: np.ndarray) -> float:
    """Mean share of each query's top-10 documents (by cosine) that torch fp32's top-10 also holds."""
    def top(d: np.ndarray, q: np.ndarray) -> np.ndarray:
        d = d / np.linalg.norm(d, axis=1, keepdims=True)
        q = q / np.linalg.norm(q, axis=1, keepdims=True)
        return np.argsort(-(q @ d.T), axis=1)[:, :10]

    got, want = top(docs, queries), top(ref_docs, ref_queries)
    return float(np.mean([len(set(g) & set(w)) / 10 for g, w in zip(got, want)]))


def min_cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64), b.astype(np.float64)
    return float(((a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)).min())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_corpus_flags(parser, limit=1000)
    parser.add_argument("--short", type=int, default=1000, help="short texts (10-60 characters) timed apart")
    parser.add_argument("--docs", type=int, default=2000, help="documents of the retrieval check (corpus order)")
    parser.add_argument("--queries", type=int, default=100, help="queries of the retrieval check (short texts)")
    parser.add_argument("--rows", default=",".join(ROWS), help=f"comma list of: {', '.join(ROWS)}")
    parser.add_argument("--chunk", type=int, default=16, help="texts per embedfleet request")
    parser.add_argument("--repeat", type=int, default=2, help="alternating runs; each row keeps its best")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()

    rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    if "torch" not in rows:
        rows.insert(0, "torch")  # the reference of every ratio and cosine
    everything = load_corpus(args.corpus)
    shorts = short_texts(everything)
    sets = {"corpus": everything[:args.limit], "short": shorts[:args.short],
            "docs": everything[:args.docs], "queries": shorts[-args.queries:]}
    print(f"{len(sets['corpus'])} corpus texts ({sum(map(len, sets['corpus'])) / len(sets['corpus']):.0f} chars on "
          f"average), {len(sets['short'])} short texts; retrieval {len(sets['queries'])} queries over "
          f"{len(sets['docs'])} documents; {describe_machine()}", flush=True)

    best: dict[str, dict[str, float]] = {}
    vectors: dict[str, dict[str, np.ndarray]] = {}
    started: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="bench-engines-") as cache_dir:
        for repeat in range(args.repeat):
            for row in rows:
                rates, got, serving = run_row(ROWS[row], sets, args.chunk, cache_dir, row not in vectors)
                vectors.setdefault(row, got)
                started.setdefault(row, serving)
                seen = best.setdefault(row, rates)
                for name, rate in rates.items():
                    seen[name] = max(seen[name], rate)
                print(f"  [{repeat + 1}] {row}: corpus {rates['corpus']:.1f} texts/s, short {rates['short']:.1f} "
                      "texts/s", flush=True)
    print("Forward passes alone, as each worker's start-up probe measured them (texts/s at 16, 64, 256 tokens):")
    for row in rows:
        line = started[row]
        probe = line[line.find("best texts/s"):line.find(")", line.find("best texts/s"))]
        cosine = line[line.find("probe cosine"):line.find(",", line.find("probe cosine"))]
        print(f"  {row}: {probe}; {cosine}")

    ref = vectors["torch"]
    table_rows, figures = [], {"texts": len(sets["corpus"]), "short": len(sets["short"]), "chunk": args.chunk,
                               "rows": []}
    for row in rows:
        got = vectors[row]
        cos = min(min_cosine(got[name], ref[name]) for name in ("corpus", "short"))
        overlap = overlap_at_10(got["docs"], got["queries"], ref["docs"], ref["queries"])
        figure = {"row": row, "corpus_texts_s": best[row]["corpus"], "short_texts_s": best[row]["short"],
                  "x_corpus": ratio(best[row]["corpus"], best["torch"]["corpus"]),
                  "x_short": ratio(best[row]["short"], best["torch"]["short"]), "min_cosine": cos,
                  "top10_overlap": overlap}
        figures["rows"].append(figure)
        table_rows.append([row, figure["corpus_texts_s"], figure["x_corpus"], figure["short_texts_s"],
                           figure["x_short"], f"{cos:.6f}", f"{overlap:.3f}"])
    print(table(["engine", "corpus texts/s", "x torch fp32", "short texts/s", "x torch fp32", "min cosine",
                 "top-10 overlap"], table_rows,
                f"Engines end to end, {len(sets['corpus'])} corpus + {len(sets['short'])} short texts, "
                f"{args.chunk} texts/request (targets: onnx >= 1.3x short; best int8 >= 2.5x short, >= 1.5x corpus, "
                "min cosine >= 0.99, overlap >= 0.95)"))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
