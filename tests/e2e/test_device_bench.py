"""bench/device.sh dry-runs on the CPU (BENCH_DEVICE=cpu, the tiny shape, a few texts), so that the script a GPU
machine runs once cannot rot between those runs: every row and table comes out, the figures are sane."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.commands import ROOT
from tests.tinymodels import sample_texts


def test_device_sh_dry_run_on_cpu(tmp_path):
    corpus = tmp_path / "corpus.json"
    corpus.write_text(json.dumps(sample_texts(32, seed=7)))
    out = tmp_path / "out"
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(tmp_path), "BENCH_PYTHON": sys.executable,
           "BENCH_DEVICE": "cpu", "BENCH_SHAPES": "tiny", "BENCH_LIMIT": "32", "REPLICAS": "2",
           "BENCH_STEPS": "shapes", "BENCH_CORPUS": str(corpus), "OUT": str(out),
           "BENCH_MODELS": str(tmp_path / "models"), "STEP_SECONDS": "400"}
    done = subprocess.run(["bash", "bench/device.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=500)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    summary = (out / "summary.md").read_text()
    for row in ("bare loop, best bs", "embedfleet, 1 worker", "embedfleet, --replicas 2", "float32 (padded)"):
        assert row in summary, summary
    figures = json.loads((out / "shapes.json").read_text())
    tiny = figures["shapes"]["tiny"]
    assert figures["device"] == "cpu" and len(tiny["texts_s"]) == 3 and all(r > 0 for r in tiny["texts_s"].values())
    assert tiny["tokens_per_text"] > 1
    assert tiny["fidelity_float32"]["min"] > 0.99999  # the worker's vectors are sentence-transformers'
