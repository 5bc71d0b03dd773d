"""The GPU's regime on a CPU: the whole worker on a model whose forward pass costs almost nothing, against
tokenising the same texts alone and the bare loop on the same model, with where each round's time goes.

    PYTHONPATH=. .venv/bin/python bench/cpuside.py [--limit N] [--chunk 16] [--repeat 3]
        [--batch-sizes 64,128,256,512] [--baseline CHECKOUT] [--corpus FILE] [--json OUT]

The model is built on the fly: a random 1-layer, hidden-32 BERT with the real all-MiniLM-L6-v2 tokenizer and
sentence-transformers files (mean pooling, Normalize), so tokenising costs what it costs for MiniLM while the
forward pass costs ~1/100 of it, as on a GPU. Rows, side by side, alternating --repeat times, each keeping its best:
  tokenise  the corpus in one batched tokenizer call (truncation to the max length): the CPU side's own limit
            (and, for reference, the same ids from the tokenizer's Rust backend alone)
  bare      the bare transformers loop (bench/throughput.py's) at its best batch size
  fleet     `python -m embedfleet.worker` on a private redis-server, Producer.submit_many of --chunk-text requests, then
            Producer.wait on every id (as bench/throughput.py); with --baseline, that checkout's worker too,
            in the same run, alternating with this one's
The stage table comes from the worker's own `embedfleet_worker_stage_seconds_total` metric (per thread and
stage, waits included; worker/engine/stageclock.py), scraped before and after the fleet row's timed window:
milliseconds per round, and the share of each thread's time, summed over all the row's runs. Each row is shown
at its best run and its median run: on a shared machine single runs of a few seconds scatter by 2x.
The workers' batch shape is pinned (--shape). OMP_WAIT_POLICY is PASSIVE and GOMP_SPINCOUNT 1000 unless set.
"""

from __future__ import annotations

import argparse
import json
import os

# OpenMP threads that spin for work on this shared 2-core box slow a tiny forward pass tenfold (ARCHITECTURE.md):
# passive waiting keeps the forward pass as cheap as the regime this bench stands in for (a GPU's). The worker
# subprocess inherits both: the worker's own default (worker/engine/cpus.py), PASSIVE after a brief spin.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("GOMP_SPINCOUNT", "1000")
import shutil
import statistics
import sys
import tempfile
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (Process, RedisServer, Timer, add_corpus_flags, describe_machine, free_port, load_corpus, module_in,
                     model_path, ratio, settle_gc, table, wait_advertised)
from throughput import BareLoop, max_seq_length, sweep

# the stage threads of worker/serving/pipeline.py and the stages they lap, in the order a round meets them
THREADS = ("take", "forward", "finish")
STAGES = ("take", "decode", "verify", "tokenise", "cache", "plan", "collate", "h2d", "forward", "pooling", "d2h",
          "scatter", "cast", "answers", "publish", "traces", "other")
WEIGHTS = ("model.safetensors", "pytorch_model.bin", "config.json", "onnx", "openvino")


def build_tiny(folder: str) -> str:
    """MiniLM's folder with its transformer swapped for a random 1-layer, hidden-32 BERT (same vocabulary)."""
    import torch
    from transformers import BertConfig, BertModel

    source = model_path()
    # the top folder's weights and config only: 1_Pooling/config.json (and the like) stay
    shutil.copytree(source, folder, dirs_exist_ok=True,
                    ignore=lambda where, names: [n for n in names if n in WEIGHTS] if where == str(source) else [])
    config = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=512)
    torch.manual_seed(0)
    BertModel(config).eval().save_pretrained(folder)
    return folder


class Tokenise:
    """The corpus in one batched call, as the worker's tokenizer is configured (truncated to the max length)."""

    def __init__(self, path: str):
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.max_length = max_seq_length(path)

    def run(self, texts: list[str]) -> float:
        with Timer() as timer:
            self.tokenizer(texts, truncation=True, max_length=self.max_length)
        return len(texts) / timer.seconds

    def run_backend(self, texts: list[str]) -> float:
        """The same ids from the Rust tokenizer alone (no conversion of each encoding to Python dicts)."""
        backend = self.tokenizer.backend_tokenizer
        backend.enable_truncation(self.max_length)
        backend.no_padding()
        with Timer() as timer:
            _ = [encoding.ids for encoding in backend.encode_batch(texts)]
        return len(texts) / timer.seconds


