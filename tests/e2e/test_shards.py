"""Two shards (two redis-servers): two models, each served and answered on its own shard through one
gateway; `embedfleet status` and a Producer read the same map."""

from __future__ import annotations

import json
import time
import urllib.request

import pytest
import redis

from embedfleet.common.protocol import keys
from embedfleet.common.redisserver import RedisServer, free_port
from embedfleet.common.shards import parse_shards
from embedfleet import Producer
from tests.commands import clean_env, embedfleet
from tests.secureredis import embedfleet_process, post_embeddings, stop, wait_healthy


def test_two_models_on_two_shards_through_one_gateway(tmp_path):
    with RedisServer(tmp_path / "a") as a, RedisServer(tmp_path / "b") as b:
        shard_file = tmp_path / "shards.json"
        shard_file.write_text(json.dumps({"beta": b.url}))
        env = clean_env(tmp_path, EMBEDFLEET_REDIS_URL=a.url, EMBEDFLEET_REDIS_SHARDS=f"@{shard_file}")
        # Both workers are told the default Redis; the map sends `beta`'s to its shard.
        alpha = embedfleet_process("worker", "--model", "null:8", "--served-model-name", "alpha", env=env)
        beta = embedfleet_process("worker", "--model", "null:4", "--served-model-name", "beta", env=env)
        port = free_port()
        gateway = embedfleet_process("gateway", "--port", str(port), env=env)
        try:
            health = wait_healthy(f"http://127.0.0.1:{port}", [alpha, beta, gateway])
            while set(health["models"]) != {"alpha", "beta"}:
                health = wait_healthy(f"http://127.0.0.1:{port}", [alpha, beta, gateway])
            assert len(post_embeddings(f"http://127.0.0.1:{port}", "alpha", "x")["data"][0]["embedding"]) == 8
            assert len(post_embeddings(f"http://127.0.0.1:{port}", "beta", "y")["data"][0]["embedding"]) == 4
            ra, rb = redis.Redis.from_url(a.url), redis.Redis.from_url(b.url)
            # Each model's advert, queue registries and results live on its own shard only.
            assert ra.smembers(keys.MODELS_KEY) == {b"alpha"} and rb.smembers(keys.MODELS_KEY) == {b"beta"}
            results_a = {k.decode() for k in ra.scan_iter(keys.result_key("*"))}
            results_b = {k.decode() for k in rb.scan_iter(keys.result_key("*"))}
            assert len(results_a) == 1 and len(results_b) == 1
            with Producer(a.url, shards={"beta": b.url}) as producer:
                assert set(producer.models()) == {"alpha", "beta"}
                request_id = producer.submit(["on b"], "beta")
                # on b: its job, or its result once answered (a lean worker deletes an answered job's hash)
                on_b = rb.exists(f"rq:job:{request_id}", keys.result_key(request_id))
                assert on_b and not ra.exists(f"rq:job:{request_id}", keys.result_key(request_id))
                assert producer.wait(request_id, 30).embeddings.shape == (1, 4)
            with Producer(a.url, shards={"beta": b.url}) as stranger:  # an id it did not submit: found on b
                assert stranger.status(request_id) == "finished" and stranger.get(request_id).ok
            with Producer(a.url) as unsharded:  # without the map, beta is not served (its adverts are on b)
                assert set(unsharded.models()) == {"alpha"}
            status = embedfleet("status", "--json", env=env)
            assert status.returncode == 0, status.stderr
            served = {m["name"]: m for m in json.loads(status.stdout)["models"]}
            assert served["alpha"]["live_workers"] == 1 and served["beta"]["live_workers"] == 1
            assert served["alpha"]["redis"] == a.url and served["beta"]["redis"] == b.url
            ra.close()
            rb.close()
        finally:
            for process in (gateway, alpha, beta):
                stop(process)


def test_shard_map_forms(tmp_path):
    assert parse_shards("a=redis://x:1/0; b=redis+sentinel://h1:1,h2:2/m") == {
        "a": ["redis://x:1/0"], "b": ["redis+sentinel://h1:1,h2:2/m"]}
    lines = tmp_path / "shards.txt"
    lines.write_text("# model = shard\na=redis://x:1/0\n\nb=rediss://y:2/0  # TLS\n")
    assert parse_shards(f"@{lines}") == {"a": ["redis://x:1/0"], "b": ["rediss://y:2/0"]}
    for bad, why in (("a", "not MODEL=URL"), ("a=x", "not a Redis URL"), ("a=redis://x a=redis://y", "twice"),
                     (f"@{tmp_path}/none.json", "cannot read")):
        with pytest.raises(ValueError, match=why):
            parse_shards(bad)
    done = embedfleet("status", "--redis-shards", "nonsense", env=clean_env(tmp_path))
    assert done.returncode == 2 and "not MODEL=URL" in done.stderr


