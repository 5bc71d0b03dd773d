"""TEI's routes (/embed, /embed_all, /similarity, /info, POST /) on a live gateway and worker thread serving
all-MiniLM-L6-v2, checked against sentence-transformers and transformers, and the real huggingface_hub
InferenceClient pointed at the gateway (no hub call may happen)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import huggingface_hub.constants
import numpy as np
import pytest
import torch
from huggingface_hub import InferenceClient
from huggingface_hub.errors import HfHubHTTPError
from sentence_transformers import SentenceTransformer
from transformers import AutoModel, AutoTokenizer

from tests.livegateway import forbid_internet, live_gateway

MODEL = "minilm"
MAX_INPUTS = 16  # the gateway's --max-inputs: TEI's max_client_batch_size
TEXTS = ["The cat sits on the mat.", "A fleet of workers embeds text.", "Redis keeps the queue safe."]
SOURCE, SENTENCES = "How do I bake bread?", ["Bread baking for beginners", "Stock markets fell today", "Baking"]
# Longer than MiniLM's 256 tokens, with a head and a tail that differ (left and right truncation disagree).
LONG = "the cat sat on the mat " * 30 + "stock markets fell sharply again today " * 30


@pytest.fixture(scope="module")
def gateway_url(redis_server, minilm_engine):
    with live_gateway(redis_server.url, [minilm_engine], max_inputs=MAX_INPUTS) as url:
        yield url


@pytest.fixture(scope="module")
def http(gateway_url):
    with httpx.Client(base_url=gateway_url, timeout=60) as client:
        yield client


@pytest.fixture(scope="module")
def st(minilm_path) -> SentenceTransformer:
    return SentenceTransformer(minilm_path, device="cpu")


@pytest.fixture(scope="module")
def st_raw(st) -> SentenceTransformer:
    """The same model without its Normalize module: TEI's `normalize: false`."""
    return SentenceTransformer(modules=[st[0], st[1]], device="cpu")


def assert_same(got, want, cosine: float = 1e-5):
    """Row by row: cosine similarity within `cosine` of 1 and the same length (the scale matters too)."""
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape
    cos = (got * want).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))
    assert np.all(cos > 1 - cosine), cos
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), np.linalg.norm(want, axis=1), rtol=1e-4)


def left_truncated(st: SentenceTransformer, texts: list[str]) -> np.ndarray:
    st.tokenizer.truncation_side = "left"
    try:
        return st.encode(texts)
    finally:
        st.tokenizer.truncation_side = "right"


def test_embed_equals_sentence_transformers(http, st):
    answer = http.post("/embed", json={"inputs": TEXTS})
    assert answer.status_code == 200, answer.text
    assert_same(answer.json(), st.encode(TEXTS))
    assert int(answer.headers["x-compute-tokens"]) == sum(len(st.tokenizer(t)["input_ids"]) for t in TEXTS)
    assert int(answer.headers["x-compute-characters"]) == sum(len(t) for t in TEXTS)
    single = http.post("/embed", json={"inputs": TEXTS[0]}).json()  # one text: still a list of vectors
    assert_same(single, st.encode(TEXTS[:1]))


def test_normalize_false_and_dimensions_on_any_model(http, st_raw):
    raw = st_raw.encode(TEXTS)
    assert_same(http.post("/embed", json={"inputs": TEXTS, "normalize": False}).json(), raw)
    # TEI cuts any model's vector, then normalises: MiniLM is no Matryoshka model and still gets 128.
    cut = http.post("/embed", json={"inputs": TEXTS, "dimensions": 128}).json()
    assert_same(cut, raw[:, :128] / np.linalg.norm(raw[:, :128], axis=1, keepdims=True))
    assert_same(http.post("/embed", json={"inputs": TEXTS, "dimensions": 128, "normalize": False}).json(),
                raw[:, :128])
    assert_same(http.post("/embed", json={"inputs": TEXTS, "dimensions": 384}).json(),
                raw / np.linalg.norm(raw, axis=1, keepdims=True))


def test_token_id_inputs(http, st):
    ids = [st.tokenizer(t)["input_ids"] for t in TEXTS]
    assert_same(http.post("/embed", json={"inputs": ids[0]}).json(), st.encode(TEXTS[:1]))
    assert_same(http.post("/embed", json={"inputs": ids}).json(), st.encode(TEXTS))


