"""vLLM's own online pooling tests (tests/entrypoints/pooling/ in vllm-project/vllm: openai/test_embedding,
test_pooling, test_truncation, test_embedding_long_text, test_binary_encode_and_decode, test_rerank, test_score,
classify/test_online, scoring/test_cross_encoder_online), their assertions re-expressed against a live gateway:
a real uvicorn server, real BatchWorker threads, real Redis, the bundled all-MiniLM-L6-v2 (with vLLM's chunked
long-text processing on, max_embed_len 10000) and tiny random BERT cross-encoder / 3-label classifier.

vLLM's tests check a real reranker's scores by value (>= 0.9); a tiny random model has no such scores, so those
are checked against sentence-transformers' CrossEncoder on the same folder instead. Where we answer otherwise
than vLLM on purpose, the test says so (docs/vllm-parity.md lists it).
"""

from __future__ import annotations

import base64
import json
import random

import numpy as np
import openai
import pytest
import requests
import torch
import torch.nn.functional as F
from sentence_transformers import CrossEncoder, SentenceTransformer
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from tests.livegateway import live_gateway
from embedfleet.worker.engine.engine import Engine
from embedfleet.worker.engine.models.loader import load_model

MINILM, CE, CLF = "minilm", "ce", "clf"
MAX_LEN = 256  # all-MiniLM-L6-v2's max_seq_length; the tiny models' is 128
TEXTS = ["The cat sat on the mat.", "A feline was resting on a rug.", "Stars twinkle brightly in the night sky."]
QUERY = "What is the capital of France?"
DOCS = ["The capital of Brazil is Brasilia.", "The capital of France is Paris.", "Cross-encoder models are neat"]
INPUT_TEXT = "This product was excellent and exceeded my expectations"
CALCULUS = ("Immerse yourself in the enchanting chronicle of calculus, a mathematical domain that has radically "
            "transformed our comprehension of change and motion. Despite its roots in ancient civilizations, the "
            "formal birth of calculus predominantly occurred in the 17th century, primarily under the influential "
            "guidance of Sir Isaac Newton and Gottfried Wilhelm Leibniz. ") * 6


class Live:
    def __init__(self, url: str):
        self.url = url
        self.openai = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)

    def post(self, path: str, **body) -> requests.Response:
        return requests.post(f"{self.url}/{path.lstrip('/')}", json=body, timeout=60)


@pytest.fixture(scope="module")
def live(redis_server, minilm_path, cross_encoder, classifier):
    engines = [Engine(load_model(minilm_path, served_name=MINILM, max_embed_len=10_000), max_batch_tokens=8192),
               Engine(load_model(cross_encoder, served_name=CE), max_batch_tokens=2048),
               Engine(load_model(classifier, served_name=CLF), max_batch_tokens=2048)]
    with live_gateway(redis_server.url, engines) as url:
        yield Live(url)


@pytest.fixture(scope="module")
def st_minilm(minilm_path):
    return SentenceTransformer(minilm_path, device="cpu")


def tokens(folder: str, text: str, **kwargs) -> list[int]:
    return AutoTokenizer.from_pretrained(folder)(text, **kwargs)["input_ids"]


def cosine_close(a, b, tol: float) -> None:
    """vLLM's check_embeddings_close: every pair's cosine similarity within `tol` of 1."""
    for x, y in zip(a, b):
        x, y = (v.float() if isinstance(v, torch.Tensor) else torch.tensor(np.array(v, np.float32)) for v in (x, y))
        assert F.cosine_similarity(x, y, dim=0) >= 1 - tol


# -- openai/test_embedding ---------------------------------------------------------------------------------


