"""Fast paths of the forward pass, side by side in one run: texts/s and fidelity of each against what the worker
serves (SDPA attention, float32, length-sorted batches), on the same corpus texts.

    PYTHONPATH=. .venv/bin/python bench/fastpaths.py [--limit 400] [--batch 16] [--compile] [--json OUT]

Rows: SDPA (served), eager attention, corpus-order batches (no length sorting), bfloat16 (the worker's --dtype,
behind its fidelity check) and, with --compile, torch.compile(dynamic=True) (its warm-up is reported, not timed
in texts/s). Fidelity is the lowest cosine against sentence-transformers in float32 over the texts. Each row
embeds the texts once after one warm-up pass; the ratios are the figures to compare.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
from transformers import AutoModel

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import add_corpus_flags, describe_machine, load_corpus, model_path, table

from embedfleet.worker.engine.models.loader import load_model


def run(model, batches: list[list[list[int]]]) -> tuple[float, np.ndarray]:
    """texts/s and the vectors, in batch order."""
    model.embed(batches[0])
    start = time.perf_counter()
    vectors = [model.embed(batch).numpy() for batch in batches]
    elapsed = time.perf_counter() - start
    return sum(map(len, batches)) / elapsed, np.vstack(vectors)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--compile", action="store_true", help="also time torch.compile (about a minute to warm)")
    parser.add_argument("--json")
    add_corpus_flags(parser, 400)
    args = parser.parse_args()
    path = model_path()
    texts = load_corpus(args.corpus, args.limit)
    served = load_model(path, served_name="m")
    limit = served.caps.max_model_len
    ids = [served.tokenizer(t, truncation=True, max_length=limit)["input_ids"] for t in texts]
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))

    def cut(positions):
        return [[ids[p] for p in positions[i:i + args.batch]] for i in range(0, len(positions), args.batch)]

    sorted_batches, corpus_batches = cut(order), cut(list(range(len(ids))))
    from sentence_transformers import SentenceTransformer  # the reference, float32

    reference = SentenceTransformer(path, device="cpu").encode(texts, batch_size=args.batch, convert_to_numpy=True)

    def fidelity(vectors: np.ndarray, positions: list[int]) -> float:
        ref = reference[positions]
        return float(((vectors * ref).sum(1) / np.linalg.norm(vectors, axis=1) / np.linalg.norm(ref, axis=1)).min())

    rows = []
    base, vectors = run(served, sorted_batches)
    rows.append(("SDPA attention, float32, length-sorted (served)", base, fidelity(vectors, order), "kept (default)"))

    eager = load_model(path, served_name="m")
    eager.module = AutoModel.from_pretrained(eager.module.config._name_or_path, attn_implementation="eager",
                                             dtype=torch.float32).eval()
    rate, vectors = run(eager, sorted_batches)
    rows.append(("eager attention", rate, fidelity(vectors, order), "dropped: SDPA is the default"))

    rate, vectors = run(served, corpus_batches)
    rows.append(("corpus-order batches (no length sorting)", rate, fidelity(vectors, list(range(len(ids)))),
                 "dropped: the worker sorts every round by length"))

    reduced = load_model(path, served_name="m", dtype="bfloat16")
    rate, vectors = run(reduced, sorted_batches)
    rows.append(("bfloat16 (--dtype bfloat16)", rate, fidelity(vectors, order), "kept behind the flag and its check"))

    if args.compile:
        compiled = load_model(path, served_name="m")
        compiled.module = torch.compile(compiled.module, dynamic=True)
        began = time.perf_counter()
        compiled.embed(sorted_batches[len(sorted_batches) // 2])
        warm = time.perf_counter() - began
        rate, vectors = run(compiled, sorted_batches)
        rows.append((f"torch.compile(dynamic=True) (warm-up {warm:.0f} s)", rate, fidelity(vectors, order),
                     "dropped: see BENCHMARKS.md"))

    print(f"\n{describe_machine()}; {len(texts)} texts, batches of {args.batch}\n")
    print(table(["path", "texts/s", "x served", "min cosine vs ST fp32", "verdict"],
                [[name, f"{rate:,.1f}", f"{rate / base:.2f}", f"{cos:.6f}", verdict]
                 for name, rate, cos, verdict in rows]))
    if args.json:
        Path(args.json).write_text(json.dumps([dict(zip(("path", "texts_per_s", "min_cosine", "verdict"), row))
                                               for row in rows], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
