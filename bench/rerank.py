"""Rerank through the fleet vs sentence-transformers' CrossEncoder in this process, side by side in one run.

    PYTHONPATH=. .venv/bin/python bench/rerank.py [--queries 20] [--documents 100] [--json OUT]

The cross-encoder is the bundled all-MiniLM-L6-v2 encoder with a random one-label head (the size of the
common ms-marco-MiniLM-L6 rerankers; the scores mean nothing, the cost is real), saved to a temp folder.
Each query is reranked against --documents corpus texts: in process with CrossEncoder.predict (batch 32),
and end to end with Producer.rerank on one worker process (`python -m embedfleet.worker`, 32 rows / 8192 padded tokens
per pass: the start-up probe is meaningless on a shared, loaded machine),
where one request holds every (query, document) pair; the two alternate query by query. The client shares
the machine with the worker (the in-process model idles while the worker runs, and the other way round).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RedisServer, Timer, describe_machine, load_corpus, model_path, ratio, start_worker, table

SERVED = "reranker"


def build_cross_encoder(folder: str) -> str:
    import torch
    from transformers import AutoTokenizer, BertForSequenceClassification

    torch.manual_seed(0)
    model = BertForSequenceClassification.from_pretrained(model_path(), num_labels=1)
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(model_path()).save_pretrained(folder)
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--queries", type=int, default=20)
    parser.add_argument("--documents", type=int, default=100)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    from sentence_transformers import CrossEncoder

    from embedfleet import Producer

    texts = [t for t in load_corpus() if 20 <= len(t) <= 400]
    queries = [t[:60] for t in texts[: args.queries]]
    documents = texts[args.queries: args.queries + args.documents]
    pairs = args.queries * len(documents)
    bare_seconds = fleet_seconds = 0.0
    expected, ranked = [], []
    with tempfile.TemporaryDirectory() as folder:
        build_cross_encoder(folder)
        reference = CrossEncoder(folder, device="cpu", max_length=256)
        with RedisServer() as server, start_worker(server.url, folder, SERVED, "--max-batch-tokens", "8192",
                                                  "--max-batch-size", "32"), \
                Producer(server.url) as producer:
            reference.predict([(queries[0], d) for d in documents[:8]])  # warm-up, both paths
            producer.rerank(queries[0], documents[:8], SERVED)
            for query in queries:  # interleaved, so that the shared machine's noise hits both paths alike
                with Timer() as bare:
                    expected.append(reference.predict([(query, d) for d in documents], batch_size=32))
                with Timer() as fleet:
                    ranked.append(producer.rerank(query, documents, SERVED))
                bare_seconds += bare.seconds
                fleet_seconds += fleet.seconds
    agree = sum([r["index"] for r in got] == sorted(range(len(documents)), key=lambda i: -want[i])
                for got, want in zip(ranked, expected))
    rows = [["CrossEncoder.predict, in process", pairs / bare_seconds, bare_seconds / args.queries * 1000, 1.0],
            ["Producer.rerank, one worker", pairs / fleet_seconds, fleet_seconds / args.queries * 1000,
             ratio(bare_seconds, fleet_seconds)]]
    print(describe_machine())
    print(table(["path", "pairs/s", "ms per query", "vs in process"], rows,
                f"rerank {args.queries} queries x {len(documents)} documents (MiniLM-L6 cross-encoder, CPU)"))
    print(f"\nsame ranking as CrossEncoder.predict for {agree} of {args.queries} queries")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "agree": agree}))


if __name__ == "__main__":
    main()