def test_single_and_batch_embedding_with_the_openai_client(live, minilm_path, st_minilm):
    answer = live.openai.embeddings.create(model=MINILM, input=TEXTS[:1], encoding_format="float")
    assert answer.id is not None and len(answer.data) == 1 and len(answer.data[0].embedding) == 384
    assert answer.usage.prompt_tokens == answer.usage.total_tokens == len(tokens(minilm_path, TEXTS[0]))
    cosine_close([answer.data[0].embedding], st_minilm.encode(TEXTS[:1]), 1e-4)

    answer = live.openai.embeddings.create(model=MINILM, input=[1, 1, 1, 1, 1], encoding_format="float")
    assert len(answer.data) == 1 and answer.usage.prompt_tokens == answer.usage.total_tokens == 5

    answer = live.openai.embeddings.create(model=MINILM, input=TEXTS, encoding_format="float")
    assert len(answer.data) == 3 and answer.usage.prompt_tokens == sum(len(tokens(minilm_path, t)) for t in TEXTS)
    cosine_close([d.embedding for d in answer.data], st_minilm.encode(TEXTS), 1e-4)

    ids = [[4, 5, 7, 9, 20], [15, 29, 499], [24, 24, 24, 24, 24], [25, 32, 64, 77]]
    answer = live.openai.embeddings.create(model=MINILM, input=ids, encoding_format="float")
    assert len(answer.data) == 4 and answer.usage.prompt_tokens == answer.usage.total_tokens == 17


def test_base64_is_the_float_answer_and_the_openai_default(live):
    answer = live.openai.embeddings.create(model=MINILM, input=TEXTS, encoding_format="float")
    floats = [d.embedding for d in answer.data]
    encoded = live.openai.embeddings.create(model=MINILM, input=TEXTS, encoding_format="base64").data
    cosine_close(floats, [np.frombuffer(base64.b64decode(d.embedding), "float32") for d in encoded], 1e-6)
    default = live.openai.embeddings.create(model=MINILM, input=TEXTS).data  # the client asks base64 itself
    cosine_close(floats, [d.embedding for d in default], 1e-6)


TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
                "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}


@pytest.mark.parametrize("path", ["/v1/embeddings", "/pooling"])
def test_base64_embed_dtype_decodes_with_torch(live, path):
    key = "embedding" if path == "/v1/embeddings" else "data"
    floats = [d[key] for d in live.post(path, model=MINILM, input=TEXTS, encoding_format="float").json()["data"]]
    for embed_dtype, torch_dtype in TORCH_DTYPES.items():
        answer = live.post(path, model=MINILM, input=TEXTS, encoding_format="base64", embed_dtype=embed_dtype)
        decoded = [torch.frombuffer(bytearray(base64.b64decode(d[key])), dtype=torch_dtype).to(torch.float32)
                   for d in answer.json()["data"]]
        cosine_close(floats, decoded, 1e-2)


def test_unknown_embed_dtype_is_refused_in_vllms_words(live):
    for path in ("/v1/embeddings", "/pooling"):
        answer = live.post(path, model=MINILM, input=TEXTS, encoding_format="base64", embed_dtype="bad_embed_dtype")
        assert answer.status_code == 400
        assert answer.json()["error"]["message"].startswith("embed_dtype='bad_embed_dtype' is not supported.")
        assert "'float16'" in answer.json()["error"]["message"]  # and says what is


def test_truncation_and_normalize(live):
    text = "Como o Brasil pode fomentar o desenvolvimento de modelos de IA?"
    answer = live.openai.embeddings.create(model=MINILM, input=[text], extra_body={"truncate_prompt_tokens": 10})
    assert len(answer.data[0].embedding) == 384 and answer.usage.prompt_tokens == answer.usage.total_tokens == 10
    ids = [101] + list(range(2000, 2019)) + [102]
    answer = live.openai.embeddings.create(model=MINILM, input=ids, extra_body={"truncate_prompt_tokens": 10})
    assert answer.usage.prompt_tokens == 10
    with pytest.raises(openai.BadRequestError):
        live.openai.embeddings.create(model=MINILM, input=[text], extra_body={"truncate_prompt_tokens": 8193})

    def outputs(normalize):
        answer = live.post("/v1/embeddings", model=MINILM, input=TEXTS[:1], encoding_format="float",
                           normalize=normalize)
        return torch.tensor([d["embedding"] for d in answer.json()["data"]])

    default, on, off = outputs(None), outputs(True), outputs(False)
    assert torch.allclose(default, on, atol=1e-2) and not torch.allclose(on, off, atol=1e-2)
    assert torch.allclose(on, F.normalize(off, p=2, dim=-1), atol=1e-2)


