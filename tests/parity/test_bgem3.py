"""bge-m3 end to end on a tiny random folder (tests/sparsemodels.py): a live fleet (BatchWorker thread with the vector
cache and metrics, a real uvicorn gateway, real Redis), compared with FlagEmbedding's BGEM3FlagModel on the same
folder: dense, lexical weights and ColBERT vectors of one request, from one forward pass."""

from __future__ import annotations

import asyncio
import base64
import math

import httpx
import msgpack
import numpy as np
import pytest
import redis

from embedfleet.common.protocol.keys import result_key
from embedfleet.common.request import EmbedRequest
from embedfleet import AsyncProducer
from tests.commands import wait_for
from tests.harness import Fleet
from tests.sparsemodels import M3_COLBERT_DIM, save_tiny_m3
from tests.tinymodels import cosines, sample_texts
from embedfleet.worker.engine.engine import Engine
from embedfleet.worker.engine.identity import folder_digest, model_identity
from embedfleet.worker.engine.models.loader import load_model
from embedfleet.worker.serving.cache import VectorCache
from embedfleet.worker.serving.inflight import request_digest
from embedfleet.worker.serving.metrics import WorkerMetrics

TEXTS = sample_texts(6, seed=7, max_words=20)
ALL = ("dense", "sparse", "colbert")


@pytest.fixture(scope="module")
def m3(tmp_path_factory) -> str:
    return save_tiny_m3(str(tmp_path_factory.mktemp("bge_m3")))


@pytest.fixture(scope="module")
def reference(m3):
    from FlagEmbedding import BGEM3FlagModel

    model = BGEM3FlagModel(m3, use_fp16=False, devices="cpu", colbert_dim=M3_COLBERT_DIM)
    return model, model.encode(TEXTS, return_dense=True, return_sparse=True, return_colbert_vecs=True)


@pytest.fixture(scope="module")
def m3_fleet(m3, redis_server):
    """One worker serving the folder as "m3" (cache on, metrics kept), the gateway, and a Producer."""
    with Fleet(redis_server.url, flush=True) as fleet:
        engine = Engine(load_model(m3, served_name="m3"), max_batch_tokens=4096, max_batch_size=64)
        cache = VectorCache(fleet.redis, model_identity("m3", folder_digest(m3), "float32", "cpu"),
                            engine.caps.embedding_size)
        worker = fleet.serve(engine, cache=cache, metrics=WorkerMetrics("m3"))
        with httpx.Client(base_url=fleet.gateway().url, timeout=60) as http:
            yield fleet.producer, http, worker


def _passes(worker) -> float:
    return worker.metrics.registry.get_sample_value("embedfleet_worker_batches_total", {"model": "m3"}) or 0.0


def assert_matches_flagembedding(result, expected, texts=TEXTS):
    """The Must-show tolerances: dense cosine >= 0.99999, lexical weights equal to 1e-5 on the same ids, ColBERT
    cosine >= 0.9999 per token."""
    assert result.dense.shape == expected["dense_vecs"].shape
    assert cosines(result.dense, expected["dense_vecs"]).min() >= 0.99999
    for got, want in zip(result.sparse, expected["lexical_weights"]):
        assert sorted(got.to_dict()) == sorted(int(k) for k in want)
        np.testing.assert_allclose([got.to_dict()[int(k)] for k in want], list(want.values()), atol=1e-5)
    for got, want in zip(result.colbert, expected["colbert_vecs"]):
        assert got.shape == want.shape
        assert cosines(got, want).min() >= 0.9999
    assert len(result.sparse) == len(result.colbert) == len(texts)


def test_advertised_tasks_and_outputs(m3_fleet):
    producer, _, _ = m3_fleet
    caps = producer.models()["m3"]
    assert caps.outputs == ALL and caps.token_size == M3_COLBERT_DIM
    assert {"embed", "sparse_embed", "token_embed", "token_classify", "score"} <= set(caps.tasks)


def test_three_outputs_equal_flagembedding_from_one_forward_pass(m3_fleet, reference):
    producer, _, worker = m3_fleet
    before = _passes(worker)
    result = producer.encode(TEXTS, "m3", outputs=ALL, cache=False)
    assert _passes(worker) - before == 1  # the six texts fit one batch: one encoder pass gave all three
    assert_matches_flagembedding(result, reference[1])
    assert result.vocab_size == producer.models()["m3"].vocab_size
    assert result.usage.prompt_tokens > 0


