"""MiniLM forward passes/s by torch thread count and OpenMP wait policy, quiet and beside busy loops.

Each configuration runs in a fresh process (OMP_WAIT_POLICY is read when libgomp loads, at `import torch`),
which times windows quiet and beside `--hogs` busy loops in turn, `--repeats` times; a figure is the median
of its windows. "PASSIVE after import" sets the variable
after `import torch`, to show it then does nothing; the GOMP_SPINCOUNT rows spin that many times (libgomp: about
100,000 a millisecond, CPU-dependent) before a waiting thread sleeps.

    PYTHONPATH=. .venv/bin/python bench/threads.py [--hogs 2] [--seconds 2] [--repeats 2] [--tokens 32] [--only LABELS]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from bench._common import describe_machine, median, model_path, table

CONFIGS = [  # (label, threads, OMP_WAIT_POLICY before import, after import, GOMP_SPINCOUNT)
    ("2 (all cores, torch's default)", 2, None, None, None),
    ("1", 1, None, None, None),
    ("2, PASSIVE", 2, "PASSIVE", None, None),
    ("1, PASSIVE", 1, "PASSIVE", None, None),
    ("2, PASSIVE set after import torch", 2, None, "PASSIVE", None),
    ("2, PASSIVE, GOMP_SPINCOUNT=1000", 2, "PASSIVE", None, "1000"),
    ("2, PASSIVE, GOMP_SPINCOUNT=3000", 2, "PASSIVE", None, "3000"),
    ("2, PASSIVE, GOMP_SPINCOUNT=10000", 2, "PASSIVE", None, "10000"),
]


def passes_per_s(module, rows: int, tokens: int, seconds: float) -> float:
    import torch

    ids = torch.full((rows, tokens), 1000, dtype=torch.long)
    mask = torch.ones_like(ids)
    module(input_ids=ids, attention_mask=mask)  # warm-up
    passes, began = 0, time.perf_counter()
    while time.perf_counter() - began < seconds:
        module(input_ids=ids, attention_mask=mask)
        passes += 1
    return passes / (time.perf_counter() - began)


def child(threads: int, late: str | None, args) -> None:
    """Passes/s of 1 and 32 rows, quiet then beside `args.hogs` busy loops, `args.repeats` times; prints JSON."""
    import torch
    from transformers import AutoModel

    if late:
        os.environ["OMP_WAIT_POLICY"] = late  # too late: libgomp read its environment at import
    torch.set_num_threads(threads)
    module = AutoModel.from_pretrained(model_path()).eval()
    got: dict[str, list[float]] = {}
    with torch.inference_mode():
        for _ in range(args.repeats):
            for loaded in (False, True):
                hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                        for _ in range(args.hogs if loaded else 0)]
                try:
                    for rows in (1, 32):
                        got.setdefault(f"{'loaded' if loaded else 'quiet'} {rows}", []).append(
                            passes_per_s(module, rows, args.tokens, args.seconds))
                finally:
                    for hog in hogs:
                        hog.kill()
                        hog.wait()
    print(json.dumps({key: median(values) for key, values in got.items()}))


def run(threads: int, early: str | None, late: str | None, spin: str | None, args) -> dict[str, float]:
    env = {key: value for key, value in os.environ.items() if key not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    if early:
        env["OMP_WAIT_POLICY"] = early
    if spin:
        env["GOMP_SPINCOUNT"] = spin
    cmd = [sys.executable, __file__, "--child", str(threads), "--late", late or "", "--tokens", str(args.tokens),
           "--seconds", str(args.seconds), "--repeats", str(args.repeats), "--hogs", str(args.hogs)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hogs", type=int, default=2, help="busy loops running through the loaded columns")
    parser.add_argument("--seconds", type=float, default=2.0, help="timed seconds per shape and window")
    parser.add_argument("--repeats", type=int, default=2, help="quiet/loaded windows per configuration")
    parser.add_argument("--tokens", type=int, default=32, help="tokens per row")
    parser.add_argument("--only", default="", help="';'-separated labels of the configurations to run (all)")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--late", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.late or None, args)
        return
    print(describe_machine(), f"affinity {len(os.sched_getaffinity(0))}", flush=True)
    rows = []
    for label, threads, early, late, spin in CONFIGS:
        if args.only and label not in args.only.split(";"):
            continue
        got = run(threads, early, late, spin, args)
        rows.append([label, *(f"{got[key]:.1f}" for key in ("quiet 1", "quiet 32", "loaded 1", "loaded 32"))])
        print(" ", rows[-1], flush=True)
    print(table(["torch threads, OMP_WAIT_POLICY", "quiet 1 row", "quiet 32 rows", f"{args.hogs} hogs 1 row",
                 f"{args.hogs} hogs 32 rows"], rows,
                f"MiniLM forward passes/s, {args.tokens} tokens/row (median of {args.repeats} windows)"))


if __name__ == "__main__":
    main()