# -- openai/test_truncation --------------------------------------------------------------------------------


def test_truncation_sizes(live):
    def usage(size):
        return live.openai.post("/embeddings", cast_to=object,
                                body={"model": MINILM, "input": CALCULUS, "truncate_prompt_tokens": size})

    assert usage(10)["usage"]["prompt_tokens"] == 10
    zero = usage(0)  # vLLM keeps 0 tokens and answers no rows
    assert zero["usage"]["prompt_tokens"] == 0 and zero["data"] == []
    assert usage(-1)["usage"]["prompt_tokens"] == MAX_LEN
    with pytest.raises(openai.BadRequestError) as caught:
        usage(MAX_LEN + 1)
    error = caught.value.response.json()["error"]
    assert caught.value.status_code == 400 and "Please request a smaller truncation size" in error["message"]
    # /v1/embeddings keeps OpenAI's error body (vLLM's says type BadRequestError there too)
    assert error["type"] == "invalid_request_error" and error["code"] == "invalid_request"


def test_zero_truncation_still_checks_the_model_and_the_task(live):
    assert live.post("/v1/embeddings", model="nope", input="x", truncate_prompt_tokens=0).status_code == 404
    refused = live.post("/classify", model=MINILM, input="x", truncate_prompt_tokens=0)
    assert refused.status_code == 400 and refused.json()["error"]["message"].startswith("Unsupported task: 'classify'")
    ranked = live.post("/rerank", model=CE, query=QUERY, documents=DOCS, truncate_prompt_tokens=0).json()
    assert ranked["results"] == [] and ranked["usage"]["prompt_tokens"] == 0


# -- openai/test_embedding_long_text (chunked processing on) -----------------------------------------------


def long_text(words: int, seed: int) -> str:
    rng = random.Random(seed)
    vocabulary = ("the and you they this create build develop design system application software network "
                  "database algorithm model framework platform interface protocol data information").split()
    return " ".join(rng.choice(vocabulary) + ("." if i % 15 == 14 else "") for i in range(words))


def test_long_texts_are_embedded_in_chunks(live):
    texts = [long_text(1500, 1), long_text(2500, 2), "This is a short text test."]
    answer = live.openai.embeddings.create(model=MINILM, input=texts, encoding_format="float")
    assert [d.index for d in answer.data] == [0, 1, 2] and all(len(d.embedding) == 384 for d in answer.data)
    assert answer.usage.prompt_tokens > 3000 and answer.usage.total_tokens == answer.usage.prompt_tokens
    assert all(0.8 < np.linalg.norm(d.embedding) < 1.2 for d in answer.data)


def test_too_long_input_says_reduce_the_length(live):
    answer = live.post("/pooling", model=MINILM, input="word " * 10_100)
    assert answer.status_code == 400 and "Please reduce the length of the input" in answer.text
    answer = live.post("/rerank", model=CE, query=QUERY * 100, documents=DOCS[:2])
    assert answer.status_code == 400 and "Please reduce the length of the input" in answer.text
    assert answer.json()["error"]["type"] == "BadRequestError" and answer.json()["error"]["code"] == 400


# -- openai/test_binary_encode_and_decode ------------------------------------------------------------------


def decode(raw: bytes, embed_dtype: str, endianness: str, shape) -> torch.Tensor:
    """vLLM's binary2tensor: the bytes as stored, in the named byte order, widened to float32."""
    order = ">" if endianness == "big" else "<"
    if embed_dtype in ("float32", "float16"):
        kind = "f4" if embed_dtype == "float32" else "f2"
        return torch.from_numpy(np.frombuffer(raw, order + kind).astype(np.float32).reshape(shape))
    kind = "i2" if embed_dtype == "bfloat16" else "u1"  # the bits, in native order, viewed as the float type
    bits = torch.from_numpy(np.frombuffer(raw, order + kind).astype(kind))
    return bits.view(TORCH_DTYPES[embed_dtype]).to(torch.float32).reshape(shape)


