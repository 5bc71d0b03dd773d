"""Cohere's /v2/embed and SageMaker's /invocations end to end, with the real `cohere` client (ClientV2.embed and
.rerank) against a real gateway, BatchWorker threads and Redis: vectors against sentence-transformers, every
embedding type against its quantize_embeddings, vLLM's Cohere assertions (tests/entrypoints/pooling/embed/
test_cohere_online.py) re-expressed, and /invocations against the routes it stands for."""

from __future__ import annotations

import base64
import json

import cohere
import numpy as np
import pytest
from sentence_transformers import CrossEncoder
from sentence_transformers.util.quantization import quantize_embeddings
from transformers import AutoTokenizer

from tests.livegateway import live_fleet
from tests.taskengines import DOCS, QUERY
from tests.tinymodels import save_tiny_bert, sample_texts, st_reference, wrap_sentence_transformers
from embedfleet.worker.engine.engine import Engine
from embedfleet.worker.engine.models.loader import load_model

PROMPTS = {"search_query": "query: ", "search_document": "passage: "}
TEMPLATE = "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} {% endfor %}"
TEXTS = sample_texts(4, seed=7)
LONG = " ".join([f"alpha{i}" for i in range(80)] + [f"omega{i}" for i in range(80)])


@pytest.fixture(scope="module")
def folders(tmp_path_factory, minilm_path, cross_encoder) -> dict[str, str]:
    """"cohere-tiny": Matryoshka [8, 16, 32], Normalize, Cohere's input types as its prompts, a chat template."""
    folder = save_tiny_bert(str(tmp_path_factory.mktemp("cohere_tiny")), matryoshka_dimensions=[8, 16, 32])
    wrap_sentence_transformers(folder, "mean", normalize=True, prompts=PROMPTS)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.chat_template = TEMPLATE
    tokenizer.save_pretrained(folder)
    return {"cohere-tiny": folder, "minilm": minilm_path, "ce": cross_encoder}


@pytest.fixture(scope="module")
def http(folders, redis_server):
    engines = {name: Engine(load_model(folder, served_name=name), max_batch_tokens=2048)
               for name, folder in folders.items()}
    with live_fleet(redis_server.url, engines) as client:
        yield client


@pytest.fixture(scope="module")
def co(http):
    client = cohere.ClientV2(base_url=str(http.base_url).rstrip("/"), api_key="unused")
    yield client


TYPES = ["float", "int8", "uint8", "binary", "ubinary", "base64"]


def test_cohere_client_every_embedding_type(co, http, folders):
    answer = co.embed(model="cohere-tiny", texts=TEXTS, input_type="search_query", embedding_types=TYPES)
    floats = np.array(answer.embeddings.float_, dtype=np.float32)
    reference = st_reference(folders["cohere-tiny"]).encode(TEXTS, prompt_name="search_query")
    np.testing.assert_allclose(floats, reference, atol=1e-5)
    for precision in ("int8", "uint8", "binary", "ubinary"):  # the same codes as ST's for these floats
        np.testing.assert_array_equal(getattr(answer.embeddings, precision),
                                      quantize_embeddings(floats, precision=precision))
    decoded = [np.frombuffer(base64.b64decode(b), "<f4") for b in answer.embeddings.base64]
    np.testing.assert_array_equal(decoded, floats)
    assert answer.texts == TEXTS and answer.response_type == "embeddings_by_type"
    assert answer.meta.api_version.version == "2" and answer.meta.billed_units.input_tokens > 0
    # each type equals the fleet's own embed_dtype for the same request (one request answered them all)
    for dtype in ("int8", "binary"):
        pooled = http.post("/pooling", json={"model": "cohere-tiny", "input": TEXTS, "prompt_name": "search_query",
                                             "embed_dtype": dtype, "encoding_format": "base64"}).json()
        for row, item in zip(getattr(answer.embeddings, dtype), pooled["data"]):
            assert np.frombuffer(base64.b64decode(item["data"]), np.int8).tolist() == row