def test_one_model_partitioned_over_two_redis_through_workers_gateway_and_status(tmp_path):
    """`embedfleet worker` given a map that partitions its model starts an engine per partition; the gateway
    spreads requests over both, its /metrics and `embedfleet status` show the model whole."""
    with RedisServer(tmp_path / "a") as a, RedisServer(tmp_path / "b") as b:
        env = clean_env(tmp_path, EMBEDFLEET_REDIS_URL=a.url, EMBEDFLEET_REDIS_SHARDS=f"wide={a.url},{b.url}")
        worker = embedfleet_process("worker", "--model", "null:4", "--served-model-name", "wide", "--no-log-rounds",
                                    env=env)
        port = free_port()
        gateway = embedfleet_process("gateway", "--port", str(port), env=env)
        try:
            with Producer(a.url, shards={"wide": [a.url, b.url]}) as producer:
                deadline = time.monotonic() + 120
                while producer.live_workers("wide") < 2:  # one engine per partition
                    assert worker.poll() is None and time.monotonic() < deadline, stop(worker)[-2000:]
                    time.sleep(0.2)
                wait_healthy(f"http://127.0.0.1:{port}", [worker, gateway])
                for i in range(10):
                    answer = post_embeddings(f"http://127.0.0.1:{port}", "wide", f"t{i}")
                    assert len(answer["data"][0]["embedding"]) == 4
                ra, rb = redis.Redis.from_url(a.url), redis.Redis.from_url(b.url)
                on = [sum(1 for _ in r.scan_iter(keys.result_key("*"))) for r in (ra, rb)]
                assert on == [5, 5], on  # spread evenly (round robin)
                for r in (ra, rb):  # each partition holds the model's adverts and one worker
                    assert r.smembers(keys.MODELS_KEY) == {b"wide"} and r.zcard(keys.model_workers_key("wide")) == 1
                    r.close()
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as answer:
                metrics = answer.read().decode()
            assert 'embedfleet_live_workers{model="wide"} 2.0' in metrics
            status = embedfleet("status", "--json", env=env)
            assert status.returncode == 0, status.stderr
            (row,) = json.loads(status.stdout)["models"]
            assert row["name"] == "wide" and row["live_workers"] == 2 and row["partitions"] == 2
            text = embedfleet("status", env=env)
            assert "partitions of wide: 2 Redis" in text.stdout, text.stdout
        finally:
            for process in (gateway, worker):
                stop(process)


def test_a_partition_down_when_the_worker_starts_joins_when_it_comes_up(tmp_path):
    """The engine of a partition whose Redis is down waits for it (it does not die, which would count against the
    supervisor's restarts); the other partition is served meanwhile."""
    with RedisServer(tmp_path / "a") as a:
        late = RedisServer(tmp_path / "b")  # not started yet: its port is known, nothing listens there
        env = clean_env(tmp_path, EMBEDFLEET_REDIS_URL=a.url, EMBEDFLEET_REDIS_SHARDS=f"wide={a.url},{late.url}")
        # --no-log-rounds: a line per round would fill the unread output pipe and stall the worker
        worker = embedfleet_process("worker", "--model", "null:4", "--served-model-name", "wide", "--no-log-rounds",
                                    env=env)
        try:
            with Producer(a.url, shards={"wide": [a.url, late.url]}) as producer:
                deadline = time.monotonic() + 120
                while producer.live_workers("wide") < 1:  # partition 1's engine, while 2's Redis is down
                    assert worker.poll() is None and time.monotonic() < deadline, stop(worker)[-2000:]
                    time.sleep(0.2)
                answers = [producer.embed([f"t{i}"], "wide", timeout=30) for i in range(4)]  # all on partition 1
                assert all(a.shape == (1, 4) for a in answers)
                with late:
                    while producer.live_workers("wide") < 2:
                        assert worker.poll() is None and time.monotonic() < deadline, stop(worker)[-2000:]
                        time.sleep(0.2)
                    ids = []  # the producer tries it again once placement.DOWN_SECONDS have passed
                    while late.url not in {producer.url_of(i) for i in ids}:
                        assert time.monotonic() < deadline, "the partition did not rejoin"
                        ids.append(producer.submit(["u"], "wide"))
                    assert all(producer.wait(i, 30).ok for i in ids)
        finally:
            output = stop(worker)
        assert "partition 2's Redis" in output and "unreachable" in output