@pytest.mark.parametrize("endianness", ["native", "little", "big"])
def test_bytes_answers_decode_by_their_metadata(live, endianness):
    floats = torch.tensor([d["data"] for d in live.post("/pooling", model=MINILM, input=TEXTS,
                                                         encoding_format="float").json()["data"]])
    for embed_dtype in TORCH_DTYPES:
        answer = live.post("/pooling", model=MINILM, input=TEXTS, encoding_format="bytes", embed_dtype=embed_dtype,
                           endianness=endianness)
        meta = json.loads(answer.headers["metadata"])
        assert meta["usage"]["prompt_tokens"] > 0 and len(meta["data"]) == 3
        rows = [decode(answer.content[item["start"]:item["end"]], item["embed_dtype"], item["endianness"],
                       item["shape"]) for item in meta["data"]]
        if embed_dtype in ("float32", "float16", "bfloat16"):
            tolerance = {"float32": 1e-7, "float16": 1e-3, "bfloat16": 1e-2}[embed_dtype]
            torch.testing.assert_close(torch.stack(rows), floats, atol=tolerance, rtol=tolerance)
        cosine_close(floats, rows, 1e-2)


# -- openai/test_pooling -----------------------------------------------------------------------------------


def test_pooling_on_an_embedding_model(live, st_minilm):
    answer = live.post("/pooling", model=MINILM, input=TEXTS[:1], encoding_format="float").json()
    assert answer["id"] is not None and len(answer["data"]) == 1 and len(answer["data"][0]["data"]) == 384
    assert answer["usage"]["completion_tokens"] == 0 and answer["usage"]["prompt_tokens"] > 0
    cosine_close([answer["data"][0]["data"]], st_minilm.encode(TEXTS[:1]), 1e-4)
    answer = live.post("/pooling", model=MINILM, input=[[4, 5, 7, 9, 20], [15, 29, 499]], encoding_format="float")
    assert answer.json()["usage"]["prompt_tokens"] == answer.json()["usage"]["total_tokens"] == 8
    answer = live.post("/pooling", model=MINILM, input=TEXTS, encoding_format="float")
    floats = [d["data"] for d in answer.json()["data"]]
    encoded = live.post("/pooling", model=MINILM, input=TEXTS, encoding_format="base64").json()["data"]
    cosine_close(floats, [np.frombuffer(base64.b64decode(d["data"]), "float32") for d in encoded], 1e-6)
    for task in ("classify", "token_classify"):  # an embedding model has no classifier head
        answer = live.post("/pooling", model=MINILM, input=INPUT_TEXT, task=task)
        assert answer.status_code == 400 and answer.json()["error"]["type"] == "BadRequestError"
        assert answer.json()["error"]["message"].startswith(f"Unsupported task: {task!r}")


# -- test_rerank, scoring/test_cross_encoder_online ---------------------------------------------------------


def test_rerank_orders_as_cross_encoder_rank(live, cross_encoder):
    reference = CrossEncoder(cross_encoder, device="cpu").rank(QUERY, DOCS)
    for path in ("/rerank", "/v1/rerank", "/v2/rerank"):
        answer = live.post(path, model=CE, query=QUERY, documents=DOCS)
        answer.raise_for_status()
        body = answer.json()
        assert body["id"] is not None and len(body["results"]) == 3
        assert [r["index"] for r in body["results"]] == [r["corpus_id"] for r in reference]
        np.testing.assert_allclose([r["relevance_score"] for r in body["results"]],
                                   [r["score"] for r in reference], rtol=1e-4)
        # current vLLM's RerankResponse usage: clients typed on it require prompt_tokens
        assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] > 0
    top = live.post("/rerank", model=CE, query=QUERY, documents=DOCS, top_n=2).json()
    assert [r["index"] for r in top["results"]] == [r["corpus_id"] for r in reference[:2]]


