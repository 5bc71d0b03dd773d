"""The task routes end to end: a real uvicorn gateway, BatchWorker threads on tiny random models, real Redis;
answers compared with the references of tests/parity/test_tasks.py, and the openai client unchanged on
/v1/embeddings."""

from __future__ import annotations

import base64
import json

import httpx
import numpy as np
import openai
import pytest
import torch
from sentence_transformers import CrossEncoder
from transformers import AutoModel, AutoTokenizer

from embedfleet import Producer
from tests.taskengines import DOCS, QUERY, TEXTS, engine


@pytest.fixture
def http(fleet, bert_mean, cross_encoder, classifier, colbert):
    folders = {"emb": bert_mean, "ce": cross_encoder, "clf": classifier, "colbert": colbert}
    for name, folder in folders.items():
        fleet.serve(engine(folder, name))
    with httpx.Client(base_url=fleet.gateway().url, timeout=30) as client:
        yield client


def test_score_route_equals_cross_encoder(http, cross_encoder):
    body = http.post("/score", json={"model": "ce", "text_1": QUERY, "text_2": DOCS}).json()
    expected = CrossEncoder(cross_encoder, device="cpu").predict([(QUERY, d) for d in DOCS])
    assert [d["index"] for d in body["data"]] == list(range(len(DOCS)))
    np.testing.assert_allclose([d["score"] for d in body["data"]], expected, rtol=1e-5)
    assert body["usage"]["prompt_tokens"] > 0 and body["object"] == "list"
    newer = http.post("/v1/score", json={"model": "ce", "queries": QUERY, "documents": DOCS}).json()
    assert [d["score"] for d in newer["data"]] == [d["score"] for d in body["data"]]


@pytest.mark.parametrize("path", ["/rerank", "/v1/rerank", "/v2/rerank"])
def test_rerank_routes(http, cross_encoder, path):
    reference = CrossEncoder(cross_encoder, device="cpu").rank(QUERY, DOCS, top_k=2, return_documents=True)
    body = http.post(path, json={"model": "ce", "query": QUERY, "documents": DOCS, "top_n": 2}).json()
    assert [r["index"] for r in body["results"]] == [r["corpus_id"] for r in reference]
    assert [r["document"]["text"] for r in body["results"]] == [r["text"] for r in reference]
    bare = http.post(path, json={"model": "ce", "query": QUERY, "documents": DOCS,
                                 "return_documents": False}).json()
    assert len(bare["results"]) == len(DOCS) and "document" not in bare["results"][0]


def test_tei_rerank_shape(http, cross_encoder):
    reference = CrossEncoder(cross_encoder, device="cpu")
    body = http.post("/rerank", json={"model": "ce", "query": QUERY, "texts": DOCS, "raw_scores": True,
                                      "return_text": True}).json()
    raw = reference.predict([(QUERY, d) for d in DOCS], activation_fn=torch.nn.Identity())
    assert [r["index"] for r in body] == list(np.argsort(-raw, kind="stable"))
    np.testing.assert_allclose([r["score"] for r in body], np.sort(raw)[::-1], rtol=1e-4)
    assert body[0]["text"] == DOCS[body[0]["index"]]


def test_classify_route(http):
    body = http.post("/classify", json={"model": "clf", "input": TEXTS[:3]}).json()
    assert [d["num_classes"] for d in body["data"]] == [3, 3, 3]
    for item in body["data"]:
        assert item["label"] == ("negative", "neutral", "positive")[int(np.argmax(item["probs"]))]
        assert abs(sum(item["probs"]) - 1) < 1e-5