def scrape(url: str) -> dict[tuple[str, str], float]:
    """(thread, stage) -> seconds, and ("rounds", "") -> rounds, from the worker's /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    found: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "embedfleet_worker_stage_seconds_total":
                found[sample.labels["thread"], sample.labels["stage"]] = sample.value
            elif sample.name == "embedfleet_worker_rounds_total":
                found["rounds", ""] = sample.value
    return found


def fleet(path: str, texts: list[str], chunk: int, shape: list[str], code: Path | None = None) -> tuple[float, dict]:
    """Texts/s end to end, and the stage seconds (and rounds) of the timed window. `shape`: the worker's batch
    shape flags; `code`: a checkout whose worker runs instead of this one's (first on its PYTHONPATH)."""
    from embedfleet import Producer

    port = free_port()
    with RedisServer() as server, Process(
            [sys.executable, "-m", module_in(code, "worker"), "--redis-url", server.url, "--model", path,
             "--served-model-name", "tiny", "--metrics-port", str(port), "--metrics-host", "127.0.0.1",
             *shape], "worker-tiny",
            pythonpath=(code,) if code else ()) as worker, Producer(server.url) as producer:
        wait_advertised(worker, server.url, "tiny")
        for line in worker.lines("batch budget probe"):
            print("    worker: " + line.split(": ", 1)[-1][:200], flush=True)
        producer.embed(texts[:chunk], "tiny", timeout=300, truncate_prompt_tokens=-1)  # warm-up
        metrics = f"http://127.0.0.1:{port}/metrics"
        before = scrape(metrics)
        with Timer() as timer:
            ids = producer.submit_many([texts[i:i + chunk] for i in range(0, len(texts), chunk)], "tiny",
                                       truncate_prompt_tokens=-1)
            for request_id in ids:
                producer.wait(request_id, timeout=600)
        after = scrape(metrics)
    spent = {key: after[key] - before.get(key, 0.0) for key in after}
    spent["window", ""] = timer.seconds
    return len(texts) / timer.seconds, spent