@pytest.mark.parametrize("name", ["activation", "use_activation"])
@pytest.mark.parametrize("path", ["/rerank", "/score"])
def test_activation_and_its_legacy_name(live, name, path):
    def outputs(value):
        if path == "/rerank":
            body = live.post(path, model=CE, query=QUERY, documents=DOCS, **{name: value}).json()
            return torch.tensor([r["relevance_score"] for r in sorted(body["results"], key=lambda r: r["index"])])
        body = live.post(path, model=CE, text_1=QUERY, text_2=DOCS, **{name: value}).json()
        return torch.tensor([d["score"] for d in body["data"]])

    default, on, off = outputs(None), outputs(True), outputs(False)
    assert torch.allclose(default, on, atol=1e-2), "Default should use activation."
    assert not torch.allclose(on, off, atol=1e-2)
    assert torch.allclose(F.sigmoid(off), on, atol=1e-2)


def test_pooling_on_a_cross_encoder_defaults_to_token_classify(live, cross_encoder):
    """vLLM's /pooling without `task` on a cross-encoder: per-token scores, one per label (here 1)."""
    ids = tokens(cross_encoder, INPUT_TEXT)
    default = live.post("/pooling", model=CE, input=INPUT_TEXT, encoding_format="float").json()
    explicit = live.post("/pooling", model=CE, input=INPUT_TEXT, encoding_format="float", task="token_classify").json()
    assert len(default["data"]) == 1 and len(default["data"][0]["data"]) == len(ids)
    assert all(len(row) == 1 for row in default["data"][0]["data"])
    assert default["data"] == explicit["data"] and default["usage"]["prompt_tokens"] == len(ids)
    # what vLLM computes for a BERT sequence classifier: every token's last hidden state through the
    # classifier layer (no CLS pooler), then sigmoid for one label
    module = AutoModelForSequenceClassification.from_pretrained(cross_encoder).eval()
    with torch.no_grad():
        hidden = module.bert(input_ids=torch.tensor([ids])).last_hidden_state
        expected = torch.sigmoid(module.classifier(hidden))[0]
    torch.testing.assert_close(torch.tensor(default["data"][0]["data"]), expected, atol=1e-5, rtol=1e-4)
    raw = live.post("/pooling", model=CE, input=INPUT_TEXT, task="token_classify", use_activation=False).json()
    torch.testing.assert_close(torch.sigmoid(torch.tensor(raw["data"][0]["data"])), expected, atol=1e-5, rtol=1e-4)
    classify = live.post("/pooling", model=CE, input=INPUT_TEXT, encoding_format="float", task="classify").json()
    assert len(classify["data"]) == 1 and len(classify["data"][0]["data"]) == 1


@pytest.mark.parametrize("task", ["embed", "token_embed"])
def test_pooling_tasks_a_cross_encoder_does_not_serve(live, task):
    answer = live.post("/pooling", model=CE, input=INPUT_TEXT, encoding_format="float", task=task)
    assert answer.status_code == 400 and answer.json()["error"]["type"] == "BadRequestError"
    assert answer.json()["error"]["message"].startswith(f"Unsupported task: {task!r}")


# -- openai/test_score -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("first", "second"), [("text_1", "text_2"), ("queries", "documents"),
                                               ("queries", "items"), ("data_1", "data_2")])
def test_score_names_of_the_two_sides(live, cross_encoder, first, second):
    reference = CrossEncoder(cross_encoder, device="cpu")
    cases = [(QUERY, DOCS[0], [(QUERY, DOCS[0])]), (QUERY, DOCS[:2], [(QUERY, d) for d in DOCS[:2]]),
             ([QUERY, DOCS[2]], DOCS[:2], [(QUERY, DOCS[0]), (DOCS[2], DOCS[1])])]
    for one, two, pairs in cases:
        answer = live.post("/score", model=CE, **{first: one, second: two})
        answer.raise_for_status()
        body = answer.json()
        assert body["id"] is not None and body["object"] == "list"
        assert [d["index"] for d in body["data"]] == list(range(len(pairs)))
        assert all(d["object"] == "score" for d in body["data"])
        np.testing.assert_allclose([d["score"] for d in body["data"]], reference.predict(pairs), rtol=1e-4)


