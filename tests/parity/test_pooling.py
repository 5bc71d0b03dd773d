"""Pooling and post-processing: each strategy against sentence-transformers, on tensors and on tiny models."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from embedfleet.common.request import EmbedRequest
from tests.tinymodels import (cosines, embed, engine_for, sample_texts, save_tiny_bert, save_tiny_decoder,
                              st_reference)
from embedfleet.worker.engine.engine import Engine
from embedfleet.worker.engine.models.loader import load_model
from embedfleet.worker.engine.pooling import STRATEGIES, Pooler, modes_from_config

logging.getLogger("sentence_transformers").setLevel(logging.ERROR)
MODES = sorted(STRATEGIES)


def _masks(lengths: list[int], width: int, side: str) -> torch.Tensor:
    mask = torch.zeros(len(lengths), width, dtype=torch.long)
    for row, n in enumerate(lengths):
        mask[row, width - n:] = 1 if side == "left" else 0
        if side == "right":
            mask[row, :n] = 1
    return mask


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("include_prompt", [True, False])
def test_strategy_matches_sentence_transformers_pooling(mode, side, include_prompt):
    from sentence_transformers.sentence_transformer.modules import Pooling

    torch.manual_seed(0)
    lengths, width = [7, 3, 5, 7], 7
    hidden = torch.randn(len(lengths), width, 16)
    mask = _masks(lengths, width, side)
    prompt = 2
    reference = Pooling(16, pooling_mode=mode, include_prompt=include_prompt)(
        {"token_embeddings": hidden, "attention_mask": mask, "prompt_length": prompt})["sentence_embedding"]
    ours = Pooler([mode], include_prompt)(hidden, mask, torch.full((len(lengths),), prompt))
    torch.testing.assert_close(ours, reference, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", MODES)
def test_padding_does_not_leak(mode):
    """A row pooled inside a wider padded batch equals the row pooled alone, on either padding side."""
    torch.manual_seed(1)
    hidden = torch.randn(1, 4, 8)
    alone = Pooler([mode])(hidden, torch.ones(1, 4, dtype=torch.long))
    for side in ("left", "right"):
        wide = torch.randn(1, 9, 8) * 100  # garbage in the padded slots
        span = slice(5, 9) if side == "left" else slice(0, 4)
        wide[:, span] = hidden
        mask = _masks([4], 9, side)
        torch.testing.assert_close(Pooler([mode])(wide, mask), alone)


def test_several_modes_concatenate_in_legacy_order():
    config = {"pooling_mode_mean_tokens": True, "pooling_mode_cls_token": True}
    assert modes_from_config(config) == ("cls", "mean")
    assert modes_from_config({"pooling_mode": "lasttoken"}) == ("lasttoken",)
    assert modes_from_config({}) == ("mean",)
    with pytest.raises(ValueError, match="known are"):
        modes_from_config({"pooling_mode": "median"})


FLAVOURS = ["bert_cls", "bert_mean", "bert_max", "bert_weightedmean", "bert_sqrt", "bert_lasttoken",
            "bert_dense_normalize", "matryoshka_model", "decoder_lasttoken", "gpt2_lasttoken"]


def _reference(folder: str, texts: list[str], *, drop_normalize=False, normalize=False, single=False):
    model = st_reference(folder, drop_normalize=drop_normalize)
    if single:  # ST's own batches shift GPT2's absolute positions under left padding: compare text by text
        return np.stack([model.encode([t], normalize_embeddings=normalize)[0] for t in texts])
    return model.encode(texts, normalize_embeddings=normalize)


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_engine_matches_sentence_transformers(flavour, request):
    folder = request.getfixturevalue(flavour)
    texts = sample_texts(12, seed=7)
    single = flavour == "gpt2_lasttoken"
    caps = engine_for(folder).caps
    reference = _reference(folder, texts, single=single)
    ours = embed(folder, texts)
    assert ours.shape == reference.shape == (12, caps.embedding_size)
    assert cosines(ours.embeddings, reference).min() >= 0.99999
    np.testing.assert_allclose(ours.embeddings, reference, rtol=1e-4, atol=1e-5)
    # use_activation=False is the vector before ST's Normalize module (or as is, without one)
    raw = _reference(folder, texts, drop_normalize=True, single=single)
    unnormalised = embed(folder, texts, use_activation=False).embeddings
    assert cosines(unnormalised, raw).min() >= 0.99999
    np.testing.assert_allclose(unnormalised, raw, rtol=1e-4, atol=1e-5)


def test_normalize_flag_and_use_activation(bert_mean, bert_dense_normalize):
    assert engine_for(bert_mean).caps.normalize is False
    assert engine_for(bert_dense_normalize).caps.normalize is True
    assert engine_for(bert_dense_normalize).caps.embedding_size == 24  # after Dense
    texts = sample_texts(5, seed=2)
    forced = embed(bert_mean, texts, use_activation=True).embeddings
    np.testing.assert_allclose(np.linalg.norm(forced, axis=-1), 1, rtol=1e-6)
    reference = _reference(bert_mean, texts, normalize=True)
    assert cosines(forced, reference).min() >= 0.99999


def test_include_prompt_false_matches_sentence_transformers(tmp_path):
    from tests.tinymodels import wrap_sentence_transformers

    folder = wrap_sentence_transformers(save_tiny_bert(str(tmp_path / "instr")), "mean",
                                        prompts={"query": "represent the query: "},
                                        default_prompt_name="query", include_prompt=False)
    texts = sample_texts(6, seed=4)
    reference = st_reference(folder).encode(texts, prompt_name="query")
    ours = embed(folder, texts, prompt_name="query")
    assert cosines(ours.embeddings, reference).min() >= 0.99999


def test_plain_hf_folder_uses_vllm_defaults(tmp_path):
    """No sentence-transformers files: CLS for an encoder, last token for a decoder, normalised."""
    bert = load_model(save_tiny_bert(str(tmp_path / "plain_bert")))
    assert (bert.caps.pooling, bert.caps.normalize) == ("cls", True)
    decoder = load_model(save_tiny_decoder(str(tmp_path / "plain_gpt2"), kind="gpt2"))
    assert (decoder.caps.pooling, decoder.caps.normalize, decoder.padding_side) == ("lasttoken", True, "left")
    assert decoder.tokenizer.pad_token is None  # no pad token needed: padded slots are masked
    texts = sample_texts(4)
    together = Engine(decoder).run([EmbedRequest(model="m", inputs=texts)])[0].embeddings
    alone = np.vstack([Engine(decoder).run([EmbedRequest(model="m", inputs=[t])])[0].embeddings for t in texts])
    np.testing.assert_allclose(together, alone, rtol=1e-4, atol=1e-5)


def test_do_lower_case_is_honoured(tmp_path):
    from tests.tinymodels import wrap_sentence_transformers

    folder = wrap_sentence_transformers(save_tiny_bert(str(tmp_path / "cased"), lower_case=False), "mean",
                                        do_lower_case=True)
    texts = ["The QUICK Brown Fox", "PARIS weather TODAY"]
    ours = embed(folder, texts)
    np.testing.assert_allclose(ours.embeddings, embed(folder, [t.lower() for t in texts]).embeddings, rtol=1e-5)
    assert cosines(ours.embeddings, st_reference(folder).encode(texts)).min() >= 0.99999
