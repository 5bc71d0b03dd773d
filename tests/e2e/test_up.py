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
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import redis
from rq import SimpleWorker
from sentence_transformers import SentenceTransformer

from embedfleet.common.capabilities import ModelCapabilities
from embedfleet.common.policy import ADVERTISE_TTL
from embedfleet.common.protocol import keys
from embedfleet.common.redisserver import RedisServer, free_port
from embedfleet.common.serializer import MsgpackSerializer
from embedfleet import Producer
from tests.commands import assert_one_line_error, clean_env, embedfleet, socket_listening
from tests.upprocess import Up, alive

ERROR_LINE = re.compile(r"\b(ERROR|WARNING|CRITICAL)\b|Traceback|exited with|could not|unreachable")


def test_up_serves_is_found_without_flags_and_ctrl_c_stops_everything_in_order(tmp_path, minilm_path):
    env = clean_env(tmp_path / "cache")
    port = free_port()
    up = Up("--redis-port", "0", "--port", str(port), "--data-dir", str(tmp_path / "data"), env=env)
    try:
        up.wait_up()
        output = up.output
        assert "all-MiniLM-L6-v2" in output and f"http://127.0.0.1:{port}/v1/embeddings" in output
        # the banner's commands run as printed, from the directory `up` was started in
        venv = Path(sys.executable).parent
        assert f"  Status:  {os.path.relpath(venv / 'embedfleet')} status" in output or \
            f"  Status:  {venv / 'embedfleet'} status" in output, output
        assert f"rq info --url {up.redis_url} --serializer embedfleet.common.serializer.MsgpackSerializer" in output
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
        status = embedfleet("status", env=env)  # the table begins with what the banner said
        assert status.stdout.startswith(f"Redis {up.redis_url}\ngateway http://127.0.0.1:{port} (`embedfleet up`, "
                                        "pid "), status.stdout
        (tmp_path / "texts.txt").write_text("\n".join(texts) + "\n")
        embedded = embedfleet("embed", str(tmp_path / "texts.txt"), str(tmp_path / "out.npy"), env=env)
        assert embedded.returncode == 0, embedded.stderr
        np.testing.assert_allclose(np.load(tmp_path / "out.npy"), reference, atol=1e-5)

        [state_file] = (tmp_path / "cache" / "embedfleet" / "up").glob("*.json")
        pids = json.loads(state_file.read_text())["pids"]
        assert (tmp_path / "data" / "redis").is_dir()  # the Redis keeps its AOF under --data-dir
        assert up.stop(signal.SIGINT) == 130, up.output  # Ctrl-C: the shell's code (docs/cli.md)
    finally:
        up.kill()
    lines = up.output[len(output):].splitlines()

    def first(text: str) -> int:
        return next(i for i, line in enumerate(lines) if text in line)

    # In order: the gateway, then the worker (which withdrew its advert: Redis was still up), then Redis.
    assert first("stopping the gateway") < first("stopping 1 worker(s)") < first("withdrew model") \
        < first("stopping Redis") < first("embedfleet: stopped"), up.output
    assert not [line for line in lines if ERROR_LINE.search(line)], up.output
    # Quiet by default: no line per HTTP request (nor for `up`'s own /health polls), per worker round, or per
    # rq maintenance run.
    assert not [line for line in up.lines if "HTTP/1.1" in line or "cleaning registries" in line
                or ": round of " in line], up.output
    assert not [pid for pid in [pids["redis"], pids["gateway"], *pids["workers"]] if alive(pid)]
    assert not state_file.exists()
    with pytest.raises(redis.ConnectionError):
        redis.Redis.from_url(up.redis_url).ping()


def plant_stale_advert(data_dir: Path, model: str) -> None:
    """What a worker killed without a goodbye leaves in an AOF: a fresh-looking advert and rq registration."""
    with RedisServer(data_dir / "redis", appendonly=True) as server:
        client = redis.Redis.from_url(server.url)
        caps = ModelCapabilities(name=model, max_model_len=48, embedding_size=32, vocab_size=1000)
        client.set(keys.model_key(model), caps.encode(), ex=ADVERTISE_TTL)
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
              "--served-model-name", "tiny", *flags, env=env)
           for name, port, flags in zip("ab", ports, ([], ["--access-log"]))]
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
        ups[1].wait_for('"POST /v1/embeddings HTTP/1.1" 200')  # --access-log: a line per request and round
        ups[1].wait_for(": round of 1: 1 served")
        for up in ups:
            assert up.stop(signal.SIGTERM) == 0, up.output
            assert not [line for line in up.lines if ERROR_LINE.search(line)], up.output
        assert not [line for line in ups[0].lines if "HTTP/1.1" in line or ": round of " in line], ups[0].output
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


QUEUED = 3000  # requests left queued in the AOF between two runs