def test_one_side_named_twice_is_refused(live):
    answer = live.post("/score", model=CE, queries=QUERY, documents=DOCS, items=DOCS)
    assert answer.status_code == 400 and "`documents` and `items`" in answer.json()["error"]["message"]


def test_score_on_a_bi_encoder_is_the_cosine_and_refuses_activation(live, st_minilm):
    body = live.post("/v1/score", model=MINILM, text_1=QUERY, text_2=DOCS[:2]).json()
    query, *docs = st_minilm.encode([QUERY, *DOCS[:2]])
    expected = [float(F.cosine_similarity(torch.tensor(query), torch.tensor(d), dim=0)) for d in docs]
    np.testing.assert_allclose([d["score"] for d in body["data"]], expected, rtol=1e-3)
    for name in ("activation", "use_activation"):  # vLLM: activation is for cross-encoders
        answer = live.post("/score", model=MINILM, text_1=QUERY, text_2=DOCS[:2], **{name: True})
        assert answer.status_code == 400 and answer.json()["error"]["type"] == "BadRequestError"
        assert "does not support ['use_activation']" in answer.json()["error"]["message"]


def test_score_max_model_len(live):
    answer = live.post("/score", model=CE, queries=QUERY * 20, documents=DOCS[:2])
    assert answer.status_code == 400 and "Please reduce the length of the input prompt" in answer.text
    answer = live.post("/score", model=CE, queries=QUERY * 20, documents=DOCS[:2], truncate_prompt_tokens=129)
    assert answer.status_code == 400 and "Please request a smaller truncation size." in answer.text
    answer = live.post("/score", model=CE, queries=QUERY * 20, documents=DOCS[:2], truncate_prompt_tokens=-1)
    assert answer.status_code == 200 and len(answer.json()["data"]) == 2


# -- classify/test_online ----------------------------------------------------------------------------------


def test_classify_texts_and_token_ids(live, classifier):
    labels = ["negative", "neutral", "positive"]
    ids = tokens(classifier, INPUT_TEXT)
    for sent, count in ((INPUT_TEXT, 1), (ids, 1), ([INPUT_TEXT] * 10, 10), ([ids] * 10, 10)):
        answer = live.post("/classify", model=CLF, input=sent)
        answer.raise_for_status()
        body = answer.json()
        assert body["object"] == "list" and body["model"] == CLF and len(body["data"]) == count
        for i, item in enumerate(body["data"]):
            assert item["index"] == i and item["label"] in labels and len(item["probs"]) == item["num_classes"] == 3


def test_classify_empty_input_truncation_and_special_tokens(live, classifier):
    for empty in ("", []):
        answer = live.post("/classify", model=CLF, input=empty)
        assert answer.status_code == 400 and "error" in answer.json()
    answer = live.post("/classify", model=CLF, input="hello " * 600, truncate_prompt_tokens=5)
    assert answer.json()["usage"]["prompt_tokens"] == answer.json()["usage"]["total_tokens"] == 5
    answer = live.post("/classify", model=CLF, input="test", truncate_prompt_tokens=513)
    assert answer.status_code == 400 and "truncate_prompt_tokens" in answer.json()["error"]["message"]
    with_specials = live.post("/classify", model=CLF, input=INPUT_TEXT, add_special_tokens=True).json()
    without = live.post("/classify", model=CLF, input=INPUT_TEXT, add_special_tokens=False).json()
    assert with_specials["usage"]["prompt_tokens"] == len(tokens(classifier, INPUT_TEXT))
    assert without["usage"]["prompt_tokens"] == len(tokens(classifier, INPUT_TEXT, add_special_tokens=False))