def test_token_embed_through_float_base64_and_bytes(http, bert_mean):
    model, tokenizer = AutoModel.from_pretrained(bert_mean).eval(), AutoTokenizer.from_pretrained(bert_mean)
    with torch.no_grad():
        reference = [model(**tokenizer(t, return_tensors="pt")).last_hidden_state[0].numpy() for t in TEXTS[:3]]
    request = {"model": "emb", "input": TEXTS[:3], "task": "token_embed", "use_activation": False}
    floats = http.post("/pooling", json=request).json()["data"]
    for item, want in zip(floats, reference):
        np.testing.assert_allclose(np.array(item["data"]), want, atol=2e-5)
    encoded = http.post("/pooling", json={**request, "encoding_format": "base64", "endianness": "little"}).json()
    for item, want in zip(encoded["data"], reference):
        got = np.frombuffer(base64.b64decode(item["data"]), "<f4").reshape(want.shape)
        np.testing.assert_allclose(got, want, atol=2e-5)
    raw = http.post("/pooling", json={**request, "encoding_format": "bytes", "embed_dtype": "float16",
                                      "endianness": "big"})
    meta = json.loads(raw.headers["metadata"])
    for item, want in zip(meta["data"], reference):
        assert item["shape"] == list(want.shape) and item["embed_dtype"] == "float16"
        got = np.frombuffer(raw.content[item["start"]:item["end"]], ">f2").reshape(item["shape"])
        np.testing.assert_allclose(got, want, atol=5e-3, rtol=2e-3)


def test_tokenize_and_detokenize_routes(http, classifier):
    tokenizer = AutoTokenizer.from_pretrained(classifier)
    body = http.post("/tokenize", json={"model": "clf", "prompt": TEXTS[0], "return_token_strs": True}).json()
    ids = tokenizer(TEXTS[0])["input_ids"]
    assert body["tokens"] == ids and body["count"] == len(ids) and body["max_model_len"] == 128
    assert body["token_strs"] == tokenizer.convert_ids_to_tokens(ids)
    tei = http.post("/tokenize", json={"model": "clf", "inputs": TEXTS[:2]}).json()
    assert [[t["id"] for t in row] for row in tei] == tokenizer(TEXTS[:2])["input_ids"]
    assert tei[0][0]["special"] and tei[0][1]["start"] == 0
    assert http.post("/detokenize", json={"model": "clf", "tokens": ids}).json() == {"prompt": tokenizer.decode(ids)}
    assert http.post("/decode", json={"model": "clf", "ids": ids}).json() == \
        [tokenizer.decode(ids, skip_special_tokens=True)]


def test_unsupported_task_is_a_clear_400(http):
    answer = http.post("/classify", json={"model": "emb", "input": "hello"})
    assert answer.status_code == 400
    error = answer.json()["error"]
    # vLLM's words first (its clients match on them), then what the model does support
    assert error["param"] == "task" and error["message"].startswith("Unsupported task: 'classify'. Model 'emb'")
    assert "['embed', 'score', 'token_embed', 'tokenize', 'detokenize']" in error["message"]
    answer = http.post("/v1/embeddings", json={"model": "ce", "input": "hello"})
    assert answer.status_code == 400 and "supports ['score', 'classify'" in answer.json()["error"]["message"]
    answer = http.post("/rerank", json={"model": "ce", "query": QUERY, "documents": []})
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "documents"
    answer = http.post("/rerank", json={"model": "ce", "query": QUERY, "documents": DOCS, "top_k": 2})
    assert answer.status_code == 400 and "did you mean `top_n`?" in answer.json()["error"]["message"]
    answer = http.post("/score", json={"model": "ce", "text_1": QUERY, "text_2": DOCS, "normalise": True})
    assert answer.status_code == 400 and "`normalise` is not a request field" in answer.json()["error"]["message"]
    assert "text_1" in answer.json()["error"]["message"]  # the route's own fields, not the embeddings body's


def test_openai_client_unchanged_on_embeddings(http, redis_url):
    client = openai.OpenAI(base_url=f"{str(http.base_url).rstrip('/')}/v1", api_key="unused")
    answer = client.embeddings.create(model="emb", input=TEXTS[:3])
    with Producer(redis_url) as producer:
        expected = producer.embed(TEXTS[:3], "emb")
    np.testing.assert_allclose([d.embedding for d in answer.data], expected, atol=1e-6)