def test_each_output_alone_and_the_vllm_tasks(m3_fleet, reference):
    producer, _, _ = m3_fleet
    expected = reference[1]
    np.testing.assert_allclose(producer.embed(TEXTS, "m3"), expected["dense_vecs"], atol=1e-5)  # dense unchanged
    for got, want in zip(producer.sparse_embed(TEXTS, "m3"), expected["lexical_weights"]):
        np.testing.assert_allclose([got.to_dict()[int(k)] for k in want], list(want.values()), atol=1e-5)
    for got, want in zip(producer.token_embed(TEXTS, "m3"), expected["colbert_vecs"]):
        assert cosines(got, want).min() >= 0.9999
    only = producer.encode(TEXTS[:2], "m3", outputs=["sparse", "colbert"])
    assert [s.name for s in only.sections] == ["sparse_ids", "sparse_weights", "colbert"]
    with pytest.raises(ValueError, match="no dense vectors"):
        only.dense  # noqa: B018 - the property raises


def test_blob_decodes_with_numpy_and_msgpack_only(m3_fleet, reference):
    producer, _, _ = m3_fleet
    request_id = producer.submit(TEXTS, "m3", outputs=list(ALL), embed_dtype="float16", endianness="big")
    producer.wait(request_id)
    raw = redis.Redis.from_url(producer.url_for_submit("m3")).get(result_key(request_id))
    assert raw[:3] == b"EFR" and raw[3] == 2
    size = int.from_bytes(raw[4:8], "big")
    header = msgpack.unpackb(raw[8:8 + size])
    data, start, arrays = raw[8 + size:], 0, {}
    for section in header["sections"]:
        count = math.prod(section["shape"])
        arrays[section["name"]] = (np.frombuffer(data, section["dtype"], count, start).reshape(section["shape"]),
                                   section.get("parts"))
        start += count * np.dtype(section["dtype"]).itemsize
    assert start == len(data) and header["vocab_size"] > 0
    expected = reference[1]
    dense, _ = arrays["dense"]
    assert dense.dtype == np.dtype(">f2") and cosines(dense, expected["dense_vecs"]).min() >= 0.9999
    ids, parts = arrays["sparse_ids"]
    weights, _ = arrays["sparse_weights"]
    ends = np.cumsum(parts)
    for end, count, want in zip(ends, parts, expected["lexical_weights"]):
        assert dict(zip(ids[end - count:end].tolist(), weights[end - count:end].tolist())) == \
            pytest.approx({int(k): float(v) for k, v in want.items()}, abs=1e-5)
    colbert, parts = arrays["colbert"]
    assert parts == [len(v) for v in expected["colbert_vecs"]]


def test_sparse_top_k_and_threshold(m3_fleet):
    producer, _, _ = m3_fleet
    full = producer.sparse_embed(TEXTS, "m3")
    top = producer.sparse_embed(TEXTS, "m3", sparse_top_k=3)
    for whole, cut in zip(full, top):
        best = sorted(whole.to_dict().items(), key=lambda item: (-item[1], item[0]))[:3]
        assert cut.to_dict() == dict(best) and list(cut.indices) == sorted(cut.indices)
    cutoff = float(np.median(np.concatenate([v.values for v in full])))
    for whole, cut in zip(full, producer.sparse_embed(TEXTS, "m3", sparse_threshold=cutoff)):
        assert cut.to_dict() == {k: v for k, v in whole.to_dict().items() if v > cutoff}


def test_cache_and_inflight_key_on_the_outputs(m3_fleet, reference):
    producer, _, worker = m3_fleet
    text = [TEXTS[0]]
    cache = worker.steps.cache
    seen = (cache.written, cache.hits)
    dense = producer.embed(text, "m3")  # fills the vector cache with the dense vector of this text
    # found there, or written there (after the answer is published)
    wait_for(lambda: (cache.written, cache.hits) != seen, what="the dense vector in the cache")
    both = producer.encode(text, "m3", outputs=["dense", "sparse"])  # must not be answered from that entry
    np.testing.assert_allclose(both.dense, dense, atol=1e-6)
    assert both.sparse[0].to_dict() == pytest.approx({int(k): float(v) for k, v in
                                                     reference[1]["lexical_weights"][0].items()}, abs=1e-5)
    again = producer.encode(text, "m3", outputs=["dense", "sparse"])
    assert again.sparse[0].to_dict() == both.sparse[0].to_dict()
    digests = {request_digest("id", EmbedRequest(model="m3", inputs=text, params={"outputs": o}))
               for o in (["dense"], ["sparse"], ["dense", "sparse"], list(ALL))}
    assert len(digests) == 4


def test_async_client(m3_fleet, redis_server, reference):
    async def main():
        async with AsyncProducer(redis_server.url) as producer:
            return (await producer.sparse_embed(TEXTS, "m3"),
                    await producer.encode(TEXTS, "m3", outputs=ALL))

    sparse, result = asyncio.run(main())
    assert [v.to_dict() for v in sparse] == [v.to_dict() for v in result.sparse]
    assert_matches_flagembedding(result, reference[1])