def test_truncation(http, st):
    tokens = len(st.tokenizer(LONG)["input_ids"])
    assert tokens > st.max_seq_length
    refused = http.post("/embed", json={"inputs": [TEXTS[0], LONG]})
    assert refused.status_code == 400
    assert refused.json() == {"error": f"Input validation error: `inputs` must have less than {st.max_seq_length} "
                                       f"tokens. Given: {tokens}", "error_type": "Validation"}
    right = http.post("/embed", json={"inputs": [LONG], "truncate": True}).json()
    assert_same(right, st.encode([LONG]))
    for direction in ("Left", "left"):  # TEI's serde takes both spellings; huggingface_hub sends "left"
        left = http.post("/embed", json={"inputs": [LONG], "truncate": True, "truncation_direction": direction})
        assert_same(left.json(), left_truncated(st, [LONG]))
    assert float(np.dot(right[0], left.json()[0])) < 0.99  # the two ends really differ


def test_a_refused_request_loses_nothing_sent_with_it(http, st):
    bodies = [{"inputs": TEXTS}, {"inputs": LONG}, {"inputs": TEXTS[::-1]}, {"inputs": ""}, {"inputs": TEXTS[1]}]
    with ThreadPoolExecutor(len(bodies)) as pool:
        answers = list(pool.map(lambda body: http.post("/embed", json=body), bodies))
    assert [a.status_code for a in answers] == [200, 400, 200, 400, 200]
    assert_same(answers[0].json(), st.encode(TEXTS))
    assert_same(answers[2].json(), st.encode(TEXTS[::-1]))
    assert_same(answers[4].json(), st.encode(TEXTS[1:2]))


def test_embed_all_is_every_tokens_hidden_state(http, minilm_path):
    model, tokenizer = AutoModel.from_pretrained(minilm_path).eval(), AutoTokenizer.from_pretrained(minilm_path)
    answer = http.post("/embed_all", json={"inputs": TEXTS[:2]})
    assert answer.status_code == 200, answer.text
    for got, text in zip(answer.json(), TEXTS[:2]):
        with torch.no_grad():
            want = model(**tokenizer(text, return_tensors="pt")).last_hidden_state[0].numpy()
        np.testing.assert_allclose(np.array(got), want, atol=1e-4)


@pytest.mark.parametrize("path", ["/similarity", "/"])
def test_similarity_is_cosine(http, st, path):
    answer = http.post(path, json={"inputs": {"source_sentence": SOURCE, "sentences": SENTENCES}})
    assert answer.status_code == 200, answer.text
    want = st.similarity(st.encode([SOURCE]), st.encode(SENTENCES))[0].numpy()
    np.testing.assert_allclose(answer.json(), want, atol=1e-5)
    truncated = http.post(path, json={"inputs": {"source_sentence": LONG, "sentences": [LONG]},
                                      "parameters": {"truncate": True, "truncation_direction": "Left"}})
    assert truncated.status_code == 200 and truncated.json() == pytest.approx([1.0], abs=1e-5)


def test_default_route_embeds(http, st):
    assert_same(http.post("/", json={"inputs": TEXTS, "normalize": True}).json(), st.encode(TEXTS))


def test_info(http, st):
    answer = http.get("/info")
    assert answer.status_code == 200
    info = answer.json()
    assert info["model_id"] == info["served_model_name"] == MODEL
    assert info["model_type"] == {"embedding": {"pooling": "mean"}}
    assert info["max_input_length"] == st.max_seq_length and info["max_client_batch_size"] == MAX_INPUTS
    assert info["model_dtype"] == "float32" and info["max_batch_tokens"] == 8192
    assert info["model_sha"] is None and info["auto_truncate"] is False and info["version"]
    assert http.get("/info", params={"model": MODEL}).json() == info


