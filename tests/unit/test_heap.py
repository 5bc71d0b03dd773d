"""The worker's malloc thresholds (worker/engine/heap.py): a round's large blocks, freed and allocated again,
reuse the heap's pages instead of new ones from the kernel (counted as the process's page faults); an operator's
own malloc settings are left alone."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

from tests.commands import ROOT
from embedfleet.worker.engine import heap

# 50 rounds, after `setup`, of what a worker's round does: several large blocks alive at once (vectors, their
# normalised copy, result blobs, the finish pipeline's bytes), all freed at its end; prints the page faults
# they took. (One block at a time would not show it: glibc's moving threshold keeps a lone block's pages.)
ROUNDS = """
import resource, numpy as np
{setup}
np.ones(1 << 19, np.float32).sum()  # numpy's own first use
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(50):
    blocks = [np.ones(1 << 19, np.float32) for _ in range(4)]  # 4 x 2 MiB, each written whole
    del blocks
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""
TUNED = "import os; from embedfleet.worker.engine import heap; print(heap.keep_freed_memory(os.environ))"

glibc_only = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc only")


def faults(setup: str, **environ: str) -> tuple[list[str], int]:
    env = {name: value for name, value in os.environ.items() if name not in heap.OPERATOR_SETTINGS}
    done = subprocess.run([sys.executable, "-c", ROUNDS.format(setup=setup)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env={**env, "PYTHONPATH": str(ROOT), **environ})
    assert done.returncode == 0, done.stderr[-2000:]
    *said, count = done.stdout.split()
    return said, int(count)


@glibc_only
def test_blocks_freed_and_allocated_again_reuse_the_heap():
    said, tuned = faults(TUNED)
    _, default = faults("")
    assert said == ["True"]
    # glibc's defaults: the pages of the round's blocks go back at its end, 512 fresh pages a block each round
    # (up to 102,400 faults); kept: the first round's only
    assert default > 20_000 and tuned < default / 20, (tuned, default)


@glibc_only
def test_an_operators_own_malloc_settings_stay():
    said, kept = faults(TUNED, MALLOC_TRIM_THRESHOLD_="131072")
    assert said == ["False"]
    assert kept > 20_000  # the operator's 128 KiB trim threshold rules: every block's pages went back
    assert heap.keep_freed_memory({"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=1"}) is False
