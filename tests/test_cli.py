"""The `embedfleet` command line against a real worker: bulk `embed` of a file, `status`, flags and env."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

from producer import Producer
from worker.config import WorkerSettings
from worker.queue import BatchWorker


@pytest.fixture
def serving(minilm_engine, redis_client):
    worker = BatchWorker(minilm_engine, redis_client, poll_timeout=1)
    worker.advertiser.advertise()
    thread = threading.Thread(target=worker.work, daemon=True)
    thread.start()
    yield
    worker.stop()
    thread.join(30)


def embedfleet(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "producer.cli", *args], capture_output=True, text=True,
                          timeout=120, env={**os.environ, **(env or {})})


@pytest.mark.parametrize("suffix", [".txt", ".json", ".jsonl"])
def test_embed_a_file_into_npy_in_order(tmp_path, redis_url, serving, suffix):
    texts = [f"line number {i} of a bulk file" for i in range(150)]
    source = tmp_path / f"texts{suffix}"
    if suffix == ".txt":
        source.write_text("\n".join(texts) + "\n")
    elif suffix == ".json":
        source.write_text(json.dumps(texts))
    else:
        source.write_text("\n".join(json.dumps(t) for t in texts))
    out = tmp_path / "out.npy"

    done = embedfleet("embed", str(source), str(out), "--chunk", "32", env={"EMBEDFLEET_REDIS_URL": redis_url})

    assert done.returncode == 0, done.stderr
    assert "embedded 150 texts" in done.stdout
    vectors = np.load(out)
    with Producer(redis_url) as producer:
        expected = producer.embed(texts[:5] + texts[-5:])
    np.testing.assert_allclose(np.concatenate([vectors[:5], vectors[-5:]]), expected, atol=1e-5)


def test_embed_refuses_an_empty_file_and_status_lists_the_fleet(tmp_path, redis_url, serving):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n")
    done = embedfleet("embed", str(empty), str(tmp_path / "out.npy"), "--redis-url", redis_url)
    assert done.returncode != 0 and "no texts to embed" in done.stderr

    status = embedfleet("status", "--redis-url", redis_url)
    assert status.returncode == 0, status.stderr
    assert "minilm: 1 live worker(s), queue depth 0" in status.stdout and "dim 384" in status.stdout


def test_unknown_command_and_help():
    assert embedfleet("frobnicate").returncode == 2
    help_text = embedfleet("--help").stdout
    assert all(word in help_text for word in ("up", "worker", "gateway", "embed", "status"))


def test_worker_settings_come_from_flags_over_env(monkeypatch):
    monkeypatch.setenv("EMBEDFLEET_MAX_BATCH_TOKENS", "1024")
    monkeypatch.setenv("EMBEDFLEET_REDIS_URL", "redis://env:6379/0")
    settings = WorkerSettings.from_args(["--redis-url", "redis://flag:6379/0", "--matryoshka-dims", "64,128",
                                         "--burst"], "test", "")
    assert settings.redis_url == "redis://flag:6379/0" and settings.max_batch_tokens == 1024
    assert settings.matryoshka_dims == [64, 128] and settings.burst is True
    with pytest.raises(SystemExit):
        WorkerSettings.from_args(["--dtype", "fp16"], "test", "")