def test_input_types_output_dimension_and_inputs(co, http, folders):
    st = st_reference(folders["cohere-tiny"])
    documents = co.embed(model="cohere-tiny", texts=TEXTS[:2], input_type="search_document", output_dimension=16,
                         embedding_types=["float"])
    expected = st.encode(TEXTS[:2], prompt_name="search_document", truncate_dim=16)
    expected /= np.linalg.norm(expected, axis=1, keepdims=True)
    np.testing.assert_allclose(documents.embeddings.float_, expected, atol=1e-5)
    # Cohere's `inputs`: one user message per input, rendered with the model's chat template (as vLLM)
    body = {"model": "cohere-tiny", "input_type": "search_query", "embedding_types": ["float"],
            "inputs": [{"content": [{"type": "text", "text": TEXTS[0]}]}]}
    answer = http.post("/v2/embed", json=body).json()
    rendered = AutoTokenizer.from_pretrained(folders["cohere-tiny"]).apply_chat_template(
        [{"role": "user", "content": "query: " + TEXTS[0]}], tokenize=False)
    chat = http.post("/v1/embeddings", json={"model": "cohere-tiny", "input": rendered, "prompt": "",
                                             "add_special_tokens": False}).json()
    np.testing.assert_allclose(answer["embeddings"]["float"][0], chat["data"][0]["embedding"], atol=1e-6)
    assert "texts" not in answer


def test_v1_v2_parity_and_vllm_shape(http):
    v2 = http.post("/v2/embed", json={"model": "minilm", "texts": ["hello world"]}).json()
    v1 = http.post("/v1/embeddings", json={"model": "minilm", "input": ["hello world"]}).json()
    np.testing.assert_allclose(v2["embeddings"]["float"][0], v1["data"][0]["embedding"], atol=1e-6)
    assert v2["texts"] == ["hello world"] and v2["meta"]["tokens"]["input_tokens"] == v1["usage"]["prompt_tokens"]
    assert list(v2["embeddings"]) == ["float"]  # the default type, and only the types asked for


def test_truncation(http):
    def embed(**fields):
        return http.post("/v2/embed", json={"model": "minilm", "texts": [LONG], **fields})

    end, start = embed(truncate="END").json(), embed(truncate="START").json()
    cos = np.dot(end["embeddings"]["float"][0], start["embeddings"]["float"][0])
    assert cos < 0.99  # different halves kept
    refused = embed(truncate="NONE", max_tokens=10)
    assert refused.status_code == 400 and "more than max_tokens=10" in refused.json()["message"]
    too_long = embed(truncate="NONE")  # more than MiniLM's 256 tokens, and nothing may be cut
    assert too_long.status_code == 400 and "more than the maximum 256" in too_long.json()["message"]
    assert http.post("/v2/embed", json={"model": "minilm", "texts": ["short"], "truncate": "NONE"}).status_code == 200
    cut = embed(truncate="START", max_tokens=20).json()
    same = http.post("/v1/embeddings", json={"model": "minilm", "input": [LONG], "truncate_prompt_tokens": 20,
                                             "truncation_side": "left"}).json()
    np.testing.assert_allclose(cut["embeddings"]["float"][0], same["data"][0]["embedding"], atol=1e-6)
    assert cut["meta"]["billed_units"]["input_tokens"] == 20
    inputs = http.post("/v2/embed", json={"model": "cohere-tiny", "truncate": "NONE", "max_tokens": 5,
                                          "inputs": [{"content": [{"type": "text", "text": TEXTS[0]}]}]})
    assert inputs.status_code == 400 and "more than max_tokens=5" in inputs.json()["message"]