def stage_rows(spent: dict) -> list[list]:
    """thread, stage, ms per round, % of the thread's window; waits last."""
    rounds = max(spent.get(("rounds", ""), 0.0), 1.0)
    rows = []
    for thread in THREADS:
        stages = {stage: seconds for (name, stage), seconds in spent.items() if name == thread and seconds > 0}
        window = sum(stages.values())  # the thread's time between the two scrapes
        order = [s for s in STAGES if s in stages] + sorted(s for s in stages if s not in STAGES)
        order = [s for s in order if not s.startswith("wait")] + [s for s in order if s.startswith("wait")]
        for stage in order:
            rows.append([thread, stage, 1000 * stages[stage] / rounds, f"{100 * stages[stage] / window:.0f}%"])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_corpus_flags(parser, limit=None)
    parser.add_argument("--chunk", type=int, default=16, help="texts per embedfleet request")
    parser.add_argument("--batch-sizes", default="64,128,256,512", help="batch sizes the bare loop sweeps")
    parser.add_argument("--repeat", type=int, default=3, help="alternating runs; each row keeps its best")
    parser.add_argument("--shape", default=None, help="the workers' --max-batch-tokens,--max-batch-size (default: "
                        "the bare loop's best batch size from the first sweep, times the max length in tokens): "
                        "pinned, as the start-up probe's pick on a busy box varies from run to run; 'probe' to probe")
    parser.add_argument("--baseline", type=Path, default=None,
                        help="another checkout (e.g. a worktree of main) whose worker runs as one more row")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()

    import torch
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    torch.set_num_threads(os.cpu_count() or 1)
    texts = load_corpus(args.corpus, args.limit)
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    shape = [] if args.shape == "probe" else None if args.shape is None else \
        ["--max-batch-tokens", args.shape.split(",")[0], "--max-batch-size", args.shape.split(",")[1]]
    print(f"{len(texts)} texts, {sum(map(len, texts)) / len(texts):.0f} chars on average; {describe_machine()}",
          flush=True)
    with tempfile.TemporaryDirectory(prefix="cpuside-") as folder:
        path = build_tiny(folder)
        tokenise, bare = Tokenise(path), BareLoop(path, "float32", "cpu")
        tokenise.run(texts[:256])  # warm-up
        # The peers at their best: with CPython's default thresholds a full collection walks torch's and
        # transformers' objects every few thousand encodings, and tokenising the corpus alone ran at half speed
        # every other call (17k vs 33k texts/s here). Frozen, those objects are not walked again. (The worker
        # itself, tokenising a round in calls of 64 texts, measured the same with and without: bench/history.md §15b.)
        settle_gc()
        best: dict[str, float] = {}
        sweeps: dict[int, float] = {}
        stages: dict[str, dict] = {}  # row -> (thread, stage) -> seconds, summed over the repeats
        seen: dict[str, list[float]] = {}  # row -> every repeat's rate (the median is reported too)
        fleets = {"fleet": None, **({"baseline": args.baseline} if args.baseline else {})}
        for repeat in range(args.repeat):  # rows alternate, and each keeps its best: the machine drifts
            seen.setdefault("tokenise", []).append(tokenise.run(texts))
            seen.setdefault("backend", []).append(tokenise.run_backend(texts))
            for bs, rate in sweep(bare, texts, batch_sizes).items():
                sweeps[bs] = max(sweeps.get(bs, 0.0), rate)
            if shape is None:  # the workers run at the bare loop's best batch size
                rows = max(sweeps, key=sweeps.get)
                shape = ["--max-batch-tokens", str(rows * bare.max_length), "--max-batch-size", str(rows)]
                print(f"  workers' shape: {' '.join(shape)}", flush=True)
            rates = {}
            for row, code in fleets.items():
                rates[row], spent = fleet(path, texts, args.chunk, shape, code)
                seen.setdefault(row, []).append(rates[row])
                total = stages.setdefault(row, {})
                for key, seconds in spent.items():
                    total[key] = total.get(key, 0.0) + seconds
            print(f"  [{repeat + 1}] tokenise {seen['tokenise'][-1]:.0f}, bare {max(sweeps.values()):.0f}, "
                  + ", ".join(f"{row} {rate:.0f}" for row, rate in rates.items()) + " texts/s", flush=True)
    best_bs, best["bare"] = max(sweeps.items(), key=lambda kv: kv[1])
    best.update({row: max(rates) for row, rates in seen.items()})
    middle = {row: statistics.median(rates) for row, rates in seen.items()}
    tok, loop = best["tokenise"], best["bare"]

    def line(label, row, value):
        return [label, value, middle.get(row, value), ratio(best[row], tok), ratio(middle.get(row, value),
                middle.get("tokenise", tok)), ratio(best[row], loop)]

    rows = [line(f"embedfleet end to end, {'this checkout' if row == 'fleet' else args.baseline} (1 worker, "
                 f"{args.chunk} texts/request)", row, best[row]) for row in fleets]
    print(table(["path", "texts/s (best)", "median", "x tokenise (best)", "x tokenise (median)", "x bare best"],
                rows + [line("tokenise alone (one batched call)", "tokenise", tok),
                        line("tokenise alone (the Rust backend's encode_batch, ids only)", "backend", best["backend"]),
                        line(f"bare loop, best bs {best_bs}", "bare", loop)],
                f"CPU side, tiny model (1 layer, hidden 32, MiniLM tokenizer), {len(texts)} texts, "
                f"{args.repeat} alternating runs (target: fleet >= 0.6x tokenise)"))
    for row, spent in stages.items():
        rounds = spent.get(("rounds", ""), 0.0)
        print(table(["thread", "stage", "ms/round", "% of the thread's time"], stage_rows(spent),
                    f"Where the {row} row's time goes, all its runs together: {rounds:.0f} rounds in "
                    f"{spent['window', '']:.2f} s ({len(texts) * args.repeat / max(rounds, 1):.0f} texts a round)"))
    if args.json:
        args.json.write_text(json.dumps({"texts": len(texts), "chunk": args.chunk, "rates": best, "runs": seen,
                                         "bare_sweep": sweeps, "bare_bs": best_bs,
                                         "stages": {row: {f"{t}/{s}": v for (t, s), v in spent.items()}
                                                    for row, spent in stages.items()}}, indent=1))


if __name__ == "__main__":
    main()
