"""The HTTP gateway end to end: real uvicorn servers, a real worker process on all-MiniLM-L6-v2, real Redis.

Tests that need "no worker processing" pause the worker process (SIGSTOP): it stays registered and
advertised, exactly like a worker stuck in a long batch, and SIGCONT lets it carry on.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from embedfleet.common.errors import ValidationError
from embedfleet.common.redisserver import free_port
from embedfleet import Producer
from embedfleet.producer.gateway import GatewaySettings
from tests.gatewayserver import Server

MODEL = "minilm"
KEY = "test-key"
TEXTS = ["The cat sits on the mat.", "A fleet of workers embeds text.", "Redis keeps the queue safe."]
ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Fleet:
    redis_url: str
    worker: subprocess.Popen
    producer: Producer
    main: httpx.Client  # api key, 256 KiB body limit
    tight: httpx.Client  # no key; max queue depth 2, request timeout 0.5 s, 4 inputs per request
    reference: np.ndarray  # Producer.embed(TEXTS)


def _settings(redis_url: str, **fields) -> GatewaySettings:
    return GatewaySettings(redis_url=redis_url, port=free_port(), **fields)


@pytest.fixture(scope="module")
def gateways(redis_server, minilm_path):
    """A real `python -m embedfleet.worker` process serving MiniLM, two gateways on it (main: an API key and a 256 KiB
    body limit; tight: no key, queue depth 2, 0.5 s timeout, 4 inputs), a Producer, the reference vectors."""
    redis.Redis.from_url(redis_server.url).flushall()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    worker = subprocess.Popen([sys.executable, "-m", "embedfleet.worker", "--redis-url", redis_server.url, "--model",
                               minilm_path, "--served-model-name", MODEL, "--poll-timeout", "1",
                               "--probe-seconds", "1", "--max-embed-len", "2048", "--chunks-per-job", "2"],
                              env=env)
    servers = [Server(_settings(redis_server.url, api_key=KEY, max_body_bytes=256 * 1024)),
               Server(_settings(redis_server.url, max_queue_depth=2, request_timeout=0.5, max_inputs=4))]
    main = httpx.Client(base_url=servers[0].url, headers={"Authorization": f"Bearer {KEY}"}, timeout=60)
    tight = httpx.Client(base_url=servers[1].url, timeout=60)
    producer = Producer(redis_server.url)
    try:
        deadline = time.monotonic() + 180
        while main.get("/health").status_code != 200:
            assert worker.poll() is None, "the worker process exited"
            assert time.monotonic() < deadline, "no worker came up"
            time.sleep(0.2)
        yield Fleet(redis_server.url, worker, producer, main, tight, producer.embed(TEXTS, MODEL, timeout=60))
    finally:
        _stop(worker)
        for client in (main, tight):
            client.close()
        producer.close()
        for server in servers:
            server.stop()


def _stop(worker: subprocess.Popen) -> None:
    if worker.poll() is None:
        worker.send_signal(signal.SIGCONT)
        worker.terminate()
        try:
            worker.wait(30)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()


@contextlib.contextmanager
def paused(fleet: Fleet):
    """No worker processing: the worker process is stopped (still advertised) until the block ends."""
    deadline = time.monotonic() + 30
    while fleet.producer.queue_depth(MODEL):  # what earlier tests left is served first
        assert time.monotonic() < deadline, "the worker does not drain its queue"
        time.sleep(0.05)
    fleet.worker.send_signal(signal.SIGSTOP)
    try:
        # A blocking dequeue the worker sent before it stopped still takes the next job inside Redis:
        # hand it a decoy, so that the jobs the test submits next stay queued.
        decoy = fleet.producer.submit(["decoy"], MODEL)
        deadline = time.monotonic() + 1.0
        while fleet.producer.queue_depth(MODEL) and time.monotonic() < deadline:
            time.sleep(0.05)
        yield
    finally:
        fleet.worker.send_signal(signal.SIGCONT)
    fleet.producer.wait(decoy, timeout=60)  # the worker is back at work before the next test


def base(fleet: Fleet) -> str:
    return str(fleet.main.base_url).rstrip("/")


def assert_error(response: httpx.Response, status: int, code: str, param: str | None = None) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == code and error["message"]
    if param is not None:
        assert error["param"] == param
    return error


# -- without a fleet ------------------------------------------------------------------------------------
def test_every_error_code_has_a_status_and_every_pooling_param_a_field():
    from embedfleet.common.errors import _BY_CODE
    from embedfleet.common.params import PoolingParams
    from embedfleet.producer.gateway.core.errors import STATUS
    from embedfleet.producer.gateway.core.schemas import EmbedBody

    assert set(_BY_CODE) <= set(STATUS)
    assert set(PoolingParams.model_fields) <= set(EmbedBody.model_fields)


def test_gateway_imports_no_model_code():
    check = ("import sys, embedfleet.producer.gateway;"
             " print(sorted({'torch', 'transformers', 'embedfleet.worker'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.stdout.strip() == "[]"


def test_entry_point_takes_the_flags_up_passes(redis_server):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "embedfleet.producer.gateway", "--redis-url", redis_server.url,
                             "--host", "127.0.0.1", "--port", str(port), "--api-key", KEY],
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                response = httpx.get(f"http://127.0.0.1:{port}/v1/models",
                                     headers={"Authorization": f"Bearer {KEY}"})
                break
            except httpx.TransportError:
                assert proc.poll() is None and time.monotonic() < deadline, "the gateway did not start"
                time.sleep(0.1)
        assert response.status_code == 200 and response.json()["object"] == "list"
        assert httpx.get(f"http://127.0.0.1:{port}/v1/models").status_code == 401
    finally:
        proc.terminate()
        proc.wait(10)


# -- OpenAI /v1/embeddings ---------------------------------------------------------------------------
def test_openai_client_base64_default_and_float_match_producer(gateways):
    client = openai.OpenAI(base_url=f"{base(gateways)}/v1", api_key=KEY)
    for kwargs in ({}, {"encoding_format": "float"}):  # no encoding_format: the client asks for base64
        response = client.embeddings.create(model=MODEL, input=TEXTS, **kwargs)
        got = np.array([item.embedding for item in sorted(response.data, key=lambda d: d.index)])
        np.testing.assert_allclose(got, gateways.reference, atol=1e-6)
        assert response.model == MODEL and response.object == "list"
        usage = response.usage
        assert usage.prompt_tokens > len(TEXTS) and usage.total_tokens == usage.prompt_tokens
    single = client.embeddings.create(model=MODEL, input=TEXTS[0])
    np.testing.assert_allclose(single.data[0].embedding, gateways.reference[0], atol=1e-6)


def test_token_ids_and_default_model(gateways):
    ids = [[101, 7592, 2088, 102], [101, 2307, 102]]
    expected = gateways.producer.embed(ids, MODEL)
    for body, rows in (({"input": ids}, expected), ({"input": ids[0]}, expected[:1])):
        response = gateways.main.post("/v1/embeddings", json=body)  # no model: the only served one
        assert response.status_code == 200, response.text
        got = np.array([d["embedding"] for d in response.json()["data"]])
        np.testing.assert_allclose(got, rows, atol=1e-6)


# -- vLLM /pooling -----------------------------------------------------------------------------------
@pytest.mark.parametrize("embed_dtype,endianness", [("float32", "native"), ("float16", "little"),
                                                    ("float32", "big"), ("float16", "big")])
def test_pooling_bytes_decode_with_numpy(gateways, embed_dtype, endianness):
    body = {"model": MODEL, "input": TEXTS, "encoding_format": "bytes", "embed_dtype": embed_dtype,
            "endianness": endianness}
    response = gateways.main.post("/pooling", json=body)
    assert response.status_code == 200 and response.headers["content-type"] == "application/octet-stream"
    meta = json.loads(response.headers["metadata"])
    assert meta["model"] == MODEL and meta["usage"]["prompt_tokens"] > 0 and len(meta["data"]) == len(TEXTS)
    rows = []
    for item in meta["data"]:
        order = {"little": "<", "big": ">"}[item["endianness"]]
        assert item["embed_dtype"] == embed_dtype
        assert item["endianness"] == (sys.byteorder if endianness == "native" else endianness)
        chunk = response.content[item["start"]:item["end"]]
        rows.append(np.frombuffer(chunk, dtype=np.dtype(embed_dtype).newbyteorder(order)).reshape(item["shape"]))
    np.testing.assert_allclose(np.stack(rows), gateways.reference, atol=1e-6 if embed_dtype == "float32" else 1e-3)
    only = gateways.main.post("/pooling", json={**body, "encoding_format": "bytes_only"})
    assert only.content == response.content and "metadata" not in only.headers


@pytest.mark.parametrize("embed_dtype", ["fp8_e4m3", "fp8_e5m2"])
def test_fp8_through_bytes_base64_and_float(gateways, embed_dtype):
    """vLLM's fp8 outputs: the bits of torch's float8 cast, one byte per dimension, in every encoding."""
    import torch

    torch_dtype = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}[embed_dtype]
    bits = torch.tensor(gateways.reference.astype(np.float32)).to(torch_dtype).view(torch.uint8).numpy()
    widened = torch.tensor(bits).view(torch_dtype).float().numpy()
    body = {"model": MODEL, "input": TEXTS, "embed_dtype": embed_dtype}
    response = gateways.main.post("/pooling", json={**body, "encoding_format": "bytes"})
    assert response.status_code == 200, response.text
    meta = json.loads(response.headers["metadata"])
    assert [(d["embed_dtype"], d["shape"], d["end"] - d["start"]) for d in meta["data"]] == \
        [(embed_dtype, [bits.shape[1]], bits.shape[1])] * len(TEXTS)
    assert np.array_equal(np.frombuffer(response.content, np.uint8).reshape(bits.shape), bits)
    for path, key in (("/pooling", "data"), ("/v1/embeddings", "embedding")):
        encoded = gateways.main.post(path, json={**body, "encoding_format": "base64"}).json()["data"]
        assert np.array_equal(np.stack([np.frombuffer(base64.b64decode(d[key]), np.uint8) for d in encoded]), bits)
        floats = gateways.main.post(path, json={**body, "encoding_format": "float"}).json()["data"]
        np.testing.assert_array_equal(np.array([d[key] for d in floats], np.float32), widened)
    assert np.abs(widened - gateways.reference).max() < (0.07 if embed_dtype == "fp8_e4m3" else 0.13)


def test_pooling_json_float_and_base64(gateways):
    for fmt in ("float", "base64"):
        response = gateways.main.post("/pooling", json={"model": MODEL, "input": TEXTS, "encoding_format": fmt,
                                                     "embed_dtype": "float16", "endianness": "big"})
        assert response.status_code == 200, response.text
        data = response.json()["data"]
        assert [d["object"] for d in data] == ["pooling"] * 3 and [d["index"] for d in data] == [0, 1, 2]
        got = np.array([d["data"] for d in data]) if fmt == "float" else \
            np.stack([np.frombuffer(base64.b64decode(d["data"]), dtype=">f2") for d in data])
        np.testing.assert_allclose(got.astype(np.float32), gateways.reference, atol=1e-3)


def test_openai_client_embeds_a_long_input_in_chunks(gateways, minilm_path):
    """Chunked processing (--max-embed-len) behind the unchanged openai client: 3.5x the model's 256 tokens,
    spread over the fleet as parts (--chunks-per-job 2), equal to chunks embedded by hand."""
    from openai import OpenAI

    from tests.longinputs import cosine, hand_reference

    text = " ".join(f"{TEXTS[i % 3]} Part {i}." for i in range(80))
    expected, tokens = hand_reference(minilm_path, text, max_len=256)
    assert tokens > 3 * 256
    client = OpenAI(base_url=str(gateways.main.base_url) + "/v1", api_key=KEY)
    answer = client.embeddings.create(model=MODEL, input=[text, TEXTS[0]])
    assert cosine(answer.data[0].embedding, expected) >= 0.99999
    assert cosine(answer.data[1].embedding, gateways.reference[0]) >= 0.99999
    assert answer.usage.prompt_tokens == tokens + gateways.producer.wait(gateways.producer.submit([TEXTS[0]], MODEL)
                                                                       ).usage.prompt_tokens


def test_late_chunking_spans_through_every_encoding(gateways):
    text = " ".join(TEXTS * 4)
    expected = gateways.producer.wait(gateways.producer.submit([text], MODEL, chunk_size=16), timeout=30)
    assert expected.spans is not None and len(expected.spans) == len(expected.embeddings) > 2
    spans = [{"input_index": 0, "token_span": [s, e], "char_span": [cs, ce]} for _, s, e, cs, ce in expected.spans]
    body = {"model": MODEL, "input": text, "chunk_size": 16}
    floats = gateways.main.post("/v1/embeddings", json=body).json()["data"]
    assert [{k: d[k] for k in ("input_index", "token_span", "char_span")} for d in floats] == spans
    np.testing.assert_allclose([d["embedding"] for d in floats], expected.embeddings, atol=1e-6)
    encoded = gateways.main.post("/pooling", json={**body, "encoding_format": "base64"}).json()["data"]
    np.testing.assert_array_equal(
        np.stack([np.frombuffer(base64.b64decode(d["data"]), np.float32) for d in encoded]), expected.embeddings)
    raw = gateways.main.post("/pooling", json={**body, "encoding_format": "bytes"})
    meta = json.loads(raw.headers["metadata"])["data"]
    assert [{k: d[k] for k in ("input_index", "token_span", "char_span")} for d in meta] == spans
    by_chars = gateways.main.post("/v1/embeddings", json={"model": MODEL, "input": text,
                                                        "chunk_spans": [[0, 10], [10, len(text)]]})
    assert by_chars.status_code == 200 and [d["char_span"][0] for d in by_chars.json()["data"]] == [0, 8]
    refused = gateways.main.post("/v1/embeddings",
                                 json={"model": MODEL, "input": [text, text], "chunk_spans": [[0, 4]]})
    assert refused.status_code == 400 and "exactly one text" in refused.text


# -- async jobs --------------------------------------------------------------------------------------
def test_job_round_trip_keeps_its_encoding_format(gateways):
    created = gateways.main.post("/v1/jobs", json={"model": MODEL, "input": TEXTS, "encoding_format": "base64"})
    assert created.status_code == 202 and created.json()["status"] == "queued"
    job_id = created.json()["id"]
    done = gateways.main.get(f"/v1/jobs/{job_id}", params={"wait": 30})
    assert done.status_code == 200 and done.json()["status"] == "finished"
    got = np.stack([np.frombuffer(base64.b64decode(d["embedding"]), "<f4") for d in done.json()["data"]])
    np.testing.assert_allclose(got, gateways.reference, atol=1e-6)


def test_long_poll_returns_as_soon_as_the_result_lands(gateways):
    answers = {}
    with paused(gateways):
        job_id = gateways.main.post("/v1/jobs", json={"model": MODEL, "input": TEXTS}).json()["id"]
        assert gateways.main.get(f"/v1/jobs/{job_id}").json()["status"] == "queued"

        def poll():
            answers["response"] = gateways.main.get(f"/v1/jobs/{job_id}", params={"wait": 30})

        poller = threading.Thread(target=poll)
        poller.start()
        time.sleep(1.0)
        assert poller.is_alive(), "the long poll answered while no worker was running"
        resumed = time.monotonic()
    poller.join(30)
    elapsed = time.monotonic() - resumed
    assert answers["response"].status_code == 200 and answers["response"].json()["status"] == "finished"
    assert elapsed < 10, f"the long poll took {elapsed:.1f} s after the worker resumed (wait=30)"
    got = np.array([d["embedding"] for d in answers["response"].json()["data"]])
    np.testing.assert_allclose(got, gateways.reference, atol=1e-6)


def test_cancel_a_pending_job(gateways):
    with paused(gateways):
        job_id = gateways.main.post("/v1/jobs", json={"model": MODEL, "input": TEXTS}).json()["id"]
        cancelled = gateways.main.delete(f"/v1/jobs/{job_id}")
        assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
        assert_error(gateways.main.delete(f"/v1/jobs/{job_id}"), 409, "job_not_cancellable")
        assert_error(gateways.main.get(f"/v1/jobs/{job_id}"), 409, "cancelled")
    assert gateways.producer.wait(gateways.producer.submit(TEXTS[:1], MODEL), 30).ok  # the worker went on
    assert_error(gateways.main.get(f"/v1/jobs/{job_id}"), 409, "cancelled")
    assert_error(gateways.main.delete("/v1/jobs/no-such-job"), 404, "not_found")
    assert_error(gateways.main.get("/v1/jobs/no-such-job", params={"wait": 5}), 404, "not_found")


# -- errors, each triggered for real -----------------------------------------------------------------
def test_queue_full_is_429_with_retry_after(gateways):
    with paused(gateways):
        statuses = []
        for _ in range(4):  # the tight gateway allows 2 queued requests per model
            response = gateways.tight.post("/v1/jobs", json={"model": MODEL, "input": TEXTS[:1]})
            statuses.append(response.status_code)
            if response.status_code == 429:
                break
        assert statuses[-1] == 429 and set(statuses[:-1]) == {202}, statuses
        assert assert_error(response, 429, "queue_full")["type"] == "rate_limit_error"
        assert response.headers["retry-after"] == "1"


def test_timeout_is_504_and_the_request_is_withdrawn(gateways):
    with paused(gateways):
        before = gateways.producer.queue_depth(MODEL)
        start = time.monotonic()
        assert_error(gateways.tight.post("/v1/embeddings", json={"model": MODEL, "input": TEXTS}), 504, "timeout")
        assert time.monotonic() - start < 5
        assert gateways.producer.queue_depth(MODEL) == before  # cancelled: no worker will spend time on it


def test_client_errors(gateways):
    assert_error(gateways.main.post("/v1/embeddings", json={"model": "nope", "input": "x"}), 404,
                 "model_not_found", "model")
    assert_error(gateways.main.post("/v1/embeddings", json={"model": MODEL, "input": "x", "dimensions": 128}),
                 400, "invalid_request", "dimensions")
    assert_error(gateways.main.post("/v1/embeddings", json={"model": MODEL, "input": "x", "dimensions": 0}),
                 400, "invalid_request", "dimensions")
    assert_error(gateways.main.post("/v1/embeddings", json={"model": MODEL, "input": [1.5]}), 400,
                 "invalid_request", "input")
    assert_error(gateways.main.post("/v1/embeddings", json={"model": MODEL, "input": "x", "bogus": 1}), 400,
                 "invalid_request", "bogus")
    not_json = {"content": b"{not json", "headers": {"content-type": "application/json"}}
    assert_error(gateways.main.post("/v1/embeddings", **not_json), 400, "decode_error")
    assert_error(gateways.tight.post("/v1/embeddings", json={"model": MODEL, "input": ["x"] * 5}), 400,
                 "invalid_request", "input")
    client = openai.OpenAI(base_url=f"{base(gateways)}/v1", api_key=KEY)
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="nope", input="x")


@pytest.mark.parametrize("fields, says", [
    ({"input": "x", "dimension": 8}, "did you mean `dimensions`"),  # a misspelt field
    ({"input": ["a text", [1, 2]]}, "a list mixing list and str"),  # texts and token ids in one list
    ({"input": []}, "at least one"),
    ({"input": ["a text", ""]}, "input 1 is an empty string"),  # refused, as OpenAI and TEI refuse it
    ({"input": "x", "dimensions": 0}, "positive integer"),
    ({"input": "x", "dimensions": 64}, "not a Matryoshka model"),
    ({"input": "x", "embed_dtype": "float64"}, "embed_dtype"),
    ({"input": "x", "truncate_prompt_tokens": "all"}, "valid integer"),
    # integers msgpack cannot carry are bounded where they enter (common/bounds.py), each naming what is allowed
    ({"input": "x", "dimensions": 2**64}, "at most 65536, got 18446744073709551616"),
    ({"input": "x", "chunk_spans": [[0, 2**64]]}, "<= 2147483647"),
    ({"input": "x", "truncate_prompt_tokens": 2**70}, "at most 1048576"),
    ({"input": [[1, 2**64]]}, "token id 18446744073709551616 (input 0, position 1) is out of range"),
    ({"input": "x", "priority": -(2**63)}, "from -2147483648 to 2147483647"),
])
def test_the_same_mistake_gets_the_same_error_from_python_and_http(gateways, fields, says):
    answer = gateways.tight.post("/v1/embeddings", json={"model": MODEL, **fields})
    http = assert_error(answer, 400, "invalid_request")
    keywords = dict(fields)
    inputs = keywords.pop("input")
    with pytest.raises(ValidationError) as caught:
        gateways.producer.submit(inputs, MODEL, **keywords)
    assert (http["code"], http["param"], http["message"]) == (caught.value.code, caught.value.param,
                                                              caught.value.message)
    assert says in http["message"] and http["param"] is not None


def test_dimensions_of_the_full_size_and_offline_docs(gateways):
    answer = gateways.main.post("/v1/embeddings", json={"model": MODEL, "input": TEXTS, "dimensions": 384})
    assert answer.status_code == 200, answer.text
    np.testing.assert_allclose([d["embedding"] for d in answer.json()["data"]], gateways.reference, atol=1e-5)

    docs = gateways.tight.get("/docs")
    assert docs.status_code == 200 and "/docs/assets/swagger-ui-bundle.js" in docs.text and "cdn" not in docs.text
    assert gateways.tight.get("/docs/assets/swagger-ui-bundle.js").status_code == 200
    assert gateways.tight.get("/openapi.json").json()["paths"]["/v1/embeddings"]
    assert gateways.main.get("/docs").status_code == 404  # with an API key there are no docs (docs/http.md says so)
    assert gateways.main.get("/openapi.json").status_code == 404


def test_body_limit_on_content_length_and_on_bytes_read(gateways):
    big = {"model": MODEL, "input": ["word " * 1000] * 60}  # ~300 KB, over the 256 KiB limit
    assert_error(gateways.main.post("/v1/embeddings", json=big), 413, "payload_too_large")
    chunks = (json.dumps(big)[i:i + 65536].encode() for i in range(0, 320_000, 65536))
    assert_error(gateways.main.post("/v1/embeddings", content=chunks, headers={"content-type": "application/json"}),
                 413, "payload_too_large")  # chunked: no Content-Length to trust


def test_auth(gateways):
    url = base(gateways)
    assert_error(httpx.get(f"{url}/v1/models"), 401, "unauthorized")
    assert_error(httpx.post(f"{url}/v1/embeddings", json={"input": "x"}, headers={"Authorization": "Bearer nope"}),
                 401, "unauthorized")
    assert_error(httpx.get(f"{url}/metrics"), 401, "unauthorized")
    assert httpx.get(f"{url}/health").status_code == 200
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{url}/v1", api_key="wrong").embeddings.create(model=MODEL, input="x")


def test_redis_down_is_503(gateways):
    server = Server(_settings(f"redis://127.0.0.1:{free_port()}/0"))
    try:
        assert_error(httpx.post(f"{server.url}/v1/embeddings", json={"input": "x"}), 503, "redis_unavailable")
        health = httpx.get(f"{server.url}/health")
        assert health.status_code == 503 and health.json()["redis"] == "unreachable"
    finally:
        server.stop()


# -- models, health, metrics -------------------------------------------------------------------------
def test_models_and_health(gateways):
    models = gateways.main.get("/v1/models").json()
    assert models["object"] == "list" and [m["id"] for m in models["data"]] == [MODEL]
    entry = models["data"][0]
    assert entry["object"] == "model" and entry["live_workers"] == 1
    [worker] = entry["workers"]  # what the worker advertised of itself, its probed batch shape included
    assert worker["model"] == MODEL and worker["device"] == "cpu" and worker["dtype"] == "float32"
    assert worker["budget_source"].startswith("probe")  # the probe's guess, then learned while serving
    assert worker["max_batch_tokens"] >= 256 and worker["max_batch_size"] >= 1
    assert entry["capabilities"]["embedding_size"] == 384 and entry["capabilities"]["name"] == MODEL
    assert gateways.main.get("/health").json() == {"status": "ok", "redis": "ok", "models": {MODEL: 1}}


def test_metrics_parse(gateways):
    gateways.main.post("/v1/embeddings", json={"model": "nope", "input": "x"})
    families = {f.name: f for f in text_string_to_metric_families(gateways.main.get("/metrics").text)}
    requests = families["embedfleet_gateway_requests"].samples
    assert any(s.labels["route"] == "/v1/embeddings" and s.labels["status"] == "200" for s in requests)
    assert any(s.labels["route"] == "/v1/jobs/{job_id}" for s in requests)  # templates, never raw ids
    errors = {s.labels["code"]: s.value for s in families["embedfleet_gateway_errors"].samples
              if s.name.endswith("_total")}
    assert errors["model_not_found"] >= 1 and errors["unauthorized"] >= 1
    assert [s.labels["model"] for s in families["embedfleet_queue_depth"].samples] == [MODEL]
    assert any(s.name.endswith("_bucket") for s in families["embedfleet_gateway_request_seconds"].samples)


def test_no_live_worker_is_503(gateways):
    """Runs last: stops the worker for good."""
    gateways.worker.terminate()
    gateways.worker.wait(30)
    health = gateways.main.get("/health")
    assert_error(health, 503, "no_worker")
    assert health.headers["retry-after"] == "1"
    assert_error(gateways.main.post("/v1/embeddings", json={"model": MODEL, "input": "x"}), 503, "no_worker", "model")
    assert_error(gateways.main.post("/v1/embeddings", json={"input": "x"}), 503, "no_worker")
