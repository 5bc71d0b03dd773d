"""Secured Redis: a worker, a producer and the gateway over TLS as an ACL user of a redis-server with a
password (a throwaway CA made by openssl here); one-line failures for a wrong password, a user without
the permissions embedfleet needs and a certificate of another CA; a real Sentinel in front of a master."""

from __future__ import annotations

import numpy as np
import pytest
import redis

from embedfleet.common.redisclient import ACL_GRANT, AccessError, check_access, connect, redact, with_tls
from embedfleet.common.redisserver import RedisServer, find_redis_server, free_port
from embedfleet import Producer
from tests.commands import assert_one_line_error, clean_env, embedfleet
from tests.secureredis import (DEFAULT_PASSWORD, SecureRedis, embedfleet_process, make_pki, post_embeddings,
                               stop, wait_healthy)
from tests.acls import documented_acl

MODEL = "secure"


@pytest.fixture(scope="module")
def secure(tmp_path_factory):
    folder = tmp_path_factory.mktemp("secure-redis")
    server = SecureRedis(folder, make_pki(folder / "pki"))
    yield server
    server.stop()


def test_worker_producer_and_gateway_over_tls_as_an_acl_user(secure, tmp_path):
    url = secure.url(tls=True)
    # The worker takes the TLS files as flags, the gateway as env vars, the producer inside its URL.
    worker = embedfleet_process("worker", "--redis-url", url, *secure.tls_flags(), "--model", "null:8",
                                "--served-model-name", MODEL, env=clean_env(tmp_path))
    port = free_port()
    gateway = embedfleet_process("gateway", "--port", str(port), env=clean_env(
        tmp_path, EMBEDFLEET_REDIS_URL=url, EMBEDFLEET_REDIS_TLS_CA=str(secure.pki["ca.crt"]),
        EMBEDFLEET_REDIS_TLS_CERT=str(secure.pki["client.crt"]),
        EMBEDFLEET_REDIS_TLS_KEY=str(secure.pki["client.key"])))
    try:
        health = wait_healthy(f"http://127.0.0.1:{port}", [worker, gateway])
        assert health["models"] == {MODEL: 1}
        answer = post_embeddings(f"http://127.0.0.1:{port}", MODEL, "hello over TLS")
        assert len(answer["data"][0]["embedding"]) == 8
        producer_url = with_tls(url, secure.pki["ca.crt"], secure.pki["client.crt"], secure.pki["client.key"])
        with Producer(producer_url) as producer:
            vectors = producer.embed(["one", "two"], MODEL, timeout=30)
            assert vectors.shape == (2, 8) and np.allclose(np.linalg.norm(vectors, axis=1), 1, atol=1e-3)
        admin = redis.Redis(port=secure.port, password=DEFAULT_PASSWORD)
        # A connection the pool is opening right now has run no command yet (cmd=NULL) and still reads as
        # user `default`: only connections that have spoken count.
        who = {(c["user"], c["laddr"].endswith(f":{secure.tls_port}")) for c in admin.client_list()
               if c["id"] != str(admin.client_id()) and c.get("cmd") != "NULL"}
        admin.close()
        assert who == {("fleet", True)}  # every connection of the fleet is the ACL user's, over TLS
    finally:
        gateway_log, worker_log = stop(gateway), stop(worker)
    assert FLEET_SECRET_ABSENT(worker_log + gateway_log)


def FLEET_SECRET_ABSENT(log: str) -> bool:
    """Logs name the Redis without its password."""
    return "fl33t-pw" not in log and "fleet:***@" in log


def test_wrong_password_fails_at_start_in_one_line(secure, tmp_path):
    env = clean_env(tmp_path)
    bad = secure.url(password="not-the-password")
    assert_one_line_error(embedfleet("status", "--redis-url", bad, env=env), 1, "refused user 'fleet'",
                          "password")
    assert_one_line_error(embedfleet("worker", "--redis-url", bad, "--model", "null:8", env=env), 1,
                          "refused user 'fleet'", "invalid username-password pair")
    assert_one_line_error(embedfleet("gateway", "--redis-url", bad, "--port", str(free_port()), env=env), 1,
                          "refused user 'fleet'")
    # No password at all on a Redis that needs one: the same kind of line.
    no_password = f"redis://127.0.0.1:{secure.port}/0"
    assert_one_line_error(embedfleet("status", "--redis-url", no_password, env=env), 1,
                          "needs a password and the URL gives none")
    assert "not-the-password" not in embedfleet("status", "--redis-url", bad, env=env).stderr


def test_a_user_without_the_needed_permissions_fails_at_start(secure, tmp_path):
    narrow = secure.url(user="narrow")
    done = embedfleet("worker", "--redis-url", narrow, "--model", "null:8", env=clean_env(tmp_path))
    assert_one_line_error(done, 1, "ACL user 'narrow' may not", "LLEN rq:queue:",
                          "no permissions to access one of the keys", f"ACL SETUSER narrow {ACL_GRANT}")
    with pytest.raises(AccessError, match="may not"):
        check_access(connect(narrow), narrow)
    check_access(connect(secure.url()), secure.url())  # the grant the message suggests is enough