@pytest.mark.parametrize("name", ["use_activation", "activation"])
def test_classify_activation_is_softmax(live, name):
    def outputs(value):
        return torch.tensor([d["probs"] for d in live.post("/classify", model=CLF, input=INPUT_TEXT,
                                                           **{name: value}).json()["data"]])

    default, on, off = outputs(None), outputs(True), outputs(False)
    assert torch.allclose(default, on, atol=1e-2) and not torch.allclose(on, off, atol=1e-2)
    assert torch.allclose(F.softmax(off, dim=-1), on, atol=1e-2)


def test_pooling_on_a_classifier(live):
    answer = live.post("/pooling", model=CLF, input=INPUT_TEXT, encoding_format="float", task="classify").json()
    assert len(answer["data"]) == 1 and len(answer["data"][0]["data"]) == 3
    # token_classify: vLLM refuses it on its LAST-pooling LLM classifier; a BERT classifier's head scores
    # every token, so it is served here (softmax over the 3 labels per token)
    rows = live.post("/pooling", model=CLF, input=INPUT_TEXT, task="token_classify").json()["data"][0]["data"]
    assert all(len(row) == 3 and abs(sum(row) - 1) < 1e-5 for row in rows)
    for task in ("embed", "token_embed"):
        answer = live.post("/pooling", model=CLF, input=INPUT_TEXT, task=task)
        assert answer.json()["error"]["type"] == "BadRequestError"
        assert answer.json()["error"]["message"].startswith(f"Unsupported task: {task!r}")
    answer = live.post("/pooling", model=CLF, input=INPUT_TEXT, task="plugin")
    assert answer.json()["error"]["type"] == "BadRequestError"
    assert answer.json()["error"]["message"].startswith("No IOProcessor plugin installed.")


def test_score_and_rerank_on_a_many_label_classifier(live):
    """vLLM registers no score route for num_labels > 1 (404 {"detail": "Not Found"}); our routes serve every
    model, so the model's tasks answer instead: a 400 that names them."""
    for path, body in (("/score", {"queries": "ping", "documents": "pong"}),
                       ("/rerank", {"query": "ping", "documents": ["pong"]})):
        answer = live.post(path, model=CLF, **body)
        assert answer.status_code == 400 and answer.json()["error"]["message"].startswith("Unsupported task: 'score'")


# -- error bodies ------------------------------------------------------------------------------------------


def test_error_bodies_by_route(live):
    missing = live.post("/pooling", model="no-such-model", input="x")
    assert missing.status_code == 404
    assert {k: missing.json()["error"][k] for k in ("type", "code")} == {"type": "NotFoundError", "code": 404}
    assert missing.json()["error"]["embedfleet_code"] == "model_not_found"
    for path in ("/score", "/v1/score", "/rerank", "/v1/rerank", "/classify", "/tokenize", "/detokenize"):
        error = live.post(path, model=CE, unknown_field=1).json()["error"]
        assert (error["type"], error["code"]) == ("BadRequestError", 400), path
        assert "`unknown_field` is not a request field" in error["message"]
    cohere = live.post("/v2/rerank", model=CE, query=QUERY, documents=[])
    assert cohere.status_code == 400 and cohere.json()["message"] == cohere.json()["error"]["message"]
    assert cohere.json()["error"]["type"] == "BadRequestError"
    with pytest.raises(openai.NotFoundError) as caught:  # /v1/embeddings keeps OpenAI's body
        live.openai.embeddings.create(model="no-such-model", input="x")
    assert caught.value.body["type"] == "not_found_error" and caught.value.body["code"] == "model_not_found"


def test_messages_quote_model_names_once(live):
    answers = [live.post("/classify", model=MINILM, input="x"), live.post("/pooling", model=CE, input="x " * 200),
               live.post("/score", model=CE, text_1="a", text_2="b", truncate_prompt_tokens=500),
               live.post("/v1/embeddings", model=MINILM, input="x", dimensions=8)]
    for answer in answers:
        message = answer.json()["error"]["message"]
        assert answer.status_code == 400 and "''" not in message
        assert "model 'ce'" in message.lower() or "model 'minilm'" in message.lower()