@pytest.mark.parametrize(("path", "body", "error_type", "message"), [
    ("/embed", {"inputs": []}, "Empty", "Input validation error: `inputs` cannot be empty"),
    ("/embed", {"inputs": ["a", ""]}, "Empty", "Input validation error: `inputs` cannot be empty"),
    ("/embed_all", {"inputs": []}, "Empty", "Input validation error: `inputs` cannot be empty"),
    ("/similarity", {"inputs": {"source_sentence": "a", "sentences": []}}, "Empty",
     "Input validation error: `inputs.sentences` cannot be empty"),
    ("/embed", {"inputs": ["a"] * (MAX_INPUTS + 1)}, "Validation",
     f"Input validation error: batch size {MAX_INPUTS + 1} > maximum allowed batch size {MAX_INPUTS}"),
    ("/embed", {"inputs": "a", "normalise": False}, "Validation", "did you mean `normalize`?"),
    ("/embed", {"inputs": "a", "dimensions": 385}, "Validation",
     "`dimensions` should be smaller than the maximum embedding dimension: model 'minilm' has 384"),
    ("/embed", {"inputs": "a", "dimensions": 0}, "Validation", "`dimensions` must be a positive integer"),
    ("/embed", {"inputs": "a", "prompt_name": "query"}, "Validation", "`prompt_name`='query' is unknown"),
    ("/embed", {"inputs": ["a", [101, 102]]}, "Validation", "`inputs` mixes texts and token-id lists"),
    ("/embed", {"inputs": [{"text": "a"}]}, "Validation", "`inputs`[0] must be a text or a token-id list"),
    ("/embed", {"inputs": [101, 5_000_000, 102]}, "Validation", "token id 5000000 is outside the vocabulary"),
    ("/embed", {"inputs": "a", "truncation_direction": "middle"}, "Validation", "truncation_direction"),
    ("/", {"inputs": "a", "model": "nope"}, "Validation", "model 'nope' is not served"),
])
def test_errors_in_tei_shape(http, path, body, error_type, message):
    answer = http.post(path, json=body)
    assert answer.status_code in (400, 404), answer.text
    error = answer.json()
    assert set(error) == {"error", "error_type"} and error["error_type"] == error_type
    assert message in error["error"]


def test_other_errors_in_tei_shape_openai_routes_unchanged(http):
    bad_json = http.post("/embed", content=b"{not json", headers={"content-type": "application/json"})
    assert bad_json.status_code == 400
    assert bad_json.json()["error"].startswith("Input validation error: the body is not valid JSON")
    surrogate = http.post("/embed", content=b'{"inputs": ["fine", "\\ud800"]}',
                          headers={"content-type": "application/json"})
    assert surrogate.status_code == 400 and surrogate.json()["error_type"] == "Validation"
    not_an_object = http.post("/", json=["a text"])
    assert not_an_object.status_code == 400 and not_an_object.json()["error_type"] == "Validation"
    unknown = http.get("/info", params={"model": "nope"})
    assert unknown.status_code == 404 and "model 'nope' is not served" in unknown.json()["error"]
    openai_route = http.post("/v1/embeddings", json={"input": [], "model": MODEL})
    assert openai_route.status_code == 400 and set(openai_route.json()["error"]) >= {"message", "type", "code"}


@pytest.fixture
def offline(monkeypatch) -> list:
    # huggingface_hub 1.x+ fetches an "agent harnesses" list from huggingface.co for its User-Agent header
    # unless telemetry is off (HF_HUB_DISABLE_TELEMETRY=1; read at import, hence the constant here).
    # HF_HUB_OFFLINE=1 is no way out: it makes InferenceClient refuse every URL, a local one too.
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_DISABLE_TELEMETRY", True)
    return forbid_internet(monkeypatch)


def test_huggingface_hub_inference_client(gateway_url, st, st_raw, offline):
    client = InferenceClient(model=gateway_url)  # posts to the bare URL: the gateway's POST /
    vectors = client.feature_extraction(TEXTS[0])
    assert vectors.dtype == np.float32 and vectors.shape == (1, 384)
    assert_same(vectors, st.encode(TEXTS[:1]))
    assert_same(client.feature_extraction(TEXTS[1], normalize=False), st_raw.encode(TEXTS[1:2]))
    assert_same(client.feature_extraction(TEXTS[1], encoding_format="base64"), st.encode(TEXTS[1:2]))
    assert_same(client.feature_extraction(LONG, truncate=True, truncation_direction="left"),
                left_truncated(st, [LONG]))
    scores = client.sentence_similarity(SOURCE, other_sentences=SENTENCES)
    np.testing.assert_allclose(scores, st.similarity(st.encode([SOURCE]), st.encode(SENTENCES))[0], atol=1e-5)
    routed = InferenceClient(model=f"{gateway_url}/embed")  # TEI's own route named in the URL
    assert_same(routed.feature_extraction(TEXTS[2]), st.encode(TEXTS[2:]))
    with pytest.raises(HfHubHTTPError) as refused:
        client.feature_extraction(LONG)
    assert refused.value.response.status_code == 400 and "must have less than 256 tokens" in str(refused.value)
    assert offline == []  # nothing tried to reach huggingface.co (or anything else off this machine)