def test_score_weights_equal_compute_score(m3_fleet, reference):
    producer, http, _ = m3_fleet
    model = reference[0]
    query, docs = TEXTS[0], TEXTS[1:4]
    for weights in ([1.0, 1.0, 1.0], [0.4, 0.2, 0.4]):
        expected = model.compute_score([(query, d) for d in docs], weights_for_different_modes=weights)
        got = producer.score(query, docs, "m3", score_weights=weights)
        np.testing.assert_allclose(got, expected["colbert+sparse+dense"], atol=1e-5)
        body = http.post("/score", json={"model": "m3", "text_1": query, "text_2": docs, "score_weights": weights})
        assert body.status_code == 200, body.text
        np.testing.assert_allclose([d["score"] for d in body.json()["data"]], expected["colbert+sparse+dense"],
                                   atol=1e-5)
    np.testing.assert_allclose(producer.score(query, docs, "m3"), expected["dense"], atol=1e-5)  # no weights: dense


def test_http_routes(m3_fleet, reference):
    _, http, _ = m3_fleet
    expected = reference[1]
    body = http.post("/v1/embeddings", json={"model": "m3", "input": TEXTS}).json()
    assert cosines([d["embedding"] for d in body["data"]], expected["dense_vecs"]).min() >= 0.99999
    same = http.post("/v1/embeddings", json={"model": "m3", "input": TEXTS, "outputs": ["dense"]}).json()
    assert [d["embedding"] for d in same["data"]] == [d["embedding"] for d in body["data"]]
    pooled = http.post("/pooling", json={"model": "m3", "input": TEXTS}).json()
    np.testing.assert_allclose([d["data"] for d in pooled["data"]], expected["dense_vecs"], atol=1e-5)
    lexical = http.post("/pooling", json={"model": "m3", "input": TEXTS[:2], "task": "token_classify"})
    assert lexical.status_code == 200, lexical.text
    model = reference[0]
    for item, text, want in zip(lexical.json()["data"], TEXTS, expected["lexical_weights"]):
        ids = model.tokenizer(text)["input_ids"][1:-1]  # vLLM's: BOS and EOS left out, one weight per token
        weights = np.asarray(item["data"], np.float32)
        assert weights.shape == (len(ids), 1)
        best = {}
        for token, weight in zip(ids, weights[:, 0]):
            if weight > 0 and token != model.tokenizer.unk_token_id:
                best[token] = max(best.get(token, 0.0), float(weight))
        assert best == pytest.approx({int(k): float(v) for k, v in want.items()}, abs=1e-5)
    tei = http.post("/embed_sparse", json={"model": "m3", "inputs": TEXTS[:2]})
    assert tei.status_code == 200, tei.text
    for items, want in zip(tei.json(), expected["lexical_weights"]):
        assert {i["index"]: i["value"] for i in items} == pytest.approx({int(k): float(v) for k, v in want.items()},
                                                                        abs=1e-5)
        assert [i["index"] for i in items] == sorted(i["index"] for i in items)


def test_bad_requests_are_clear_400s(m3_fleet):
    _, http, _ = m3_fleet
    answer = http.post("/embed_sparse", json={"model": "m3", "inputs": "x", "sparse_top_k": 0})
    assert answer.status_code in (400, 422) and "sparse_top_k" in answer.text
    answer = http.post("/pooling", json={"model": "m3", "input": "x", "task": "token_embed", "sparse_top_k": 3})
    assert answer.status_code == 400 and "sparse" in answer.json()["error"]["message"]
    answer = http.post("/score", json={"model": "m3", "text_1": "a", "text_2": ["b"], "score_weights": [1, -1, 0]})
    assert answer.status_code == 400 and "score_weights" in answer.json()["error"]["message"]


def test_outputs_checked_against_the_model(m3, m3_fleet):
    producer, _, _ = m3_fleet
    from embedfleet.common.errors import ValidationError

    with pytest.raises(ValidationError, match="`outputs`"):
        producer.submit(["x"], "m3", outputs=["dense", "dense"])
    with pytest.raises(ValidationError, match="applies to task 'embed' only"):
        producer.submit(["x"], "m3", task="token_embed", outputs=["colbert"])


