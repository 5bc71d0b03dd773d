"""A stand-in for `python -m worker --model null:N`, until the worker has its own null model (issue 7, item 4).

    PYTHONPATH=. python bench/_nullworker.py --redis-url URL --model null:384 [--served-model-name null]

Today's BatchWorker with an engine that answers every request with a fixed unit vector per input, no tokenizer,
no compute. `bench/nullmodel.py --stand-in` runs it in place of the real worker; it measures today's queue path,
not the lead's.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common.capabilities import ModelCapabilities
from common.redisclient import connect
from common.result import Result
from worker.queue import BatchWorker


class NullEngine:
    """Every input gets the same unit vector of `size`; nothing is tokenised or computed."""

    forward_passes = 0

    def __init__(self, name: str, size: int):
        self.caps = ModelCapabilities(name=name, max_model_len=512, embedding_size=size, vocab_size=1)
        self.row = np.zeros((1, size), np.float32)
        self.row[0, 0] = 1.0

    def run(self, requests):
        return [Result.success(r.id, self.caps.name, np.repeat(self.row, len(r.inputs), axis=0), "float32",
                               "native", len(r.inputs)) for r in requests]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--model", required=True, help="null:SIZE")
    parser.add_argument("--served-model-name", default="null")
    parser.add_argument("--max-jobs", type=int, default=64)
    args, _ = parser.parse_known_args()
    kind, _, size = args.model.partition(":")
    if kind != "null" or not size.isdigit():
        raise SystemExit(f"--model must be null:SIZE, got {args.model!r}")
    logging.basicConfig(level=logging.WARNING)
    BatchWorker(NullEngine(args.served_model_name, int(size)), connect(args.redis_url),
                max_jobs=args.max_jobs, poll_timeout=1).work()


if __name__ == "__main__":
    main()
