"""The `embedfleet` command line against a real worker: bulk `embed` of a file, `status`, flags and env."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import numpy as np
import pytest

from embedfleet.common.protocol.keys import model_workers_key, worker_info_key
from embedfleet.common.redisserver import free_port
from embedfleet import Producer
from tests.commands import assert_one_line_error, clean_env, embedfleet, socket_listening
from embedfleet.worker.serving.config import WorkerSettings


@pytest.fixture
def serving(fleet, minilm_engine):
    fleet.serve(minilm_engine, info={"device": "cpu", "dtype": "float32", "max_batch_tokens": 8192,
                                     "max_batch_size": 256, "budget_source": "flags", "max_jobs": 64})


@pytest.fixture
def env(tmp_path) -> dict:
    return clean_env(tmp_path / "cache")


def dead_redis() -> str:
    return f"redis://127.0.0.1:{free_port()}/0"


@pytest.mark.parametrize("suffix", [".txt", ".json", ".jsonl"])
def test_embed_a_file_into_npy_in_order(tmp_path, redis_url, serving, suffix, env):
    texts = [f"line number {i} of a bulk file" for i in range(150)]
    source = tmp_path / f"texts{suffix}"
    if suffix == ".txt":
        source.write_text("\n".join(texts) + "\n")
    elif suffix == ".json":
        source.write_text(json.dumps(texts))
    else:
        source.write_text("\n".join(json.dumps(t) for t in texts))
    out = tmp_path / "out.npy"

    done = embedfleet("embed", str(source), str(out), "--chunk", "32", env={**env, "EMBEDFLEET_REDIS_URL": redis_url})

    assert done.returncode == 0, done.stderr
    assert "embedded 150 texts" in done.stdout
    vectors = np.load(out)
    with Producer(redis_url) as producer:
        expected = producer.embed(texts[:5] + texts[-5:])
    np.testing.assert_allclose(np.concatenate([vectors[:5], vectors[-5:]]), expected, atol=1e-5)


def test_without_a_fleet_embed_and_status_name_the_redis_they_looked_at(tmp_path, redis_url, env):
    texts = tmp_path / "texts.txt"
    texts.write_text("hello\n")
    done = embedfleet("embed", str(texts), str(tmp_path / "out.npy"), "--redis-url", redis_url, env=env)
    assert_one_line_error(done, 1, f"no model is served on Redis {redis_url}", "`make up`", "--redis-url")
    status = embedfleet("status", env={**env, "EMBEDFLEET_REDIS_URL": redis_url})
    assert status.returncode == 0, status.stderr
    assert status.stdout.startswith(f"Redis {redis_url}\n"), status.stdout
    assert "no model is served there (no live worker): start the fleet with `make up`" in status.stdout


def test_embed_refuses_an_empty_file_and_status_lists_the_fleet(tmp_path, redis_url, redis_client, serving, env):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n")
    done = embedfleet("embed", str(empty), str(tmp_path / "out.npy"), "--redis-url", redis_url, env=env)
    assert_one_line_error(done, 1, "no texts to embed")

    status = embedfleet("status", "--wide", "--redis-url", redis_url, env=env)  # the model's shape is --wide's
    assert status.returncode == 0, status.stderr
    assert "minilm" in status.stdout and "384 / 256 / mean" in status.stdout
    assert "cpu" in status.stdout and "float32" in status.stdout and "8192 tok / 256 rows" in status.stdout
    # an advert is input too: a live worker whose facts are garbage is left out, never a crash
    redis_client.zadd(model_workers_key("minilm"), {"forged": time.time()})
    redis_client.set(worker_info_key("forged"), b"\xc1 not msgpack")
    status = embedfleet("status", "--redis-url", redis_url, "--json", env=env)
    assert status.returncode == 0, status.stderr
    [model] = json.loads(status.stdout)["models"]
    assert model["live_workers"] == 1 and "forged" not in status.stdout


def test_an_over_long_line_is_named_with_the_flag_and_the_other_lines_are_still_embedded(tmp_path, redis_url,
                                                                                        serving, env):
    lines = [f"short line {i}" for i in range(6)]
    lines[3] = "a very long line " * 200  # past MiniLM's 256 tokens
    source, out = tmp_path / "texts.txt", tmp_path / "out.npy"
    source.write_text("\n".join(lines) + "\n")
    done = embedfleet("embed", str(source), str(out), "--chunk", "2", "--redis-url", redis_url, env=env)
    assert_one_line_error(done, 1, f"{source}:4 has", "--truncate-prompt-tokens -1", "not written")
    assert f"{source}:3" not in done.stderr and not out.exists()

    done = embedfleet("embed", str(source), str(out), "--chunk", "2", "--truncate-prompt-tokens", "-1",
                      "--redis-url", redis_url, env=env)
    assert done.returncode == 0, done.stderr
    assert np.load(out).shape == (6, 384)


def test_unknown_command_and_help(env):
    assert_one_line_error(embedfleet("frobnicate", env=env), 2, "unknown command 'frobnicate'")
    help_text = embedfleet("--help", env=env).stdout
    assert all(word in help_text for word in ("up", "worker", "gateway", "embed", "status"))


@pytest.mark.parametrize("command", ["up", "worker", "gateway", "embed", "status"])
def test_every_command_has_help_and_one_line_usage_errors(command, env):
    done = embedfleet(command, "--help", env=env)
    assert done.returncode == 0 and done.stdout.startswith(f"usage: embedfleet {command}"), done.stderr
    assert "--redis-url" in done.stdout and "--debug" in done.stdout
    files = ["texts.txt", "out.npy"] if command == "embed" else []
    assert_one_line_error(embedfleet(command, *files, "--no-such-flag", env=env), 2, "--no-such-flag", "--help")


def test_worker_help_is_short_in_sections_and_hides_the_internal_replica_flag(env):
    done = embedfleet("worker", "--help", env={**env, "COLUMNS": "100"})
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) < 100 and max(map(len, lines)) <= 100, done.stdout
    assert lines[0] == "usage: embedfleet worker [options]"
    for section in ("model:", "speed: batches, threads, processes:", "requests:", "reliability:", "vector cache:",
                    "logs, metrics and traces:", "Redis:"):
        assert section in lines, section
    assert "--replicas N" in done.stdout and not re.search(r"--replica\b(?!s)", done.stdout)
    assert "EMBEDFLEET_REDIS_URL" in lines[-2] + lines[-1]  # the variables, said once
    # hidden, not gone: the --replicas supervisor still hands it to its children
    assert WorkerSettings.from_args(["--replica", "2/4"], "embedfleet worker", "").replica == "2/4"


@pytest.mark.parametrize("command", ["status", "embed", "worker", "up"])
def test_redis_down_is_one_line_and_exit_1(command, tmp_path, env):
    texts = tmp_path / "texts.txt"
    texts.write_text("hello\n")
    args = {"embed": [str(texts), str(tmp_path / "out.npy")], "up": ["--no-gateway"]}.get(command, [])
    done = embedfleet(command, *args, "--redis-url", dead_redis(), env=env)
    assert_one_line_error(done, 1, "Redis is unreachable", "embedfleet up", "--redis-url")


def test_debug_shows_the_traceback(env):
    done = embedfleet("status", "--redis-url", dead_redis(), "--debug", env=env)
    assert done.returncode == 1 and "Traceback" in done.stderr


def test_missing_file_and_unknown_model_are_one_line_and_exit_1(tmp_path, redis_url, env):
    assert_one_line_error(embedfleet("embed", str(tmp_path / "nope.txt"), str(tmp_path / "out.npy"),
                                     "--redis-url", redis_url, env=env), 1, "no such file", "nope.txt")
    texts = tmp_path / "texts.txt"
    texts.write_text("hello\n")
    assert_one_line_error(embedfleet("embed", str(texts), str(tmp_path / "out.npy"), "--model", "nope",
                                     "--redis-url", redis_url, env=env), 1, "model 'nope'", "embedfleet status")
    missing = str(tmp_path / "no-model")
    assert_one_line_error(embedfleet("worker", "--model", missing, "--redis-url", redis_url, env=env), 1,
                          f"no model folder at {missing}")
    assert_one_line_error(embedfleet("up", "--model", missing, "--redis-url", redis_url, "--no-gateway",
                                     env=env), 1, f"no model folder at {missing}")


def test_gateway_warns_about_a_dead_redis_and_refuses_a_taken_port(env):
    port = free_port()
    gateway = subprocess.Popen([sys.executable, "-m", "embedfleet.producer.cli", "gateway", "--redis-url", dead_redis(),
                                "--port", str(port)], env=env, stderr=subprocess.PIPE, text=True)
    lines = []
    try:
        for line in gateway.stderr:
            lines.append(line)
            if "startup complete" in line:
                break
    finally:
        gateway.terminate()
        gateway.wait(30)
    assert [line for line in lines if "WARNING" in line and "unreachable" in line], lines
    with socket_listening() as held:
        assert_one_line_error(embedfleet("gateway", "--port", str(held), env=env), 1, f"port {held}", "--port")


def test_worker_settings_come_from_flags_over_env(monkeypatch):
    monkeypatch.setenv("EMBEDFLEET_MAX_BATCH_TOKENS", "1024")
    monkeypatch.setenv("EMBEDFLEET_REDIS_URL", "redis://env:6379/0")
    settings = WorkerSettings.from_args(["--redis-url", "redis://flag:6379/0", "--matryoshka-dims", "64,128",
                                         "--burst"], "test", "")
    assert settings.redis_url == "redis://flag:6379/0" and settings.max_batch_tokens == 1024
    assert settings.matryoshka_dims == [64, 128] and settings.burst is True
    with pytest.raises(SystemExit):
        WorkerSettings.from_args(["--dtype", "fp16"], "test", "")