@pytest.mark.parametrize(("body", "words"), [
    ({"model": "minilm"}, "send exactly one of `texts` or `inputs`"),
    ({"model": "minilm", "texts": ["x"], "input_type": "search_query"},
     "Unsupported input_type 'search_query'. This model does not define any input_type"),
    ({"model": "cohere-tiny", "texts": ["x"], "input_type": "classification"},
     "Unsupported input_type 'classification'. Supported values: "),
    ({"model": "minilm", "images": ["data:image/png;base64,AAAA"]}, "`images` cannot be embedded"),
    ({"model": "minilm", "texts": ["x"], "embedding_types": ["int4"]}, "embedding_types"),
    ({"model": "cohere-tiny", "texts": ["x"], "output_dimension": 12}, "allowed are [8, 16, 32]"),
    ({"model": "minilm", "texts": ["x"], "max_tokens": 100000}, "`max_tokens`=100000 exceeds the max length 256"),
    ({"model": "minilm", "inputs": [{"content": [{"type": "text", "text": "x"}]}]}, "chat template"),
    ({"model": "minilm", "texts": ["ok", "\ud800"]}, "`texts` must be valid Unicode text, found a lone surrogate"),
])
def test_errors_in_cohere_and_vllm_shape(http, body, words):
    # json.dumps escapes a lone surrogate as JSON's "\ud800" (httpx's own encoder cannot)
    answer = http.post("/v2/embed", content=json.dumps(body), headers={"content-type": "application/json"})
    assert answer.status_code == 400, answer.text
    error = answer.json()
    assert words in error["message"] and error["id"]  # Cohere's body
    if body.get("input_type") == "classification":
        assert "search_document, search_query" in error["message"]  # the model's prompts, sorted
    assert error["error"]["message"] == error["message"] and error["error"]["code"] == 400  # vLLM's beside it


def test_cohere_client_raises_bad_request(co):
    with pytest.raises(cohere.BadRequestError) as caught:
        co.embed(model="minilm", texts=["x"], input_type="search_document", embedding_types=["float"])
    assert "Unsupported input_type 'search_document'" in caught.value.body["message"]
    plain = co.embed(model="minilm", texts=["x"], input_type=None, embedding_types=["float"])  # how to omit it
    assert len(plain.embeddings.float_[0]) == 384


def test_cohere_client_rerank(co, cross_encoder):
    answer = co.rerank(model="ce", query=QUERY, documents=DOCS, top_n=3)
    reference = CrossEncoder(cross_encoder, device="cpu").rank(QUERY, DOCS, top_k=3)
    assert [r.index for r in answer.results] == [r["corpus_id"] for r in reference]
    np.testing.assert_allclose([r.relevance_score for r in answer.results], [r["score"] for r in reference],
                               rtol=1e-5)


def test_invocations_route_by_body(http):
    def both(path, body):
        via = http.post("/invocations", json=body)
        direct = http.post(path, json=body)
        assert via.status_code == direct.status_code == 200, via.text
        return via.json(), direct.json()

    via, direct = both("/v1/embeddings", {"model": "minilm", "input": TEXTS[:2]})
    assert via["data"][0]["object"] == "embedding"
    np.testing.assert_allclose(via["data"][1]["embedding"], direct["data"][1]["embedding"], atol=1e-6)
    via, direct = both("/v1/embeddings", {"model": "cohere-tiny", "messages": [{"role": "user", "content": "hi"}]})
    np.testing.assert_allclose(via["data"][0]["embedding"], direct["data"][0]["embedding"], atol=1e-6)
    via, direct = both("/pooling", {"model": "minilm", "input": "x", "task": "token_embed"})
    assert via["data"][0]["object"] == "pooling" and np.array(via["data"][0]["data"]).ndim == 2
    via, direct = both("/rerank", {"model": "ce", "query": QUERY, "documents": DOCS})
    assert [r["index"] for r in via["results"]] == [r["index"] for r in direct["results"]]
    via, direct = both("/score", {"model": "ce", "text_1": QUERY, "text_2": DOCS[:2]})
    assert [d["score"] for d in via["data"]] == [d["score"] for d in direct["data"]]
    # a cross-encoder serves no embeddings: `input` is vLLM's classification request for it
    via, direct = both("/classify", {"model": "ce", "input": DOCS[:2]})
    assert via["data"][0]["num_classes"] == 1 and via["data"] == direct["data"]
    unfit = http.post("/invocations", json={"model": "minilm", "query": QUERY})
    assert unfit.status_code == 400
    message = unfit.json()["error"]["message"]
    assert "Cannot find suitable handler for request. Expected one of: ['EmbeddingRequest'," in message
    assert "ClassificationRequest" not in message  # MiniLM does not classify
    not_an_object = http.post("/invocations", json=[1, 2])
    assert not_an_object.status_code == 400 and "Cannot find suitable handler" in not_an_object.text
    assert http.get("/ping").status_code == 200 and http.post("/ping").status_code == 200