def test_up_with_every_default_from_an_empty_folder_restarts_over_its_own_data(tmp_path, minilm_path):
    """The README's first command as a new user runs it: a relative data dir (.embedfleet in the working
    directory), the bundled model, a free Redis port. Stopped with requests still queued in its AOF, it
    starts again over that data (waiting, and saying so, while its Redis loads) and serves every one."""
    folder = tmp_path / "checkout"
    folder.mkdir()
    env = clean_env(tmp_path / "cache")
    port = free_port()
    up = Up("--redis-port", "0", "--port", str(port), env=env, cwd=folder)
    try:
        up.wait_up()
        assert (folder / ".embedfleet" / "redis" / "appendonlydir").is_dir()  # relative to the working dir
        url = up.redis_url
        texts = ["a fresh clone", "make up, then embed"]
        reference = SentenceTransformer(minilm_path, device="cpu").encode(texts)
        with Producer(url) as producer:
            np.testing.assert_allclose(producer.embed(texts), reference, atol=1e-5)
            # The operator suspends the workers (rq's own switch), work piles up, and the fleet is stopped.
            subprocess.run([Path(sys.executable).parent / "rq", "suspend", "--url", url], check=True,
                           capture_output=True, env=env)
            # in submits of 100 (a transaction each in the AOF: Redis answers between them while it loads)
            queued = [request_id for start in range(0, QUEUED, 100)
                      for request_id in producer.submit_many([[f"queued text {i}"] for i in range(start, start + 100)])]
        assert up.stop(signal.SIGINT) == 130, up.output  # Ctrl-C: the shell's code (docs/cli.md)
    finally:
        up.kill()

    # A slow load, as a large AOF gives (Redis' own debug knob: a pause per loaded command): about 4 s for
    # the commands this AOF holds, however fast the machine.
    aof = folder / ".embedfleet" / "redis" / "appendonlydir"
    commands = sum(f.read_bytes().count(b"\r\n*") for f in aof.iterdir())
    slow = tmp_path / "slow-load.conf"
    slow.write_text(f"key-load-delay {max(100, 4_000_000 // max(commands, 1))}\n"
                    "loading-process-events-interval-bytes 1024\n")
    # The batch shape pinned (env, as an operator would): a start-up probe disturbed by a loaded machine could
    # otherwise pick 2 rows a pass and make 3,000 requests a matter of minutes (issue #20).
    pinned = {**env, "EMBEDFLEET_MAX_BATCH_TOKENS": "4096", "EMBEDFLEET_MAX_BATCH_SIZE": "64"}
    again = Up("--redis-port", "0", "--port", str(port), "--redis-config", str(slow), env=pinned, cwd=folder)
    try:
        again.wait_up()
        assert "Redis is loading its data" in again.output, again.output
        url = again.redis_url
        resumed = subprocess.run([Path(sys.executable).parent / "rq", "resume", "--url", url],
                                 capture_output=True, env=env)
        assert resumed.returncode == 0, resumed.stderr
        with Producer(url) as producer:
            results = [producer.wait(request_id, 240) for request_id in queued]
        assert all(result.ok and result.embeddings.shape == (1, 384) for result in results)
        assert again.stop(signal.SIGINT) == 130, again.output
    finally:
        again.kill()
    assert not [line for line in again.lines if ERROR_LINE.search(line)], again.output


def pids_of(tmp_path: Path) -> dict:
    [state_file] = (tmp_path / "cache" / "embedfleet" / "up").glob("*.json")
    return json.loads(state_file.read_text())["pids"]


def test_up_starts_again_a_redis_and_a_worker_that_die(tmp_path, bert_mean):
    env = clean_env(tmp_path / "cache")
    port = free_port()
    up = Up("--redis-port", "0", "--port", str(port), "--data-dir", "data", "--model", bert_mean,
            "--served-model-name", "tiny", env=env, cwd=tmp_path)
    try:
        up.wait_up()
        url = up.redis_url
        with Producer(url) as producer:
            before = producer.embed(["still served"], "tiny")
        pids = pids_of(tmp_path)
        mark = len(up.lines)
        os.kill(pids["redis"], signal.SIGKILL)
        assert "Redis was killed by SIGKILL; starting it again" in up.wait_for("Redis was killed", mark)
        up.wait_for("Redis is back", mark)
        mark = len(up.lines)
        os.kill(pids["workers"][0], signal.SIGKILL)
        assert "starting it again" in up.wait_for("worker 1 was killed by SIGKILL", mark)
        up.wait_for("worker 1 started again", mark)
        new = pids_of(tmp_path)
        assert new["redis"] != pids["redis"] and new["workers"][0] != pids["workers"][0]
        assert not alive(pids["redis"])  # reaped, not a zombie
        with Producer(url) as producer:
            np.testing.assert_allclose(producer.embed(["still served"], "tiny"), before, atol=1e-6)
        request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/embeddings",
                                         data=json.dumps({"input": "still served"}).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as response:
            np.testing.assert_allclose(json.load(response)["data"][0]["embedding"], before[0], atol=1e-6)
        client = redis.Redis.from_url(url)
        names = [w.name for w in SimpleWorker.all(connection=client, serializer=MsgpackSerializer)]
        client.close()
        assert len(names) == 1 and names[0].startswith("up-"), names  # the dead one is not `rq info`'s

        # `up` itself killed outright: what it started ends too (no orphan keeps the ports and the data dir).
        up.kill()
        children = [new["redis"], new["gateway"], *new["workers"]]
        deadline = time.monotonic() + 60
        while [pid for pid in children if alive(pid)] and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [pid for pid in children if alive(pid)]
    finally:
        up.kill()


def test_up_stops_everything_with_one_line_when_a_child_keeps_dying(tmp_path, bert_mean):
    env = clean_env(tmp_path / "cache")
    up = Up("--redis-port", "0", "--no-gateway", "--data-dir", str(tmp_path / "data"), "--model", bert_mean,
            "--max-restarts", "0", env=env)
    try:
        up.wait_up()
        pids = pids_of(tmp_path)
        os.kill(pids["workers"][0], signal.SIGKILL)
        assert up.proc.wait(90) == 1, up.output
    finally:
        up.kill()
    up.reader.join(10)
    errors = [line for line in up.lines if line.startswith("embedfleet: worker 1")]
    assert errors == ["embedfleet: worker 1 was killed by SIGKILL (1 deaths in a row, each within a minute of its "
                      "start; --max-restarts 0); the fleet was stopped: see its messages above\n"], up.output
    assert not [pid for pid in [pids["redis"], *pids["workers"]] if alive(pid)]
    assert not list((tmp_path / "cache").glob("**/*.json"))
