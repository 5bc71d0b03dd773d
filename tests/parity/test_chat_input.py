"""Chat `messages` on /v1/embeddings, /pooling and /classify, end to end (real gateway, BatchWorker threads, real
Redis): the worker renders the conversation with the tokenizer's chat template exactly as transformers'
apply_chat_template(tokenize=False) does, and the vectors equal sentence-transformers' encode of that text.
A tiny BERT and a tiny classifier get a template of their own; all-MiniLM-L6-v2 has none."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from pydantic import ValidationError as PydanticValidationError
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from embedfleet.common.chat import CHAT_INPUT, NO_TEMPLATE, UNTRUSTED_TEMPLATE
from embedfleet.common.errors import DecodeError
from embedfleet.common.request import EmbedRequest
from embedfleet import Producer
from tests.livegateway import live_fleet
from tests.tinymodels import save_tiny_bert, save_tiny_classifier, st_reference, wrap_sentence_transformers
from embedfleet.worker.engine.engine import Engine
from embedfleet.worker.engine.models.loader import load_model

TEMPLATE = ("{% for m in messages %}"
            "{% if m['role'] not in ['system', 'user', 'assistant'] %}{{ raise_exception('unknown role ' + m['role'])"
            " }}{% endif %}<|{{ m['role'] }}|> {{ m['content'] }} {% endfor %}"
            "{% if topic is defined %}topic {{ topic }} {% endif %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")
OTHER_TEMPLATE = "{% for m in messages %}{{ m['role'] }} says {{ m['content'] }}. {% endfor %}"
MESSAGES = [{"role": "system", "content": "answer about the weather"},
            {"role": "user", "content": "is it sunny in paris today"}]


def _with_template(folder: str) -> str:
    """The folder's tokenizer given TEMPLATE (after sentence-transformers saved its modules, so that ST reads
    text inputs as text)."""
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.chat_template = TEMPLATE
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def folders(tmp_path_factory, minilm_path) -> dict[str, str]:
    bert = wrap_sentence_transformers(save_tiny_bert(str(tmp_path_factory.mktemp("chatbert"))), "mean")
    clf = save_tiny_classifier(str(tmp_path_factory.mktemp("chatclf")), labels=("no", "maybe", "yes"), seed=2)
    return {"chat": _with_template(bert), "clf": _with_template(clf), "minilm": minilm_path}


@pytest.fixture(scope="module")
def http(folders, redis_server):
    # MiniLM's worker renders a request's own template (--trust-request-chat-template); the others refuse one.
    engines = {name: Engine(load_model(folder, served_name=name, trust_request_chat_template=name == "minilm"),
                            max_batch_tokens=1024)
               for name, folder in folders.items()}
    with live_fleet(redis_server.url, engines) as client:
        yield client


def _rendered(folder: str, messages=MESSAGES, **options) -> str:
    return AutoTokenizer.from_pretrained(folder).apply_chat_template(messages, tokenize=False, **options)


def _vector(answer) -> np.ndarray:
    assert answer.status_code == 200, answer.text
    return np.array(answer.json()["data"][0]["embedding"])


def test_messages_equal_the_rendered_text(http, folders):
    rendered = _rendered(folders["chat"], add_generation_prompt=True)
    assert rendered.startswith("<|system|> answer about the weather <|user|>") and rendered.endswith("<|assistant|>")
    body = {"model": "chat", "messages": MESSAGES, "add_generation_prompt": True}
    # add_special_tokens on: exactly sentence-transformers' encode of the rendered text
    with_specials = _vector(http.post("/v1/embeddings", json={**body, "add_special_tokens": True}))
    np.testing.assert_allclose(with_specials, st_reference(folders["chat"]).encode([rendered])[0], atol=1e-5)
    # vLLM's default for chat: no special tokens on top of the template's = the rendered text's ids as given
    plain = http.post("/v1/embeddings", json=body)
    ids = AutoTokenizer.from_pretrained(folders["chat"])(rendered, add_special_tokens=False)["input_ids"]
    np.testing.assert_allclose(_vector(plain), _vector(http.post("/v1/embeddings", json={"model": "chat",
                                                                                           "input": [ids]})),
                               atol=1e-6)
    assert plain.json()["usage"]["prompt_tokens"] == len(ids)
    pooled = http.post("/pooling", json=body).json()["data"][0]["data"]
    np.testing.assert_allclose(pooled, _vector(plain), atol=1e-6)


def test_the_python_producer_sends_a_conversation(http, redis_server):
    body = {"model": "chat", "messages": MESSAGES, "add_generation_prompt": True}
    with Producer(redis_server.url) as producer:
        request_id = producer.submit(None, "chat", chat={"messages": MESSAGES, "add_generation_prompt": True},
                                     add_special_tokens=False)
        got = producer.wait(request_id, 60).embeddings[0]
    np.testing.assert_allclose(got, _vector(http.post("/v1/embeddings", json=body)), atol=1e-6)


def test_template_options_and_content_parts(http, folders):
    parts = [{"role": "user", "content": [{"type": "text", "text": "is it sunny"},
                                          {"type": "text", "text": "in paris"}]}]
    rendered = _rendered(folders["chat"], [{"role": "user", "content": "is it sunny\nin paris"}], topic="weather")
    assert "topic weather" in rendered
    got = _vector(http.post("/v1/embeddings", json={"model": "chat", "messages": parts, "add_special_tokens": True,
                                                    "chat_template_kwargs": {"topic": "weather"}}))
    np.testing.assert_allclose(got, st_reference(folders["chat"]).encode([rendered])[0], atol=1e-5)


def test_classify_messages(http, folders):
    rendered = _rendered(folders["clf"])
    answer = http.post("/classify", json={"model": "clf", "messages": MESSAGES})
    assert answer.status_code == 200, answer.text
    tokenizer = AutoTokenizer.from_pretrained(folders["clf"])
    model = AutoModelForSequenceClassification.from_pretrained(folders["clf"]).eval()
    with torch.no_grad():
        logits = model(**tokenizer(rendered, add_special_tokens=False, return_tensors="pt")).logits[0]
    np.testing.assert_allclose(answer.json()["data"][0]["probs"], torch.softmax(logits, -1).numpy(), atol=1e-5)


def test_a_model_without_a_template(http, folders, minilm_path):
    answer = http.post("/v1/embeddings", json={"model": "minilm", "messages": MESSAGES})
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert NO_TEMPLATE in error["message"] and error["param"] == "messages"
    # its worker trusts a request's template: rendered with it, and equal to ST's encode of that text
    rendered = AutoTokenizer.from_pretrained(minilm_path).apply_chat_template(MESSAGES, tokenize=False,
                                                                              chat_template=OTHER_TEMPLATE)
    got = _vector(http.post("/v1/embeddings", json={"model": "minilm", "messages": MESSAGES, "add_special_tokens": True,
                                                    "chat_template": OTHER_TEMPLATE}))
    np.testing.assert_allclose(got, st_reference(minilm_path).encode([rendered])[0], atol=1e-5)
    refused = http.post("/v1/embeddings", json={"model": "chat", "messages": MESSAGES, "chat_template": OTHER_TEMPLATE})
    assert refused.status_code == 400 and UNTRUSTED_TEMPLATE in refused.json()["error"]["message"]


@pytest.mark.parametrize(("body", "words"), [
    ({"input": "x", "messages": MESSAGES}, "either `input` or `messages`"),
    ({}, "either `input` or `messages`"),
    ({"input": "x", "add_generation_prompt": True}, "`add_generation_prompt` apply to `messages` only"),
    ({"messages": MESSAGES, "add_generation_prompt": True, "continue_final_message": True}, "Cannot set both"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, "messages"),
    ({"messages": MESSAGES, "chat_template_kwargs": {"tokenize": True}}, "may not set ['tokenize']"),
    ({"messages": [{"role": "robot", "content": "hi"}]}, "the chat template cannot render these `messages`"),
    ({"messages": MESSAGES, "prompt_name": "query"}, "apply to `input` texts, not to `messages`"),
    ({"messages": [], "model": "chat"}, "messages"),
])
def test_bad_chat_bodies_are_clear_400s(http, body, words):
    answer = http.post("/v1/embeddings", json={"model": "chat", **body})
    assert answer.status_code == 400, answer.text
    assert words in answer.json()["error"]["message"]


def test_a_bad_conversation_fails_alone(folders):
    """In one round with good requests, a conversation the template refuses gets its error; the rest answer."""
    engine = Engine(load_model(folders["chat"], served_name="chat"))
    good = EmbedRequest(model="chat", inputs=[CHAT_INPUT], chat={"messages": MESSAGES})
    bad = EmbedRequest(model="chat", inputs=[CHAT_INPUT], chat={"messages": [{"role": "robot", "content": "hi"}]})
    results = engine.run([good, bad, EmbedRequest(model="chat", inputs=["plain text"])])
    assert [r.status for r in results] == ["ok", "error", "ok"]
    assert results[1].error_code == "invalid_request" and "unknown role robot" in results[1].error_message


def test_chat_read_from_redis_is_validated():
    good = EmbedRequest(model="m", inputs=[CHAT_INPUT], chat={"messages": MESSAGES}).encode()
    assert EmbedRequest.decode(good).chat.messages[1].content == MESSAGES[1]["content"]
    from embedfleet.common.codec import packb, unpackb
    for change in ({"chat": {"messages": "not a list"}}, {"chat": {"messages": MESSAGES, "chat_template_kwargs":
                                                                    {"messages": []}}},
                   {"inputs": ["two", "inputs"]}):
        raw = packb({**unpackb(good), **change})
        with pytest.raises(DecodeError):
            EmbedRequest.decode(raw)
    with pytest.raises(PydanticValidationError):
        EmbedRequest(model="m", inputs=["text"], chat={"messages": MESSAGES})
