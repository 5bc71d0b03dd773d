"""torch loads only with a real model (issue 50): the serving pipeline imports without it, and a null-model worker
process starts, serves and stops without ever importing it (`python -X importtime` lists every module a process
imports, late imports inside functions included, on stderr)."""

from __future__ import annotations

import signal
import subprocess
import sys

import numpy as np

from embedfleet import Producer
from tests.commands import ROOT, advertised, clean_env

HEAVY = ("torch", "transformers")


def test_the_serving_pipeline_and_the_engine_on_the_null_model_run_without_torch(tmp_path):
    code = (
        "import sys\n"
        "import embedfleet.worker.serving.pipeline\n"
        "assert not {'torch', 'transformers'} & set(sys.modules), 'the pipeline loaded torch'\n"
        "from embedfleet.common.request import EmbedRequest\n"
        "from embedfleet.worker.engine.engine import Engine\n"
        "from embedfleet.worker.engine.models.nullmodel import NullModel\n"
        "[result] = Engine(NullModel('null:4')).run([EmbedRequest(model='null:4', inputs=['a', 'b'])])\n"
        "assert result.ok and result.embeddings.shape == (2, 4), result\n"
        "assert not {'torch', 'transformers'} & set(sys.modules), 'a round on the null model loaded torch'\n"
        "print('ok')\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env=clean_env(tmp_path))
    assert done.returncode == 0 and done.stdout == "ok\n", done.stderr[-3000:]


def test_a_null_model_worker_starts_and_serves_without_importing_torch(redis_url, tmp_path):
    log = tmp_path / "stderr.txt"
    with open(log, "w") as stderr:
        worker = subprocess.Popen(
            [sys.executable, "-X", "importtime", "-m", "embedfleet.worker", "--redis-url", redis_url, "--model",
             "null:4", "--served-model-name", "plain", "--poll-timeout", "1"],
            cwd=ROOT, env=clean_env(tmp_path), stdout=subprocess.DEVNULL, stderr=stderr)
    try:
        with Producer(redis_url) as producer:
            advertised(producer, "plain", worker, timeout=60)
            vectors = producer.embed(["a text", "another"], model="plain", timeout=30)
        np.testing.assert_allclose(vectors, np.full((2, 4), 0.5), rtol=1e-6)
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(60) == 0, log.read_text()[-3000:]
    finally:
        worker.kill()
        worker.wait(10)
    imported = [line.rsplit("|", 1)[-1].strip() for line in log.read_text().splitlines()
                if line.startswith("import time:")]
    assert "embedfleet.worker.serving.pipeline" in imported and "numpy" in imported  # the list is complete
    assert not [name for name in imported if name.split(".")[0] in HEAVY]
