"""The gateway at its edges (issue #36, item 6), on a real `python -m embedfleet.producer.gateway` process and a real
worker process (the null model: the gateway's side is under test, not the vectors): an id of 5,000 characters is not
echoed whole, a 200 KB header gets a 431 answer instead of a reset connection, and large bodies leave no
lasting memory behind."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from embedfleet.common.errors import MAX_ECHO
from embedfleet.common.redisserver import RedisServer, free_port
from tests import gatewayserver

ROOT = Path(__file__).resolve().parents[2]
MODEL = "null384"
LONG = "a" * 5000


@dataclass
class Fleet:
    url: str
    gateway: subprocess.Popen


def _stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@pytest.fixture(scope="module")
def gateway_process(tmp_path_factory):
    """A real `python -m embedfleet.producer.gateway` process over a real null-model worker process, on a Redis of its
    own."""
    with RedisServer(tmp_path_factory.mktemp("redis")) as redis_server:  # its own: other tests flush theirs
        yield from _fleet(redis_server)


def _fleet(redis_server):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    port = free_port()
    worker = subprocess.Popen([sys.executable, "-m", "embedfleet.worker", "--redis-url", redis_server.url, "--model",
                               "null:384", "--served-model-name", MODEL, "--poll-timeout", "1"],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    gateway = subprocess.Popen([sys.executable, "-m", "embedfleet.producer.gateway", "--redis-url", redis_server.url,
                                "--port", str(port), "--log-level", "warning"], env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{url}/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert worker.poll() is None and gateway.poll() is None, "the worker or the gateway exited"
            assert time.monotonic() < deadline, "the fleet did not come up"
            time.sleep(0.2)
        yield Fleet(url, gateway)
    finally:
        _stop(gateway)
        _stop(worker)


# -- a caller's id is quoted, not echoed whole ---------------------------------------------------------------
@pytest.mark.parametrize("method,path,body", [
    ("GET", f"/v1/files/{LONG}", None),
    ("GET", f"/v1/files/{LONG}/content", None),
    ("GET", f"/v1/batches/{LONG}", None),
    ("POST", f"/v1/batches/{LONG}/cancel", None),
    ("GET", f"/v1/files?after={LONG}", None),
    ("GET", f"/no/such/route/{LONG}", None),
    ("PUT", f"/v1/embeddings/{LONG}", None),
    ("POST", "/v1/embeddings", {"model": LONG, "input": "hi"}),
    ("POST", "/pooling", {"model": LONG, "input": "hi"}),
    ("GET", f"/tei/{LONG}/info", None),
])
def test_a_long_id_is_quoted_with_its_length_not_echoed_whole(gateway_process, method, path, body):
    response = httpx.request(method, gateway_process.url + path, json=body, timeout=30)
    assert response.status_code == 404, response.text
    error = response.json()["error"]
    message = error if isinstance(error, str) else error["message"]  # TEI's shape: the message is `error`
    assert "a" * (MAX_ECHO + 1) not in message and "characters)" in message and len(message) < 300, message


# -- a request head over the limit -----------------------------------------------------------------------------
def test_a_200_kb_header_is_answered_431_in_the_gateways_error_shape(gateway_process):
    for method, body in (("GET", None), ("POST", {"model": MODEL, "input": "hi"})):
        path = "/health" if method == "GET" else "/v1/embeddings"
        response = httpx.request(method, gateway_process.url + path, json=body, headers={"X-Big": "x" * 200_000},
                                 timeout=30)
        assert response.status_code == 431, response.text
        error = response.json()["error"]
        assert error["code"] == "headers_too_large" and error["type"] == "invalid_request_error"
        assert "16384 bytes" in error["message"] and "--max-header-bytes" in error["message"]
    # the gateway is unharmed, and counted what it refused
    assert httpx.post(f"{gateway_process.url}/v1/embeddings", json={"model": MODEL, "input": "hi"}).status_code == 200
    metrics = httpx.get(f"{gateway_process.url}/metrics").text
    assert any(line.startswith("embedfleet_gateway_errors_total") and 'code="headers_too_large"' in line
               and not line.endswith(" 0.0") for line in metrics.splitlines()), metrics


def test_a_request_that_is_not_http_gets_a_json_400(gateway_process):
    port = int(gateway_process.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(b"NOT HTTP AT ALL\r\n\r\n")
        answer = b""
        while chunk := sock.recv(65536):  # the gateway closes after answering
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400"), answer
    assert json.loads(body)["error"]["code"] == "invalid_request"


def test_max_header_bytes_raises_the_limit(redis_url):
    server = gatewayserver.Server(gatewayserver.settings(redis_url, max_header_bytes=256 * 1024))
    try:
        response = httpx.get(f"{server.url}/health", headers={"X-Big": "x" * 200_000}, timeout=30)
        assert response.status_code == 503 and response.json()["status"] == "unavailable"  # read: no worker here
    finally:
        server.stop()


# -- memory after large bodies -------------------------------------------------------------------------------
def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def _settles(pid: int, bound: float, timeout: float = 20) -> float:
    """The process's RSS once it is at most `bound` MB; fails with the last reading after `timeout` s."""
    deadline = time.monotonic() + timeout
    while (rss := _rss_mb(pid)) > bound:
        assert time.monotonic() < deadline, f"RSS stays at {rss:.0f} MB, over {bound:.0f} MB"
        time.sleep(0.1)
    return rss


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads RSS from /proc")
def test_large_bodies_leave_no_lasting_memory(gateway_process):
    """Measured before the fix: +14 to +21 MB of RSS after two refused 7 MB bodies, +34 to +46 MB after answered
    ones (glibc kept the freed heap). Now the heap is trimmed after each large request: refused bodies leave
    about nothing; answered ones (each a JSON answer of 2,000 x 384 Python floats) leave +8 to +27 MB of
    pymalloc arenas that later requests reuse: it stays flat."""
    pid = gateway_process.gateway.pid
    base = _rss_mb(pid)

    def post(model: str) -> int:
        body = json.dumps({"model": model, "input": ["word " * 700] * 2000}).encode()  # 7 MB, 2,000 inputs
        return httpx.post(f"{gateway_process.url}/v1/embeddings", content=body, timeout=120,
                          headers={"content-type": "application/json"}).status_code

    assert [post("no-such-model") for _ in range(2)] == [404, 404]  # read, parsed, refused
    _settles(pid, base + 8)
    assert [post(MODEL) for _ in range(6)] == [200] * 6  # answered: 2,000 vectors of 384 floats each
    _settles(pid, base + 40)
