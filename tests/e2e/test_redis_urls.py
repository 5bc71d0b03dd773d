"""Malformed Redis URLs through the commands a user runs: each is a usage error of the setting that holds it (exit 2,
one line, never the password) before anything connects or any engine starts; a URL of the wrong kind for its
Redis (a Cluster's at a plain Redis, a plain one at a Cluster node) or a DB the server lacks is one line at
connect (exit 1). Real processes, a real redis-server and a real Redis Cluster (tests/rediscluster.py)."""

from __future__ import annotations

import time
from urllib.parse import quote

import pytest

from embedfleet import AsyncProducer, Producer
from embedfleet.common.errors import StartupError
from embedfleet.common.protocol import keys
from tests.commands import assert_one_line_error, clean_env, embedfleet

SECRET = "Pw1Leak/Pw2Leak?Pw3Leak#Pw4Leak"  # '/', '?' and '#' unencoded cut a URL short; no part may be echoed
ENCODED = quote(SECRET, safe="")
ENGINES_STARTED = 25  # seconds: a crash-looping partition engine took ~40 s to stop the worker

MALFORMED = [
    ("redis://127.0.0.1:99999/0", "port '99999' is not a number from 1 to 65535"),
    (f"redis://fleet:{ENCODED}@127.0.0.1:abc/0", "port 'abc' is not a number"),
    ("redis://127.0.0.1:6379/99999", "DB '99999'"),
    ("redis://127.0.0.1:6379/x", "DB 'x'"),
    (f"redis://fleet:{SECRET}@127.0.0.1:6379/0", "holds an unencoded '/', '?' or '#'"),
    (f"redis://:{SECRET}@127.0.0.1:6379/0", "percent-encode"),
    ("127.0.0.1:6379", "does not start with a scheme://"),
]


@pytest.mark.parametrize("url, why", MALFORMED)
def test_a_malformed_url_is_a_usage_error_naming_its_setting_never_its_password(tmp_path, url, why):
    status = embedfleet("status", "--redis-url", url, env=clean_env(tmp_path))
    assert_one_line_error(status, 2, "--redis-url: ", why)
    worker = embedfleet("worker", "--model", "null:4", env=clean_env(tmp_path, EMBEDFLEET_REDIS_URL=url))
    assert_one_line_error(worker, 2, "EMBEDFLEET_REDIS_URL: ", why)
    assert "Leak" not in status.stderr + worker.stderr


def test_a_malformed_cache_url_is_a_usage_error_too(tmp_path, redis_url):
    done = embedfleet("worker", "--model", "null:4", "--redis-url", redis_url, "--cache-url",
                      f"redis://:{SECRET}@127.0.0.1:6379/0", env=clean_env(tmp_path))
    assert_one_line_error(done, 2, "--cache-url: ", "percent-encode")
    assert "Leak" not in done.stderr


def test_a_bad_url_in_a_partition_map_stops_the_worker_before_any_engine_starts(tmp_path, redis_url, redis_client):
    env = clean_env(tmp_path, EMBEDFLEET_REDIS_URL=redis_url,
                    EMBEDFLEET_REDIS_SHARDS=f"m={redis_url},redis://:{ENCODED}@127.0.0.1:abc/0")
    started = time.monotonic()
    done = embedfleet("worker", "--model", "null:4", "--served-model-name", "m", env=env)
    assert_one_line_error(done, 2, "EMBEDFLEET_REDIS_SHARDS: model 'm', partition 2: port 'abc'")
    assert time.monotonic() - started < ENGINES_STARTED and "Leak" not in done.stderr
    assert redis_client.smembers(keys.MODELS_KEY) == set()  # no engine served the healthy partition meanwhile


def test_a_partition_without_its_scheme_and_one_redis_spelled_twice_are_refused(tmp_path, redis_server):
    port = redis_server.port
    done = embedfleet("status", "--redis-shards", "m=redis://a:1/0,127.0.0.1:2", env=clean_env(tmp_path))
    assert_one_line_error(done, 2, "--redis-shards: model 'm': after a comma comes '127.0.0.1:2'",
                          "write each partition as a whole URL")
    done = embedfleet("worker", "--model", "null:4", "--served-model-name", "m", "--redis-url", redis_server.url,
                      "--redis-shards", f"m=redis://localhost:{port}/0,redis://127.0.0.1:{port}",
                      env=clean_env(tmp_path))
    assert_one_line_error(done, 2, "--redis-shards: model 'm' names a Redis twice among its partitions",
                          f"redis://localhost:{port}/0 and redis://127.0.0.1:{port} are one Redis")


def test_a_producer_refuses_a_malformed_url_as_a_startup_error(redis_url, monkeypatch):
    for make in (Producer, AsyncProducer):
        with pytest.raises(StartupError, match="port '99999' is not a number"):
            make("redis://127.0.0.1:99999/0")
        with pytest.raises(StartupError, match="holds an unencoded") as caught:
            make(f"redis://:{SECRET}@127.0.0.1:6379/0")
        assert "Leak" not in str(caught.value)
        with pytest.raises(StartupError, match="shards: model 'm' names a Redis twice"):
            make(redis_url, shards={"m": [redis_url, redis_url.replace("127.0.0.1", "localhost")]})
    monkeypatch.setenv("EMBEDFLEET_REDIS_SHARDS", "m=redis://a:1/0,127.0.0.1:2")
    with pytest.raises(StartupError, match="EMBEDFLEET_REDIS_SHARDS: model 'm': after a comma"):
        Producer(redis_url)


def test_a_cluster_url_at_a_plain_redis_and_a_plain_url_at_a_cluster_node_say_which(tmp_path, redis_url,
                                                                                    redis_cluster):
    cluster_at_plain = redis_url.replace("redis://", "redis+cluster://").removesuffix("/0")
    plain_at_node = redis_cluster.servers[0].url
    for command in (["status"], ["worker", "--model", "null:4"]):
        done = embedfleet(*command, "--redis-url", cluster_at_plain, env=clean_env(tmp_path))
        assert_one_line_error(done, 1, f"Redis at {cluster_at_plain} is not a Redis Cluster",
                              "name a plain Redis as redis://HOST:PORT/DB")
        done = embedfleet(*command, "--redis-url", plain_at_node, env=clean_env(tmp_path))
        assert_one_line_error(done, 1, f"Redis at {plain_at_node} is a node of a Redis Cluster",
                              "name the cluster as redis+cluster://")
    # a partition of the wrong kind stops a partitioned worker before it starts any engine
    env = clean_env(tmp_path, EMBEDFLEET_REDIS_URL=redis_url, EMBEDFLEET_REDIS_SHARDS=f"m={redis_url},{plain_at_node}")
    started = time.monotonic()
    done = embedfleet("worker", "--model", "null:4", "--served-model-name", "m", env=env)
    assert_one_line_error(done, 1, f"Redis at {plain_at_node} is a node of a Redis Cluster")
    assert time.monotonic() - started < ENGINES_STARTED


def test_a_db_the_server_lacks_is_one_line(tmp_path, redis_url):
    url = redis_url.removesuffix("/0") + "/20"  # a default redis-server has DBs 0 to 15
    done = embedfleet("status", "--redis-url", url, env=clean_env(tmp_path))
    assert_one_line_error(done, 1, f"Redis at {url} has no DB 20", "`databases` setting")
