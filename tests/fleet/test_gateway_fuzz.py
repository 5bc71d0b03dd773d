"""Hostile HTTP input: every malformed request is a 4xx in its API's error shape (OpenAI's; vLLM's on vLLM's
routes), never a 500, and no answer closes the keep-alive connection that other requests share. A seeded
generator, so a failure replays."""

from __future__ import annotations

import http.client
import json
import random
from collections import Counter

import pytest
import redis

from embedfleet import Producer
from embedfleet.common.protocol import keys
from tests.answers import MODEL, advertise, answer
from tests.gatewayserver import Server, settings

REQUESTS = 600
SURROGATE = "\ud800"
ATOMS = [None, True, 0, -1, 1, 7, 2**31, 2**63, 10**30, -(10**30), 1.5, 1e308, float("nan"), float("inf"), "",
         "a", "x" * 300, SURROGATE, "a\udfffb", "\x00", "é 漢字", "bytes", "float", "base64", "left", MODEL,
         [], [SURROGATE], [1, 2], [[1, 2], [3]], [["a"]], [[]], {}, {"a": 1}]
FIELDS = ["input", "model", "encoding_format", "dimensions", "use_activation", "normalize", "truncate_prompt_tokens",
          "truncation_side", "prompt_name", "prompt", "add_special_tokens", "embed_dtype", "endianness", "task",
          "user", "extra"]
BAD_IDS = ["*", "x%20y", "%00", "%FF", "%ED%A0%80", "..", "a:b", "a" * 65, "%2F", "rq:job:x", "%E2%80%AE"]


