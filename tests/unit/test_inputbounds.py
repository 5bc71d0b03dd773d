"""Bounds before work (worker/engine/inputbounds.py, common/bounds.py): a text's length is judged from a bounded
window before the tokenizer reads it whole; the window tokenises as the whole text as far as a request reads
it, so a truncation from it embeds the same tokens, and a refusal from it refuses what the whole would."""

from __future__ import annotations

import logging
import random

import pytest

from embedfleet.common.bounds import MIN_TEXT_WINDOW, most_chars
from embedfleet.common.errors import InputTooLongError, ValidationError
from embedfleet.common.request import EmbedRequest
from tests.tinymodels import engine_for, sample_texts
from embedfleet.worker.engine.inputbounds import bound_inputs
from embedfleet.worker.engine.preprocess import prepare

SEPARATORS = [" ", "  ", "\n", "\t ", " \n\n ", " - ", ", ", "   "]


def messy(seed: int, chars: int, extra: str = "") -> str:
    """Sentences joined by runs of mixed whitespace and punctuation, past `chars` characters."""
    rng = random.Random(seed)
    parts, size = [], 0
    while size < chars:
        part = rng.choice(sample_texts(40, seed=seed)) + rng.choice(SEPARATORS) + (extra if rng.random() < 0.1 else "")
        parts.append(part)
        size += len(part)
    return "".join(parts)


@pytest.fixture(scope="module", params=["minilm", "byte-bpe"])
def model(request, minilm_engine, decoder_lasttoken):
    """A WordPiece tokenizer (MiniLM) and a byte-level BPE one (a tiny Qwen2)."""
    return minilm_engine.model if request.param == "minilm" else engine_for(decoder_lasttoken).model


def tokens_of(model, request: EmbedRequest) -> list[list[int]]:
    return prepare(model, request).token_lists


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("keep", [3, 100, -1])
def test_a_truncation_reads_a_window_and_embeds_the_same_tokens(model, side, keep):
    extra = " 日本語のテキスト " if model.caps.name.endswith("minilm") else " ünïcödé ☃ "
    texts = [messy(seed, 4 * MIN_TEXT_WINDOW, extra) for seed in range(3)]
    request = EmbedRequest(model="m", inputs=texts, params={"truncate_prompt_tokens": keep, "truncation_side": side})
    bounded = bound_inputs(model, request)
    assert all(len(cut) < len(text) for cut, text in zip(bounded.inputs, texts))  # a window, not the whole text
    assert tokens_of(model, bounded) == tokens_of(model, request)


def test_a_text_over_the_limit_is_refused_from_a_window_as_the_whole_text_would_be(model):
    text = messy(7, 3 * MIN_TEXT_WINDOW)
    request = EmbedRequest(model="m", inputs=["short", text])
    with pytest.raises(InputTooLongError) as whole:
        tokens_of(model, request)
    with pytest.raises(InputTooLongError) as windowed:
        bound_inputs(model, request)
    assert "input 1 has more than" in windowed.value.message and windowed.value.param == "input"
    assert "input 1" in whole.value.message
    fits = EmbedRequest(model="m", inputs=[text[:500]])  # under the window: left whole for the exact count
    assert bound_inputs(model, fits) is fits


def test_a_huge_text_costs_a_window_only(minilm_engine):
    """7 MB refused, and 7 MB truncated, with the tokenizer reading at most most_chars(256) characters."""
    model = minilm_engine.model
    huge = "word " * 1_400_000
    with pytest.raises(InputTooLongError, match="more than 256 tokens"):
        bound_inputs(model, EmbedRequest(model="m", inputs=[huge]))
    cut = bound_inputs(model, EmbedRequest(model="m", inputs=[huge], params={"truncate_prompt_tokens": -1}))
    assert len(cut.inputs[0]) <= most_chars(256)
    assert tokens_of(model, cut)[0] == model.tokenizer("word " * 300, truncation=True, max_length=256)["input_ids"]


def test_a_text_read_as_unknown_tokens_is_refused_with_a_word(minilm_engine):
    model = minilm_engine.model
    for text in ("x" * 20_000, "y" * 50_000, "a few words " + "z" * 5_000):
        result = minilm_engine.run([EmbedRequest(model="m", inputs=[text])])[0]
        assert result.error_code == "invalid_request" and result.error_param == "input", text[:20]
        assert "[UNK]" in result.error_message and "split long words" in result.error_message
    for fine in ("🙂 ok", "a short text", "https://example.com/" + "a/" * 80):  # one [UNK], a long URL: embedded
        assert minilm_engine.run([EmbedRequest(model="m", inputs=[fine])])[0].ok, fine
    with pytest.raises(ValidationError):
        bound_inputs(model, EmbedRequest(model="m", inputs=["x" * 20_000], params={"task": "embed"}))
    tokenized = bound_inputs(model, EmbedRequest(model="m", inputs=["x" * 1_000], params={"task": "tokenize"}))
    assert tokenized.inputs == ["x" * 1_000]  # /tokenize shows the [UNK] as it is


def test_no_transformers_length_warning(minilm_engine, caplog):
    """transformers' "Token indices sequence length is longer than ... (10002 > 512)" quotes the tokenizer's limit,
    not the model's 256: our input_too_long says it instead."""
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("transformers")
    logger.addHandler(handler)
    try:
        result = minilm_engine.run([EmbedRequest(model="m", inputs=["word " * 10_000])])[0]
    finally:
        logger.removeHandler(handler)
    assert result.error_code == "input_too_long"
    assert not [r for r in records if "Token indices sequence length" in r.getMessage()]


def test_the_producer_refuses_a_text_too_long_in_characters_alone(minilm_engine):
    caps = minilm_engine.caps
    with pytest.raises(InputTooLongError, match="input 1 has 25,601 characters"):
        EmbedRequest(model="m", inputs=["ok", "w" * 25_601]).resolve(caps)
    EmbedRequest(model="m", inputs=["ok", "w" * 25_601], params={"truncate_prompt_tokens": -1}).resolve(caps)
    with pytest.raises(InputTooLongError, match=r"\(/tokenize too\)"):
        EmbedRequest(model="m", inputs=["w " * 20_000], params={"task": "tokenize"}).resolve(caps)
