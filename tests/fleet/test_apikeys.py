"""API keys with a weight and a rate at the gateway, and the scheduling fields over HTTP (issue #10): real
uvicorn gateways, real HTTP clients, a real BatchWorker on the null model, real Redis."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from embedfleet.common.protocol import keys
from embedfleet.producer.gateway.core.apikeys import ApiKey, KeyLimiter, parse_api_keys
from embedfleet.producer.gateway.core.errors import RateLimitedError
from tests.commands import assert_one_line_error, clean_env, embedfleet
from tests.gatewayserver import Server, settings
from tests.harness import burst, idle_worker
from embedfleet.worker.engine.engine import Engine
from embedfleet.worker.engine.models.nullmodel import NullModel

MODEL = "keyed"
KEYS = {"sk-web": {"name": "web", "weight": 3}, "sk-batch": {"name": "batch", "weight": 1, "rate": 1, "burst": 2}}


@pytest.mark.parametrize("text, words", [
    ("{not json", ["not valid JSON"]),
    ("[]", ["non-empty JSON object"]),
    ('{"k": {"wieght": 2}}', ["options must be an object with", "wieght"]),
    ('{"k": {"rate": 0}}', ["`rate` must be a positive number, got 0"]),
    ('{"k": {"weight": true}}', ["`weight` must be a positive number"]),
    ('{"k": {"burst": 5}}', ["`burst` needs a `rate`"]),
    ('{"a": {"name": "x"}, "b": {"name": "x"}}', ["two keys share a name", "'x'"]),
    ('{" k": {}}', ["printable text without surrounding spaces"]),
    ("@/nonexistent/keys.json", ["cannot read the API keys file /nonexistent/keys.json"]),
])
def test_bad_key_configuration_says_what_is_wrong(text, words):
    with pytest.raises(ValueError) as err:
        parse_api_keys(text)
    assert all(word in str(err.value) for word in words), str(err.value)


def test_keys_come_inline_or_from_a_file_with_the_single_key_shorthand(tmp_path):
    path = tmp_path / "keys.json"
    path.write_text(json.dumps(KEYS))
    assert parse_api_keys(f"@{path}", "sk-old") == {
        "sk-old": ApiKey("default"), "sk-web": ApiKey("web", 3.0), "sk-batch": ApiKey("batch", 1.0, 1, 2)}
    assert parse_api_keys('{"sk-x": null}') == {"sk-x": ApiKey("key1")}


def test_the_gateway_refuses_to_start_on_a_bad_key_file_in_one_line(tmp_path):
    done = embedfleet("gateway", "--redis-url", "redis://127.0.0.1:1/0", "--api-keys", '{"k": {"rate": -1}}',
                      env=clean_env(tmp_path))
    assert_one_line_error(done, 2, "`rate` must be a positive number")


def test_a_key_over_its_rate_waits_as_retry_after_says():
    clock = [100.0]
    limiter = KeyLimiter(parse_api_keys(json.dumps(KEYS)), clock=lambda: clock[0])
    for _ in range(2):  # the burst
        with limiter.admit("batch"):
            pass
    with pytest.raises(RateLimitedError, match="'batch' is over its rate of 1 requests/s") as err:
        with limiter.admit("batch"):
            pass
    assert err.value.retry_after == 1 and err.value.code == "rate_limited"
    for _ in range(5):
        with limiter.admit("web"):  # no rate: never limited
            pass
    clock[0] += 1.0
    with limiter.admit("batch"):  # a second later, one more fits
        pass


def test_a_full_gateway_holds_each_key_to_its_weighted_share():
    limiter = KeyLimiter(parse_api_keys(json.dumps({"a": {"name": "a", "weight": 3}, "b": {"name": "b"}})),
                         max_in_flight=4)
    assert limiter.share == {"a": 3, "b": 1}
    held = [limiter.admit("a") for _ in range(4)]
    for hold in held:  # not full yet: a key may use what the others leave
        hold.__enter__()
    with pytest.raises(RateLimitedError, match="its weighted share"):
        with limiter.admit("a"):
            pass
    with limiter.admit("b"):  # the quiet key still gets its turn
        pass
    held.pop().__exit__(None, None, None)
    with limiter.admit("a"):  # back under the limit
        pass
    for hold in held:
        hold.__exit__(None, None, None)


@pytest.fixture
def keyed_gateway(fleet):
    """A keyed gateway and a null-model worker serving in a thread."""
    fleet.serve(Engine(NullModel("null:4", MODEL)))
    return fleet.gateway(api_keys=json.dumps(KEYS))


def client(server: Server, key: str) -> httpx.Client:
    return httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {key}"}, timeout=30)


def test_a_key_over_its_rate_gets_429_with_retry_after_and_others_go_on(keyed_gateway):
    body = {"model": MODEL, "input": "hello"}
    with client(keyed_gateway, "sk-batch") as batch, client(keyed_gateway, "sk-web") as web, \
            client(keyed_gateway, "wrong") as wrong:
        assert [batch.post("/v1/embeddings", json=body).status_code for _ in range(2)] == [200, 200]
        refused = batch.post("/v1/embeddings", json=body)
        assert refused.status_code == 429, refused.text
        assert refused.json()["error"]["code"] == "rate_limited" and "'batch'" in refused.json()["error"]["message"]
        assert refused.headers["retry-after"] == "1"
        assert batch.post("/v1/jobs", json=body).status_code == 429  # async jobs count against the rate too
        assert all(web.post("/v1/embeddings", json=body).status_code == 200 for _ in range(4))
        assert wrong.post("/v1/embeddings", json=body).status_code == 401
        time.sleep(1.1)
        assert batch.post("/pooling", json=body).status_code == 200  # the bucket refilled
        families = {f.name: f for f in text_string_to_metric_families(web.get("/metrics").text)}
    counts = {(s.labels["key"], s.labels["outcome"]): s.value
              for s in families["embedfleet_gateway_key_requests"].samples if s.name.endswith("_total")}
    assert counts[("batch", "refused")] == 2 and counts[("batch", "admitted")] == 3
    assert counts[("web", "admitted")] == 4 and all(key != "sk-batch" for key, _ in counts)  # names, never keys


def test_priority_and_deadline_over_http(redis_url, redis_client):
    """Jobs queued at the level they ask for; a bad priority is a 400 naming it; an expired job reads 504
    `expired` (the worker here only advertises, then serves in one burst)."""
    worker = idle_worker(Engine(NullModel("null:4", MODEL)), redis_client)
    server = Server(settings(redis_url))
    try:
        with httpx.Client(base_url=server.url, timeout=30) as http:
            bulk = http.post("/v1/jobs", json={"model": MODEL, "input": "b", "priority": "bulk"}).json()["id"]
            vllm = http.post("/v1/jobs", json={"model": MODEL, "input": "v", "priority": 2}).json()["id"]
            late = http.post("/v1/jobs", json={"model": MODEL, "input": "l", "timeout": 0.1}).json()["id"]
            assert redis_client.lrange(f"rq:queue:{keys.queue_name(MODEL, 'bulk')}", 0, -1) == [
                bulk.encode(), vllm.encode()]
            bad = http.post("/v1/embeddings", json={"model": MODEL, "input": "x", "priority": "urgent"})
            assert bad.status_code == 400 and bad.json()["error"]["param"] == "priority"
            past = http.post("/v1/embeddings", json={"model": MODEL, "input": "x", "deadline": 1})
            assert past.status_code == 400 and past.json()["error"]["param"] == "deadline"
            time.sleep(0.2)
            assert burst(worker)
            expired = http.get(f"/v1/jobs/{late}")
            assert expired.status_code == 504 and expired.json()["error"]["code"] == "expired", expired.text
            assert http.get(f"/v1/jobs/{bulk}").status_code == 200
    finally:
        server.stop()


def test_without_keys_a_full_gateway_answers_429_until_a_request_is_answered(redis_url, redis_client):
    """--max-in-flight holds without API keys too (a flood gets 429, not memory growth); on by default."""
    assert settings(redis_url).max_in_flight == 1024
    worker = idle_worker(Engine(NullModel("null:4", MODEL)), redis_client)  # the held requests wait for its burst
    server = Server(settings(redis_url, max_in_flight=2))
    body = {"model": MODEL, "input": "held"}
    try:
        with httpx.Client(base_url=server.url, timeout=60) as http:
            held: list[httpx.Response] = []
            threads = [threading.Thread(target=lambda: held.append(http.post("/v1/embeddings", json=body)))
                       for _ in range(2)]
            for thread in threads:
                thread.start()
            deadline = time.monotonic() + 30
            while redis_client.llen("rq:queue:" + keys.queue_name(MODEL)) < 2:  # both admitted and queued
                assert time.monotonic() < deadline, "the held requests were not queued"
                time.sleep(0.02)
            refused = http.post("/v1/jobs", json=body)
            assert burst(worker)
            for thread in threads:
                thread.join(30)
            after = http.post("/v1/jobs", json=body)  # nothing held now
    finally:
        server.stop()
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "rate_limited", refused.text
    assert "--max-in-flight 2" in refused.json()["error"]["message"] and refused.headers["retry-after"] == "1"
    assert [r.status_code for r in held] == [200, 200]
    assert after.status_code == 202, after.text