def value(rng: random.Random, depth: int = 0):
    if depth < 2 and rng.random() < 0.2:
        return [value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return rng.choice(ATOMS)


def body(rng: random.Random) -> bytes:
    kind = rng.random()
    if kind < 0.05:
        return rng.choice([b"", b"{", b"[]", b"null", b"\xff\xfe", b'{"input": "\xed\xa0\x80"}', b"NaN"])
    fields = {"input": rng.choice(["some text", ["two", "texts"], [1, 2, 3]]), "model": MODEL}
    for name in rng.sample(FIELDS, rng.randint(1, 4)):
        fields[name] = value(rng)
    return json.dumps(fields).encode()  # lone surrogates and NaN go out as JSON escapes / tokens


def request(rng: random.Random) -> tuple[str, str, bytes | None]:
    roll = rng.random()
    if roll < 0.45:
        return "POST", rng.choice(["/v1/jobs", "/v1/embeddings", "/pooling"]), body(rng)
    if roll < 0.8:
        job_id = rng.choice(BAD_IDS + ["0" * 32, "unknown-id"])
        return rng.choice(["GET", "DELETE"]), f"/v1/jobs/{job_id}" + rng.choice(["", "?wait=0", "?wait=-1",
                                                                                 "?wait=x", "?wait=1e400"]), None
    method = rng.choice(["GET", "POST", "PUT", "PATCH", "DELETE"])
    path = rng.choice(["/v1/models", "/health", "/v1/jobs", "/nope", "/v1/embeddings", "/%FF", "/v1/jobs/%00/x"])
    return method, path, body(rng) if method in ("POST", "PUT", "PATCH") else None


@pytest.fixture
def gateway(redis_url):
    advertise(redis.Redis.from_url(redis_url))
    # A short request timeout: a fuzzed body that happens to be valid waits for no worker for long.
    server = Server(settings(redis_url, request_timeout=0.05, max_queue_depth=50))
    yield server
    server.stop()


def test_hostile_requests_get_4xx_and_keep_the_connection(gateway):
    rng = random.Random(14)
    host, port = gateway.url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    server_errors, dropped, shapes, statuses = [], [], [], Counter()
    for n in range(REQUESTS):
        method, path, payload = request(rng)
        try:
            connection.request(method, path, body=payload, headers={"Content-Type": "application/json"})
            response = connection.getresponse()
            raw = response.read()
        except (ConnectionError, http.client.HTTPException) as exc:  # the server hung up on us
            dropped.append((n, method, path, payload, repr(exc)))
            connection.close()
            connection = http.client.HTTPConnection(host, int(port), timeout=30)
            continue
        statuses[response.status] += 1
        if response.status >= 500 and response.status not in (503, 504):
            server_errors.append((n, method, path, payload, response.status, raw[:200]))
        if response.status >= 400 and not _error_shape(raw, path, response.status):
            shapes.append((n, method, path, response.status, raw[:200]))
        if response.will_close:
            dropped.append((n, method, path, payload))
            connection.close()
            connection = http.client.HTTPConnection(host, int(port), timeout=30)
    connection.close()
    assert not server_errors, f"{len(server_errors)} of {REQUESTS} answered 5xx, e.g. {server_errors[:3]}"
    assert not dropped, f"{len(dropped)} answers closed the keep-alive connection, e.g. {dropped[:3]}"
    assert not shapes, f"{len(shapes)} errors not in OpenAI's shape, e.g. {shapes[:3]}"


# The probe's findings, each on the same keep-alive connection: (method, path, JSON body, status, code).
FOUND = [
    ("POST", "/v1/embeddings", {"input": SURROGATE}, 400, "invalid_request"),
    ("POST", "/v1/embeddings", {"input": ["ok", "a" + SURROGATE]}, 400, "invalid_request"),
    ("POST", "/pooling", {"input": "ok", "prompt": SURROGATE}, 400, "invalid_request"),
    ("POST", "/v1/jobs", {"input": "ok", "model": SURROGATE}, 400, "invalid_request"),
    ("POST", "/v1/embeddings", {"input": "ok", SURROGATE: 1}, 400, "invalid_request"),
    *[(method, f"/v1/jobs/{job_id}", None, 404, "not_found")
      for job_id in ("*", "x%20y", "%00", "%FF") for method in ("GET", "DELETE")],
]


def test_the_probes_findings_are_4xx_on_one_connection(gateway):
    host, port = gateway.url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    for method, path, payload, status, code in FOUND:
        connection.request(method, path, body=None if payload is None else json.dumps(payload),
                           headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        raw = response.read()
        error = json.loads(raw)["error"]
        assert (response.status, error.get("embedfleet_code", error["code"])) == (status, code), (path, payload, raw)
        assert _error_shape(raw, path, status) and not response.will_close
    connection.close()


def test_an_internal_error_is_a_500_that_keeps_the_connection(gateway, redis_client):
    """A fault on our side (here: a job's answer options corrupted in Redis) is a 500 in OpenAI's shape,
    and the next request on the same connection is served."""
    with Producer(gateway.redis_url) as producer:
        job_id = producer.submit(["text"], MODEL)
    answer(redis_client, [job_id])
    redis_client.set(keys.job_options_key(job_id), b"\x00 not json")
    host, port = gateway.url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    connection.request("GET", f"/v1/jobs/{job_id}")
    response = connection.getresponse()
    raw = response.read()
    assert response.status == 500 and json.loads(raw)["error"]["code"] == "internal_error", raw
    assert not response.will_close
    connection.request("GET", "/v1/models")
    assert connection.getresponse().status == 200  # the same socket: it was not closed under us
    connection.close()


def _error_shape(raw: bytes, path: str, status: int) -> bool:
    """OpenAI's error body; on vLLM's /pooling, vLLM's (the status as an integer `code`, our code beside it)."""
    try:
        error = json.loads(raw)["error"]
    except (ValueError, KeyError, TypeError):
        return False
    if path == "/pooling":
        return set(error) == {"message", "type", "param", "code", "embedfleet_code"} and error["code"] == status \
            and error["type"].endswith("Error") and isinstance(error["message"], str)
    return set(error) == {"message", "type", "param", "code"} and isinstance(error["message"], str)