def test_the_documented_users_pass_the_start_up_check(redis_server, redis_client):
    """The start-up check only asks what each documented user (docs/security.md) may do (its producer user is
    narrow)."""
    for command in documented_acl({"producer": "p", "worker": "w"}):
        redis_client.execute_command(*command)
    for user, password in (("embedfleet-producer", "p"), ("embedfleet-worker", "w")):
        url = f"redis://{user}:{password}@127.0.0.1:{redis_server.port}/0"
        check_access(connect(url), url)
    redis_client.acl_deluser("embedfleet-producer", "embedfleet-worker")  # the session's server is shared


def test_a_certificate_of_another_ca_fails_in_one_line(secure, tmp_path):
    env = clean_env(tmp_path)
    url = secure.url(tls=True)
    done = embedfleet("worker", "--redis-url", url, *secure.tls_flags(ca="other-ca.crt"), "--model", "null:8",
                      env=env)
    assert_one_line_error(done, 1, "TLS with Redis", "CERTIFICATE_VERIFY_FAILED", "--redis-tls-ca")
    # The right CA but no client certificate, on a server that demands one.
    done = embedfleet("status", "--redis-url", url, "--redis-tls-ca", str(secure.pki["ca.crt"]), env=env)
    assert done.returncode == 1 and done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    # TLS files with a plain URL are a usage error, and a client cert needs its key.
    assert_one_line_error(embedfleet("status", "--redis-url", secure.url(), "--redis-tls-ca", "x", env=env), 2,
                          "rediss://")
    assert_one_line_error(embedfleet("status", "--redis-url", url, "--redis-tls-cert", "x", env=env), 2,
                          "go together")


def test_urls_are_redacted_for_logs():
    assert redact("rediss://fleet:s3cret@h:6380/0?ssl_ca_certs=%2Fca.pem") == \
        "rediss://fleet:***@h:6380/0?ssl_ca_certs=/ca.pem"
    assert redact("redis://:s3cret@h/0") == "redis://:***@h/0"
    assert redact("redis+sentinel://h1:1,h2:2/m?sentinel_password=x") == "redis+sentinel://h1:1,h2:2/m?sentinel_password=***"
    assert redact("redis://h:1/0") == "redis://h:1/0"


def test_sentinel_url_finds_the_master_for_a_worker_and_a_producer(tmp_path):
    """A real Sentinel (redis-server --sentinel) monitoring a master with a password."""
    with RedisServer(tmp_path / "master") as master:
        plain = redis.Redis(port=master.port)
        plain.config_set("requirepass", DEFAULT_PASSWORD)
        plain.close()
        sentinel_port = free_port()
        conf = tmp_path / "sentinel.conf"
        conf.write_text(f"port {sentinel_port}\nbind 127.0.0.1\ndir {tmp_path}\n"
                        f"sentinel monitor fleet 127.0.0.1 {master.port} 1\n"
                        f"sentinel auth-pass fleet {DEFAULT_PASSWORD}\n")
        sentinel = embedfleet_sentinel(conf)
        try:
            wait_sentinel_knows(sentinel, sentinel_port, "fleet", master.port)  # it listens after it starts
            url = f"redis+sentinel://:{DEFAULT_PASSWORD}@127.0.0.1:{sentinel_port}/fleet/0"
            worker = embedfleet_process("worker", "--redis-url", url, "--model", "null:4", "--served-model-name",
                                        MODEL, env=clean_env(tmp_path))
            try:
                with Producer(url) as producer:
                    assert producer.redis.connection_pool.get_master_address() == ("127.0.0.1", master.port)
                    wait_for_model(producer, worker)
                    assert producer.embed(["through the sentinel"], MODEL, timeout=30).shape == (1, 4)
            finally:
                stop(worker)
            assert_one_line_error(embedfleet("status", "--redis-url", url.replace(DEFAULT_PASSWORD, "bad"),
                                             env=clean_env(tmp_path)), 1, "refused")
        finally:
            sentinel.terminate()
            sentinel.wait(10)


def embedfleet_sentinel(conf):
    import subprocess

    process = subprocess.Popen([find_redis_server(), str(conf), "--sentinel"], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, start_new_session=True)
    return process


def wait_sentinel_knows(process, port: int, name: str, master_port: int, timeout: float = 120) -> None:
    """Until the Sentinel on `port` answers and names the master `name` (it reads its config, then listens)."""
    import time

    deadline = time.monotonic() + timeout  # a bound for a broken Sentinel, not a guess at its speed
    client = redis.Redis(port=port, socket_connect_timeout=5)
    try:
        while True:
            assert process.poll() is None, f"the sentinel exited with {process.returncode}"
            try:
                address = client.sentinel_get_master_addr_by_name(name)  # (b"host", port) once it knows
                if address and int(address[1]) == master_port:
                    return
            except redis.ConnectionError:
                pass  # not listening yet
            assert time.monotonic() < deadline, "the sentinel never named the master"
            time.sleep(0.05)
    finally:
        client.close()


def wait_for_model(producer: Producer, worker, timeout: float = 60) -> None:
    import time

    deadline = time.monotonic() + timeout
    while MODEL not in producer.models():
        assert worker.poll() is None, stop(worker)[-2000:]
        assert time.monotonic() < deadline, "the worker never advertised"
        time.sleep(0.2)
