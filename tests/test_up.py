"""`embedfleet up` as a user runs it: one command brings up Redis, a worker and the gateway; Ctrl-C stops all."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
import urllib.request

import numpy as np
import pytest
from sentence_transformers import SentenceTransformer

from common.redisserver import free_port
from producer import Producer


@pytest.fixture
def fleet(tmp_path):
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "producer.cli", "up", "--redis-port", "0", "--port", str(port),
         "--data-dir", str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if "Ctrl-C stops everything" in line:
            break
    output = "".join(lines)
    if "Ctrl-C stops everything" not in output:
        proc.kill()
        pytest.fail(f"embedfleet up did not come up:\n{output}")
    redis_url = re.search(r"Redis on (redis://\S+)", output).group(1)
    yield proc, redis_url, port, output, tmp_path
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def test_up_serves_python_and_http_clients_and_stops_cleanly_on_ctrl_c(fleet, minilm_path):
    proc, redis_url, port, output, data_dir = fleet
    assert "all-MiniLM-L6-v2" in output and f"http://127.0.0.1:{port}/v1/embeddings" in output
    texts = ["the fleet is up", "one command starts Redis, a worker and the gateway"]
    reference = SentenceTransformer(minilm_path, device="cpu").encode(texts)

    with Producer(redis_url) as producer:
        np.testing.assert_allclose(producer.embed(texts), reference, atol=1e-5)

    body = json.dumps({"model": "all-MiniLM-L6-v2", "input": texts}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/embeddings", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        data = json.load(response)["data"]
    np.testing.assert_allclose([d["embedding"] for d in data], reference, atol=1e-5)

    assert (data_dir / "redis").is_dir()  # the embedded Redis keeps its AOF under --data-dir
    proc.send_signal(signal.SIGINT)
    rest = proc.communicate(timeout=60)[0]
    assert proc.returncode == 0, rest
    assert "embedfleet: stopped" in rest
    with pytest.raises(Exception):
        Producer(redis_url).models()  # the embedded Redis is gone with it
