"""Texts/s, side by side in one run: embedfleet end to end vs the bare transformers loop at its best batch size vs
sentence-transformers `encode` at its best batch size, per dtype.

    PYTHONPATH=. .venv/bin/python bench/throughput.py [--limit 1000] [--dtypes float32,bfloat16]
        [--batch-sizes 4,8,16,32,64] [--chunk 16] [--repeat 2] [--device cpu|cuda] [--corpus FILE] [--json OUT]

The corpus texts are taken in file order, long ones included (truncate_prompt_tokens=-1 for embedfleet, the
model's max_seq_length for the others). End to end = Producer.submit_many of requests of --chunk texts on a
private redis-server, a `python -m embedfleet.worker --dtype D` subprocess, then Producer.wait on every id. The bare
loop sorts the texts by token length, pads per batch, mean-pools and normalises (the work a user would otherwise
write). Both in-process rows sweep --batch-sizes and report their best. The rows alternate --repeat times and
each keeps its best run, so that a drift of the machine favours no row. Absolute figures drift with machine
load; the ratios are the figures to compare. Bounded by --limit and --repeat.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (RedisServer, Timer, add_corpus_flags, describe_machine, load_corpus, model_path,
                     ratio, start_worker, table)

DTYPES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16",
          "float16": "float16", "fp16": "float16"}


def max_seq_length(path: str) -> int:
    config = Path(path) / "sentence_bert_config.json"
    return json.loads(config.read_text()).get("max_seq_length", 256) if config.exists() else 256


def sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


class BareLoop:
    """The loop a user writes without a fleet: length-sorted batches, mean pooling, L2 normalisation."""

    def __init__(self, path: str, dtype: str, device: str):
        import torch
        from transformers import AutoModel, AutoTokenizer

        self.torch, self.device = torch, device
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.model = AutoModel.from_pretrained(path).to(device, getattr(torch, dtype)).eval()
        self.max_length = max_seq_length(path)

    def run(self, texts: list[str], batch: int) -> float:
        torch = self.torch
        with Timer() as timer, torch.inference_mode():
            encoded = self.tokenizer(texts, truncation=True, max_length=self.max_length)["input_ids"]
            order = sorted(range(len(texts)), key=lambda i: len(encoded[i]))
            for start in range(0, len(order), batch):
                rows = [{"input_ids": encoded[i]} for i in order[start:start + batch]]
                enc = self.tokenizer.pad(rows, return_tensors="pt").to(self.device)
                hidden = self.model(**enc).last_hidden_state.float()
                mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
                torch.nn.functional.normalize(pooled, dim=-1).cpu()
            sync(self.device)
        return len(texts) / timer.seconds


class SentenceTransformers:
    def __init__(self, path: str, dtype: str, device: str):
        import torch
        from sentence_transformers import SentenceTransformer

        self.model = SentenceTransformer(path, device=device)
        if dtype != "float32":
            self.model.to(getattr(torch, dtype))
        self.device = device

    def run(self, texts: list[str], batch: int) -> float:
        with Timer() as timer:
            self.model.encode(texts, batch_size=batch, normalize_embeddings=True)
            sync(self.device)
        return len(texts) / timer.seconds


def sweep(runner, texts: list[str], batch_sizes: list[int]) -> dict[int, float]:
    runner.run(texts[:max(batch_sizes)], max(batch_sizes))  # warm-up: allocator, kernels, tokenizer
    return {bs: runner.run(texts, bs) for bs in batch_sizes}


def end_to_end(path: str, texts: list[str], chunk: int, dtype: str, device: str | None) -> float:
    from embedfleet import Producer

    extra = ["--dtype", dtype] + (["--device", device] if device else [])
    with RedisServer() as server, start_worker(server.url, path, "bench", *extra) as worker, \
            Producer(server.url) as producer:
        for line in worker.lines("batch budget probe"):
            print("    worker: " + line.split(": ", 1)[-1][:300], flush=True)
        producer.embed(texts[:chunk], "bench", timeout=300, truncate_prompt_tokens=-1)  # warm-up
        with Timer() as timer:
            batches = [texts[i:i + chunk] for i in range(0, len(texts), chunk)]
            ids = producer.submit_many(batches, "bench", truncate_prompt_tokens=-1)
            for request_id in ids:
                producer.wait(request_id, timeout=3600)
        return len(texts) / timer.seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_corpus_flags(parser, limit=1000)
    parser.add_argument("--dtypes", default="float32,bfloat16", help="comma list: float32, bfloat16, float16")
    parser.add_argument("--batch-sizes", default="4,8,16,32,64", help="batch sizes the in-process rows sweep")
    parser.add_argument("--chunk", type=int, default=16, help="texts per embedfleet request")
    parser.add_argument("--device", default=None, help="cpu, cuda (default: cuda when present, else cpu)")
    parser.add_argument("--repeat", type=int, default=2, help="alternating runs; each row keeps its best")
    parser.add_argument("--skip", default="", help="comma list of rows to leave out: bare, st, fleet")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()

    import torch
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    torch.set_num_threads(os.cpu_count() or 1)
    dtypes = [DTYPES[d.strip()] for d in args.dtypes.split(",") if d.strip()]
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    skip = set(filter(None, args.skip.split(",")))
    path, texts = model_path(), load_corpus(args.corpus, args.limit)
    print(f"{len(texts)} texts, {sum(map(len, texts)) / len(texts):.0f} chars on average; {describe_machine()}; "
          f"device {device}", flush=True)

    sweeps: dict[str, dict[int, float]] = {}
    fleet: dict[str, float] = {}
    runners = {}
    for repeat in range(args.repeat):  # rows alternate, and each keeps its best: the machine drifts
        for dtype in dtypes:
            for row, cls in (("bare", BareLoop), ("st", SentenceTransformers)):
                if row not in skip:
                    runner = runners.setdefault((row, dtype), cls(path, dtype, device))
                    seen = sweep(runner, texts, batch_sizes)
                    best = sweeps.setdefault(f"{row} {dtype}", seen)
                    for bs, rate in seen.items():
                        best[bs] = max(best[bs], rate)
                    print(f"  [{repeat + 1}] {row} {dtype}: " + ", ".join(f"bs {b} {r:.1f}" for b, r in seen.items()),
                          flush=True)
            if "fleet" not in skip:
                rate = end_to_end(path, texts, args.chunk, dtype, args.device)
                fleet[dtype] = max(fleet.get(dtype, 0.0), rate)
                print(f"  [{repeat + 1}] embedfleet {dtype}: {rate:.1f}", flush=True)

    print(table(["batch size", *sweeps], [[bs, *(s[bs] for s in sweeps.values())] for bs in batch_sizes],
                "Sweep of the in-process rows, texts/s"))
    rows, figures = [], {"device": device, "texts": len(texts), "chunk": args.chunk, "rows": []}
    for dtype in dtypes:
        best = {row: max(sweeps[f"{row} {dtype}"].items(), key=lambda kv: kv[1])
                for row in ("bare", "st") if f"{row} {dtype}" in sweeps}
        bare, st, e2e = best.get("bare", (None, float("nan"))), best.get("st", (None, float("nan"))), \
            fleet.get(dtype, float("nan"))
        rows.append([f"embedfleet end to end ({args.chunk} texts/request)", dtype, e2e, ratio(e2e, bare[1]),
                     ratio(e2e, st[1])])
        rows.append([f"bare transformers loop, best bs {bare[0]}", dtype, bare[1], 1.0, ratio(bare[1], st[1])])
        rows.append([f"sentence-transformers encode, best bs {st[0]}", dtype, st[1], ratio(st[1], bare[1]), 1.0])
        figures["rows"] += [{"path": "embedfleet", "dtype": dtype, "texts_s": e2e},
                            {"path": "bare", "dtype": dtype, "batch": bare[0], "texts_s": bare[1]},
                            {"path": "sentence-transformers", "dtype": dtype, "batch": st[0], "texts_s": st[1]}]
    print(table(["path", "dtype", "texts/s", "x bare best", "x ST best"], rows,
                f"Throughput, {len(texts)} texts, {device} (targets: fleet fp32 >= 1.0x bare, >= 1.25x ST)"))
    figures["sweeps"] = {k: {str(b): r for b, r in v.items()} for k, v in sweeps.items()}
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