def test_long_inputs_refused_for_sparse_and_colbert(m3):
    """--max-embed-len chunks long inputs for dense vectors; sparse and ColBERT outputs refuse them clearly."""
    engine = Engine(load_model(m3, served_name="m3", max_embed_len=200))
    long_text = " ".join(["the quick brown fox jumps over the lazy dog"] * 6)
    dense, sparse, mixed, cut = engine.run([
        EmbedRequest(model="m3", inputs=[long_text]),
        EmbedRequest(model="m3", inputs=["short", long_text], params={"task": "sparse_embed"}),
        EmbedRequest(model="m3", inputs=[long_text], params={"outputs": ["dense", "colbert"]}),
        EmbedRequest(model="m3", inputs=[long_text], params={"task": "sparse_embed", "truncate_prompt_tokens": -1}),
    ])
    assert dense.ok and dense.embeddings.shape == (1, engine.caps.embedding_size)
    for refused in (sparse, mixed):
        assert refused.error_code == "input_too_long" and "not for sparse or ColBERT" in refused.error_message
    assert cut.ok and len(cut.sparse) == 1




def test_pooling_outputs_and_sparse_embed(m3_fleet, reference):
    """/pooling with `outputs`: one object per input, a key per output; `task: sparse_embed`: {indices, values}."""
    _, http, worker = m3_fleet
    expected = reference[1]
    before = _passes(worker)
    body = http.post("/pooling", json={"model": "m3", "input": TEXTS, "outputs": list(ALL), "cache": False})
    assert body.status_code == 200, body.text
    assert _passes(worker) - before == 1
    data = body.json()["data"]
    assert cosines([d["data"]["dense"] for d in data], expected["dense_vecs"]).min() >= 0.99999
    for item, want_sparse, want_colbert in zip(data, expected["lexical_weights"], expected["colbert_vecs"]):
        sparse = dict(zip(item["data"]["sparse"]["indices"], item["data"]["sparse"]["values"]))
        assert sparse == pytest.approx({int(k): float(v) for k, v in want_sparse.items()}, abs=1e-5)
        assert cosines(item["data"]["colbert"], want_colbert).min() >= 0.9999
    encoded = http.post("/pooling", json={"model": "m3", "input": TEXTS[:2], "outputs": ["dense", "colbert"],
                                          "encoding_format": "base64", "embed_dtype": "float16",
                                          "endianness": "little"}).json()["data"]
    for item, dense, colbert in zip(encoded, expected["dense_vecs"], expected["colbert_vecs"]):
        got = np.frombuffer(base64.b64decode(item["data"]["colbert"]), "<f2").reshape(colbert.shape)
        assert cosines(got, colbert).min() >= 0.999 and "sparse" not in item["data"]
        assert cosines([np.frombuffer(base64.b64decode(item["data"]["dense"]), "<f2")], [dense])[0] >= 0.999
    sparse = http.post("/pooling", json={"model": "m3", "input": TEXTS[:2], "task": "sparse_embed"}).json()["data"]
    for item, want in zip(sparse, expected["lexical_weights"]):
        assert dict(zip(item["data"]["indices"], item["data"]["values"])) == \
            pytest.approx({int(k): float(v) for k, v in want.items()}, abs=1e-5)
    refused = http.post("/v1/embeddings", json={"model": "m3", "input": "x", "outputs": ["dense", "sparse"]})
    assert refused.status_code == 400 and "/pooling" in refused.json()["error"]["message"]
    refused = http.post("/pooling", json={"model": "m3", "input": "x", "outputs": ["sparse"],
                                          "encoding_format": "bytes"})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "encoding_format"
    refused = http.post("/pooling", json={"model": "m3", "input": "x", "outputs": ["lexical"]})
    assert refused.status_code == 400 and "outputs" in refused.text


def test_rerank_with_weights(m3_fleet, reference):
    producer, http, _ = m3_fleet
    query, docs = TEXTS[0], TEXTS[1:5]
    expected = reference[0].compute_score([(query, d) for d in docs], weights_for_different_modes=[0.4, 0.2, 0.4])
    order = list(np.argsort(-np.asarray(expected["colbert+sparse+dense"]), kind="stable"))
    body = http.post("/rerank", json={"model": "m3", "query": query, "documents": docs,
                                      "score_weights": [0.4, 0.2, 0.4]}).json()
    assert [r["index"] for r in body["results"]] == order
    assert [r["index"] for r in producer.rerank(query, docs, "m3", score_weights=[0.4, 0.2, 0.4])] == order


def test_a_malformed_version_2_blob_is_a_decode_error(m3_fleet):
    from embedfleet.common.errors import DecodeError
    from embedfleet.common.result import Result

    producer, _, _ = m3_fleet
    good = producer.encode(TEXTS[:2], "m3", outputs=["sparse"])
    assert Result.decode(good.encode()).sparse[1].to_dict() == good.sparse[1].to_dict()
    for broken in (good.encode()[:-4],  # bytes missing
                   good.encode().replace(b"<i4", b"<f8", 1),  # a dtype no section may have
                   good.encode().replace(b"<i4", b"<u2", 1)):  # sizes that no longer add up
        with pytest.raises(DecodeError):
            Result.decode(broken)
