"""`embedfleet up` as a user runs it: its own Redis, workers and gateway; found by other commands; Ctrl-C
stops everything in order. Every `up` here is a real process tree with XDG_CACHE_HOME in a temp folder, so
the state file it publishes is the test's, never the user's."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import redis
from rq import SimpleWorker
from sentence_transformers import SentenceTransformer

from common import keys
from common.capabilities import ModelCapabilities
from common.redisserver import RedisServer, free_port
from common.serializer import MsgpackSerializer
from producer import Producer
from tests.commands import assert_one_line_error, clean_env, embedfleet, socket_listening

ERROR_LINE = re.compile(r"\b(ERROR|WARNING|CRITICAL)\b|Traceback|exited with|could not|unreachable")


class Up:
    """One `embedfleet up` process; its output (stdout and stderr together) is collected by a thread."""

    def __init__(self, *args: str, env: dict):
        self.proc = subprocess.Popen([sys.executable, "-m", "producer.cli", "up", *args], env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        self.ready = threading.Event()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)
            if "Ctrl-C stops everything" in line:
                self.ready.set()
        self.ready.set()  # ended: wait_up() tells which

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def wait_up(self) -> Up:
        self.ready.wait(240)
        if "Ctrl-C stops everything" not in self.output:
            self.kill()
            pytest.fail(f"embedfleet up did not come up:\n{self.output}")
        return self

    @property
    def redis_url(self) -> str:
        return re.search(r"is up: model '.*' on (redis://\S+)", self.output).group(1)

    def stop(self, sig=signal.SIGINT) -> int:
        self.proc.send_signal(sig)
        code = self.proc.wait(90)
        self.reader.join(10)
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_up_serves_is_found_without_flags_and_ctrl_c_stops_everything_in_order(tmp_path, minilm_path):
    env = clean_env(tmp_path / "cache")
    port = free_port()
    up = Up("--redis-port", "0", "--port", str(port), "--data-dir", str(tmp_path / "data"), env=env)
    try:
        up.wait_up()
        output = up.output
        assert "all-MiniLM-L6-v2" in output and f"http://127.0.0.1:{port}/v1/embeddings" in output
        assert f"rq info --url {up.redis_url} --serializer common.serializer.MsgpackSerializer" in output
        texts = ["the fleet is up", "one command starts Redis, a worker and the gateway"]
        reference = SentenceTransformer(minilm_path, device="cpu").encode(texts)
        with Producer(up.redis_url) as producer:
            np.testing.assert_allclose(producer.embed(texts), reference, atol=1e-5)
        body = json.dumps({"model": "all-MiniLM-L6-v2", "input": texts}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/embeddings", data=body,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as response:
            data = json.load(response)["data"]
        np.testing.assert_allclose([d["embedding"] for d in data], reference, atol=1e-5)

        # No flag, no EMBEDFLEET_REDIS_URL: `status` and `embed` find this fleet through its state file.
        status = embedfleet("status", "--json", env=env)
        assert status.returncode == 0, status.stderr
        fleet = json.loads(status.stdout)
        assert fleet["redis"] == up.redis_url and fleet["models"][0]["name"] == "all-MiniLM-L6-v2"
        assert fleet["models"][0]["live_workers"] == 1
        (tmp_path / "texts.txt").write_text("\n".join(texts) + "\n")
        embedded = embedfleet("embed", str(tmp_path / "texts.txt"), str(tmp_path / "out.npy"), env=env)
        assert embedded.returncode == 0, embedded.stderr
        np.testing.assert_allclose(np.load(tmp_path / "out.npy"), reference, atol=1e-5)

        [state_file] = (tmp_path / "cache" / "embedfleet" / "up").glob("*.json")
        pids = json.loads(state_file.read_text())["pids"]
        assert (tmp_path / "data" / "redis").is_dir()  # the Redis keeps its AOF under --data-dir
        assert up.stop(signal.SIGINT) == 0, up.output
    finally:
        up.kill()
    lines = up.output[len(output):].splitlines()

    def first(text: str) -> int:
        return next(i for i, line in enumerate(lines) if text in line)

    # In order: the gateway, then the worker (which withdrew its advert: Redis was still up), then Redis.
    assert first("stopping the gateway") < first("stopping 1 worker(s)") < first("withdrew model") \
        < first("stopping Redis") < first("embedfleet: stopped"), up.output
    assert not [line for line in lines if ERROR_LINE.search(line)], up.output
    assert not [pid for pid in [pids["redis"], pids["gateway"], *pids["workers"]] if alive(pid)]
    assert not state_file.exists()
    with pytest.raises(redis.ConnectionError):
        redis.Redis.from_url(up.redis_url).ping()


def plant_stale_advert(data_dir: Path, model: str) -> None:
    """What a worker killed without a goodbye leaves in an AOF: a fresh-looking advert and rq registration."""
    with RedisServer(data_dir / "redis", appendonly=True) as server:
        client = redis.Redis.from_url(server.url)
        caps = ModelCapabilities(name=model, max_model_len=48, embedding_size=32, vocab_size=1000)
        client.set(keys.model_key(model), caps.encode(), ex=keys.ADVERTISE_TTL)
        client.zadd(keys.model_workers_key(model), {"dead-worker": time.time()})
        client.sadd(keys.MODELS_KEY, model)
        SimpleWorker([keys.queue_name(model)], name="dead-worker", connection=client,
                     serializer=MsgpackSerializer).register_birth()
        client.close()


def test_two_ups_side_by_side_and_a_stale_advert_fools_neither(tmp_path, bert_mean):
    env = clean_env(tmp_path / "cache")
    plant_stale_advert(tmp_path / "b", "tiny")
    ports = [free_port(), free_port()]
    ups = [Up("--redis-port", "0", "--port", str(port), "--data-dir", str(tmp_path / name), "--model", bert_mean,
              "--served-model-name", "tiny", env=env) for name, port in zip("ab", ports)]
    try:
        for up in ups:
            up.wait_up()
        # The moment each said "is up", its own worker had advertised, and nothing of an earlier run counts.
        urls = [up.redis_url for up in ups]
        assert urls[0] != urls[1]
        for url, port in zip(urls, ports):
            client = redis.Redis.from_url(url)
            members = [m.decode() for m in client.zrange(keys.model_workers_key("tiny"), 0, -1)]
            assert len(members) == 1 and members[0].startswith("up-"), members
            names = [w.name for w in SimpleWorker.all(connection=client, serializer=MsgpackSerializer)]
            assert names == members  # the dead worker's rq registration is gone too (`rq info` agrees)
            client.close()
            with Producer(url) as producer:
                assert producer.embed(["side by side"], "tiny").shape == (1, 32)
            request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/embeddings",
                                             data=json.dumps({"input": "side by side"}).encode(),
                                             headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=60) as response:
                assert len(json.load(response)["data"][0]["embedding"]) == 32
        for up in ups:
            assert up.stop(signal.SIGTERM) == 0, up.output
            assert not [line for line in up.lines if ERROR_LINE.search(line)], up.output
    finally:
        for up in ups:
            up.kill()


def test_up_refuses_a_port_held_by_a_foreign_redis_and_touches_nothing_there(tmp_path, redis_server,
                                                                              redis_client):
    redis_client.set("foreign", "kept")
    run_id = redis_client.info("server")["run_id"]
    done = embedfleet("up", "--redis-port", str(redis_server.port), "--port", str(free_port()),
                      "--data-dir", str(tmp_path), env=clean_env(tmp_path / "cache"))
    assert_one_line_error(done, 1, f"port {redis_server.port} is already in use", "--redis-port")
    assert "is up" not in done.stdout
    assert redis_client.keys("*") == [b"foreign"] and redis_client.info("server")["run_id"] == run_id
    assert not list((tmp_path / "cache").glob("**/*.json"))  # nothing published either


def test_up_reports_a_taken_gateway_port_before_starting_anything(tmp_path):
    with socket_listening() as port:
        done = embedfleet("up", "--redis-port", "0", "--port", str(port), "--data-dir", str(tmp_path / "data"),
                          env=clean_env(tmp_path / "cache"))
    assert_one_line_error(done, 1, f"gateway port {port}", "--port")
    assert "Redis on" not in done.stdout and not (tmp_path / "data" / "redis").exists()
