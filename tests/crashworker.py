"""A real worker process for fault tests: the null model, except that an input "die" SIGKILLs the process
in the forward pass and "hang" blocks it there (a device call that never returns). Vectors are a
deterministic function of the text, so a clean run can be compared with a faulty one. `workers()` starts some.

    python -m tests.crashworker REDIS_URL MODEL [--lease S] [--watchdog S] [--max-jobs N] [--rq-records lean|full]
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import logging
import os
import signal
import subprocess
import sys
import time

import numpy as np

from embedfleet.common.redisclient import connect
from embedfleet.common.request import EmbedRequest
from embedfleet.worker.engine.engine import Engine
from embedfleet.worker.engine.models.nullmodel import NullModel
from embedfleet.worker.engine.seam import Prepared
from tests.commands import ROOT
from tests.harness import worker as build

DIM = 8
DIE, HANG = -1, -2
MODEL = "crashy"  # the model `workers()` serve
LEASE = 2.0  # their --lease


def token(text: str) -> int:
    if text == "die":
        return DIE
    if text == "hang":
        return HANG
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "little")


def vector(text_token: int) -> np.ndarray:
    """The vector of one text: fixed per text, unit length."""
    rows = np.random.default_rng(text_token).standard_normal(DIM).astype(np.float32)
    return rows / np.linalg.norm(rows)


class CrashModel(NullModel):
    def __init__(self, name: str):
        super().__init__(f"null:{DIM}", name)

    def prepare(self, request: EmbedRequest) -> Prepared:
        return Prepared([[token(t)] if isinstance(t, str) else [0] for t in request.inputs])

    def embed(self, token_lists, prompt_lengths=None) -> np.ndarray:
        flat = [t[0] for t in token_lists]
        if DIE in flat:
            os.kill(os.getpid(), signal.SIGKILL)
        if HANG in flat:
            time.sleep(3600)
        time.sleep(0.002 * len(flat))  # a little device time, so that a kill can land mid-round
        return np.stack([vector(t) for t in flat])


@contextlib.contextmanager
def workers(redis_url: str, count: int, *extra: str):
    """`count` crash-worker processes; killed (SIGKILL) on the way out, whatever the test did."""
    procs = [subprocess.Popen([sys.executable, "-m", "tests.crashworker", redis_url, MODEL, "--lease", str(LEASE),
                               *extra], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
             for _ in range(count)]
    try:
        yield procs
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)
            proc.stderr.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("redis_url")
    parser.add_argument("model")
    parser.add_argument("--lease", type=float, default=1.5)
    parser.add_argument("--watchdog", type=float, default=None)
    parser.add_argument("--max-jobs", type=int, default=16)
    parser.add_argument("--drain-timeout", type=float, default=30.0)
    parser.add_argument("--rq-records", default="lean")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    engine = Engine(CrashModel(args.model), max_batch_tokens=64, max_batch_size=64)
    watchdog = {"watchdog_seconds": args.watchdog, "watchdog_per_token": 0.0} if args.watchdog else {}
    worker = build(engine, connect(args.redis_url), max_jobs=args.max_jobs, lease_seconds=args.lease,
                   drain_timeout=args.drain_timeout, rq_records=args.rq_records, **watchdog)
    print(f"crashworker {worker.name} serving {args.model}")  # not flushed: block-buffered into a pipe
    worker.work()


if __name__ == "__main__":
    main()