# --- several models on a fleet of their own (its own redis-server): `model`, prompts, /info's model types, keys ---

KEY = "tei-key"


@pytest.fixture(scope="module")
def tiny_fleet(matryoshka_model, cross_encoder, classifier):
    from embedfleet.common.redisserver import RedisServer
    from tests.taskengines import engine

    engines = [engine(matryoshka_model, "mrl"), engine(cross_encoder, "ce"), engine(classifier, "clf")]
    with RedisServer() as server, live_gateway(server.url, engines, api_key=KEY) as url, \
            httpx.Client(base_url=url, headers={"Authorization": f"Bearer {KEY}"}, timeout=60) as client:
        yield client


def test_prompt_name_and_the_models_default_prompt(tiny_fleet, matryoshka_model):
    st = SentenceTransformer(matryoshka_model, device="cpu")
    plain = tiny_fleet.post("/embed", json={"model": "mrl", "inputs": TEXTS})
    assert_same(plain.json(), st.encode(TEXTS))  # the model's default_prompt_name ("query"), as ST applies it
    passage = tiny_fleet.post("/embed", json={"model": "mrl", "inputs": TEXTS, "prompt_name": "passage"}).json()
    assert_same(passage, st.encode(TEXTS, prompt_name="passage"))
    scores = tiny_fleet.post("/similarity", json={"model": "mrl", "inputs": {"source_sentence": SOURCE,
                                                                                "sentences": SENTENCES},
                                                  "parameters": {"prompt_name": "passage"}}).json()
    want = st.similarity(st.encode([SOURCE], prompt_name="passage"), st.encode(SENTENCES, prompt_name="passage"))
    np.testing.assert_allclose(scores, want[0], atol=1e-5)


def test_dimensions_on_a_matryoshka_model(tiny_fleet, matryoshka_model):
    st = SentenceTransformer(matryoshka_model, device="cpu")
    for dimensions in (16, 12):  # 12 is none of the model's Matryoshka sizes: TEI cuts to it all the same
        got = tiny_fleet.post("/embed", json={"model": "mrl", "inputs": TEXTS, "dimensions": dimensions}).json()
        assert_same(got, st.encode(TEXTS, truncate_dim=dimensions, normalize_embeddings=True))


def test_info_model_types_and_a_model_to_name(tiny_fleet):
    assert tiny_fleet.get("/info", params={"model": "mrl"}).json()["model_type"] == {"embedding": {"pooling": "mean"}}
    reranker = tiny_fleet.get("/info", params={"model": "ce"}).json()["model_type"]
    assert list(reranker) == ["reranker"] and len(reranker["reranker"]["id2label"]) == 1
    classifier = tiny_fleet.get("/info", params={"model": "clf"}).json()["model_type"]
    assert classifier == {"classifier": {"id2label": {"0": "negative", "1": "neutral", "2": "positive"},
                                         "label2id": {"negative": 0, "neutral": 1, "positive": 2}}}
    several = tiny_fleet.get("/info")
    assert several.status_code == 400 and several.json()["error_type"] == "Validation"
    assert "several models are served, name one with `model`: ['ce', 'clf', 'mrl']" in several.json()["error"]
    unsupported = tiny_fleet.post("/embed", json={"model": "ce", "inputs": "a"})
    assert unsupported.status_code == 400 and "Unsupported task: 'embed'. Model 'ce' supports" in \
        unsupported.json()["error"]


def test_api_key_is_required_on_tei_routes(tiny_fleet):
    with httpx.Client(base_url=tiny_fleet.base_url, timeout=30) as keyless:
        for method, path in (("POST", "/embed"), ("POST", "/"), ("GET", "/info"), ("POST", "/similarity")):
            answer = keyless.request(method, path, json={"model": "mrl", "inputs": "a"})
            assert answer.status_code == 401, (path, answer.text)
            assert answer.json()["error_type"] == "Unauthorized" and "API key" in answer.json()["error"]
