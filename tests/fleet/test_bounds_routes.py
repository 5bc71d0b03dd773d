"""Issue 32 on a live gateway and worker (a BatchWorker thread) over a redis-server of their own: huge inputs
refused before the work (common/bounds.py, worker/engine/inputbounds.py) with a small request answered meanwhile,
texts read as [UNK], OpenAI's `input` as the param of an empty text, TEI's strict booleans, and TEI's routes
per model (`/tei/<model>/`, `--tei-model`)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import huggingface_hub.constants
import numpy as np
import pytest
from huggingface_hub import InferenceClient

from embedfleet.common.redisserver import RedisServer
from tests import gatewayserver
from tests.livegateway import forbid_internet, live_gateway
from embedfleet.worker.engine.engine import Engine
from embedfleet.worker.engine.models.loader import load_model

HUGE = "word " * 1_400_000  # 7 MB, 1.4M tokens


@pytest.fixture(scope="module")
def two_models(minilm_engine, bert_mean):
    """minilm and a tiny BERT ("tiny") on one gateway: TEI's routes must be told which."""
    tiny = Engine(load_model(bert_mean, served_name="tiny"))
    with RedisServer() as server, live_gateway(server.url, [minilm_engine, tiny]) as url, \
            httpx.Client(base_url=url, timeout=120) as client:
        yield server.url, client


def test_a_7mb_input_is_refused_and_a_small_request_sent_meanwhile_is_answered(two_models):
    _, http = two_models
    with ThreadPoolExecutor(2) as pool:
        huge = pool.submit(http.post, "/v1/embeddings", json={"model": "minilm", "input": HUGE})
        small = pool.submit(http.post, "/v1/embeddings", json={"model": "minilm", "input": "a small one"})
        huge, small = huge.result(), small.result()
    assert small.status_code == 200
    assert huge.status_code == 400 and huge.json()["error"]["code"] == "input_too_long"
    assert huge.json()["error"]["param"] == "input" and "7,000,000 characters" in huge.json()["error"]["message"]
    # Under the producer's character bound, the worker judges it from a window of its text.
    worker_side = http.post("/v1/embeddings", json={"model": "minilm", "input": ["fine", "word " * 5_000]})
    assert worker_side.status_code == 400 and "input 1 has more than 256 tokens" in worker_side.text
    cut = http.post("/v1/embeddings", json={"model": "minilm", "input": HUGE, "truncate_prompt_tokens": -1})
    assert cut.status_code == 200 and cut.json()["usage"]["prompt_tokens"] == 256
    whole = http.post("/v1/embeddings", json={"model": "minilm", "input": "word " * 300, "truncate_prompt_tokens": -1})
    np.testing.assert_allclose(cut.json()["data"][0]["embedding"], whole.json()["data"][0]["embedding"], atol=1e-6)
    for body in ({"model": "minilm", "prompt": HUGE[:6_000_000]}, {"model": "minilm", "inputs": HUGE[:6_000_000]}):
        tokenized = http.post("/tokenize", json=body)  # vLLM's and TEI's shape
        assert tokenized.status_code == 400 and "(/tokenize too)" in tokenized.text, tokenized.text[:300]


def test_a_text_read_as_unknown_tokens_gets_a_word(two_models):
    _, http = two_models
    answer = http.post("/v1/embeddings", json={"model": "minilm", "input": "x" * 20_000})
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "input"
    assert "read as the unknown token [UNK]" in answer.json()["error"]["message"]


def test_an_empty_text_is_refused_as_openais_input(two_models):
    _, http = two_models
    for body in ({"model": "minilm", "input": ""}, {"model": "minilm", "input": ["a", ""]}):
        answer = http.post("/v1/embeddings", json=body)
        assert answer.status_code == 400 and answer.json()["error"]["param"] == "input", answer.text
        assert "empty string" in answer.json()["error"]["message"]


@pytest.mark.parametrize("field, value", [("truncate", "yes"), ("truncate", 1), ("normalize", "false"),
                                          ("truncate", "true")])
def test_tei_booleans_are_strict(two_models, field, value):
    _, http = two_models
    answer = http.post("/embed", json={"model": "minilm", "inputs": "a", field: value})
    assert answer.status_code in (400, 422) and answer.json()["error_type"] == "Validation", answer.text
    assert field in answer.json()["error"]
    assert http.post("/embed", json={"model": "minilm", "inputs": "a", field: True}).status_code == 200


def test_each_model_has_a_tei_root_of_its_own(two_models, monkeypatch):
    _, http = two_models
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_DISABLE_TELEMETRY", True)
    offline = forbid_internet(monkeypatch)
    assert http.post("/embed", json={"inputs": "a"}).status_code == 400  # several served: which?
    for name, size in (("minilm", 384), ("tiny", 32)):
        root = f"{str(http.base_url).rstrip('/')}/tei/{name}"
        client = InferenceClient(model=root)  # posts to the bare URL: TEI's POST /, here the model's
        vectors = client.feature_extraction("a fleet of workers")
        named = http.post("/embed", json={"model": name, "inputs": "a fleet of workers"}).json()
        assert vectors.shape == (1, size)
        np.testing.assert_allclose(vectors, named, atol=1e-6)
        assert http.get(f"/tei/{name}/info").json()["model_id"] == name
        assert http.post(f"/tei/{name}/embed", json={"inputs": "b"}).status_code == 200
        assert len(http.post(f"/tei/{name}/tokenize", json={"inputs": "b c"}).json()[0]) == 4  # [CLS] b c [SEP]
    conflict = http.post("/tei/tiny/embed", json={"model": "minilm", "inputs": "b"})
    assert conflict.status_code == 400 and "names model 'minilm' but the path /tei/tiny/" in conflict.json()["error"]
    assert http.post("/tei/nope/embed", json={"inputs": "b"}).status_code == 404
    assert http.post("/tei/tiny/v1/embeddings", json={"input": "b"}).status_code == 404  # TEI's routes only
    assert offline == []


def test_the_tei_model_flag_names_the_model_of_the_bare_routes(two_models):
    redis_url, http = two_models
    server = gatewayserver.Server(gatewayserver.settings(redis_url, tei_model="tiny"))
    try:
        with httpx.Client(base_url=server.url, timeout=60) as other:
            bare = other.post("/embed", json={"inputs": "a fleet"})
            assert bare.status_code == 200 and len(bare.json()[0]) == 32
            assert other.get("/info").json()["model_id"] == "tiny"
            assert len(other.post("/embed", json={"model": "minilm", "inputs": "a"}).json()[0]) == 384
    finally:
        server.stop()
