"""SPLADE end to end on a tiny random BertForMaskedLM saved as a sentence-transformers SparseEncoder
(tests/sparsemodels.py): a live fleet (BatchWorker thread, real uvicorn gateway, real Redis), compared with
SparseEncoder.encode on the same folder, through the Python client, TEI's /embed_sparse and the bulk tool."""

from __future__ import annotations

import json

import httpx
import numpy as np
import pyarrow.parquet as pq
import pytest

from tests.commands import clean_env, embedfleet
from tests.harness import Fleet
from tests.sparsemodels import save_tiny_splade
from tests.tinymodels import sample_texts
from embedfleet.worker.engine.engine import Engine
from embedfleet.worker.engine.models.loader import load_model

TEXTS = sample_texts(7, seed=11, max_words=25)


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, str]:
    return {"splade": save_tiny_splade(str(tmp_path_factory.mktemp("splade"))),
            "splade-sum": save_tiny_splade(str(tmp_path_factory.mktemp("splade_sum")), seed=1, strategy="sum")}


@pytest.fixture(scope="module")
def splade_fleet(folders, redis_server):
    """A worker per folder, the gateway, and a Producer."""
    with Fleet(redis_server.url, flush=True) as fleet:
        for name, folder in folders.items():
            fleet.serve(Engine(load_model(folder, served_name=name)))
        with httpx.Client(base_url=fleet.gateway().url, timeout=60) as http:
            yield fleet.producer, http


def reference(folder: str, texts=TEXTS, **options) -> np.ndarray:
    from sentence_transformers import SparseEncoder

    encoded = SparseEncoder(folder, device="cpu").encode(texts, convert_to_tensor=True, **options)
    return encoded.to_dense().numpy()


def dense(vectors, width: int) -> np.ndarray:
    out = np.zeros((len(vectors), width), np.float32)
    for row, (indices, values) in enumerate(vectors):
        out[row, indices] = values
    return out


@pytest.mark.parametrize("name", ["splade", "splade-sum"])
def test_sparse_embed_equals_sparse_encoder(splade_fleet, folders, name):
    producer, _ = splade_fleet
    caps = producer.models()[name]
    assert caps.tasks == ("sparse_embed", "tokenize", "detokenize") and caps.outputs == ("sparse",)
    want = reference(folders[name])
    vectors = producer.sparse_embed(TEXTS, name)
    np.testing.assert_allclose(dense(vectors, want.shape[1]), want, atol=1e-5, rtol=1e-5)
    for vector, row in zip(vectors, want):  # the same non-zero entries, ids ascending
        assert list(vector.indices) == list(np.flatnonzero(row))


def test_top_k_equals_max_active_dims_and_threshold(splade_fleet, folders):
    producer, _ = splade_fleet
    want = reference(folders["splade"], max_active_dims=8)
    vectors = producer.sparse_embed(TEXTS, "splade", sparse_top_k=8)
    assert all(len(v.indices) == 8 for v in vectors)
    np.testing.assert_allclose(dense(vectors, want.shape[1]), want, atol=1e-5)
    full = producer.sparse_embed(TEXTS, "splade")
    cutoff = float(np.quantile(np.concatenate([v.values for v in full]), 0.9))
    for whole, cut in zip(full, producer.sparse_embed(TEXTS, "splade", sparse_threshold=cutoff)):
        assert cut.to_dict() == {k: v for k, v in whole.to_dict().items() if v > cutoff}


def test_tei_embed_sparse(splade_fleet, folders):
    _, http = splade_fleet
    want = reference(folders["splade"], TEXTS[:3])
    answer = http.post("/embed_sparse", json={"inputs": TEXTS[:3], "model": "splade"})
    assert answer.status_code == 200, answer.text
    assert int(answer.headers["x-compute-tokens"]) > 0
    for items, row in zip(answer.json(), want):
        assert [i["index"] for i in items] == list(np.flatnonzero(row))
        np.testing.assert_allclose([i["value"] for i in items], row[row > 0], atol=1e-5)
    assert http.get("/info", params={"model": "splade"}).json()["model_type"] == {"embedding": {"pooling": "splade"}}
    one = http.post("/embed_sparse", json={"inputs": TEXTS[0], "model": "splade", "sparse_top_k": 4}).json()
    assert len(one) == 1 and len(one[0]) == 4


def test_what_splade_does_not_serve_is_a_clear_400(splade_fleet):
    _, http = splade_fleet
    answer = http.post("/v1/embeddings", json={"model": "splade", "input": "hello"})
    assert answer.status_code == 400 and "Unsupported task: 'embed'" in answer.json()["error"]["message"]
    assert "sparse_embed" in answer.json()["error"]["message"]
    answer = http.post("/embed_sparse", json={"inputs": "hello", "model": "splade", "sparse_threshold": -1})
    assert answer.status_code in (400, 422) and "sparse_threshold" in answer.text


def test_bulk_tool_writes_sparse_parquet_and_jsonl(splade_fleet, folders, redis_server, tmp_path):
    source = tmp_path / "in.txt"
    source.write_text("\n".join(TEXTS) + "\n")
    want = reference(folders["splade"])
    env = clean_env(tmp_path / "cache", EMBEDFLEET_REDIS_URL=redis_server.url)
    for out in (tmp_path / "out.parquet", tmp_path / "out.jsonl"):
        done = embedfleet("embed", str(source), str(out), "--model", "splade", "--sparse", "--chunk", "3", env=env)
        assert done.returncode == 0, done.stderr
    table = pq.read_table(tmp_path / "out.parquet").to_pylist()
    lines = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    for rows in (table, lines):
        assert [r["id"] for r in rows] == list(range(len(TEXTS)))
        got = dense([(r["token_ids"], r["weights"]) for r in rows], want.shape[1])
        np.testing.assert_allclose(got, want, atol=1e-5)
    refused = embedfleet("embed", str(source), str(tmp_path / "out.npy"), "--sparse", env=env)
    assert refused.returncode != 0 and "not as one .npy array" in refused.stderr
