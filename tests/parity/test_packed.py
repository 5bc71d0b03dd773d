"""Padding-free forward (worker/engine/packed.py): a batch packed into one sequence gives the padded path's vectors
(CPU, float32) on tiny random encoders and decoders; models it cannot pack fall back at start-up, in one line."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from embedfleet.common.request import EmbedRequest
from tests.commands import clean_env
from tests.tinymodels import cosines, sample_texts, save_tiny_bert, st_reference, wrap_sentence_transformers
from embedfleet.worker.engine.engine import Engine
from embedfleet.worker.engine.models.loader import load_model
from embedfleet.worker.serving.config import WorkerSettings

TEXTS = sample_texts(24, seed=5) + ["x", "Paris is the capital of France.", "def add(a, b):\n    return a + b"]


def _swap_architecture(folder: str, model_type: str) -> str:
    """The tiny BERT folder's tokenizer with a random `model_type` transformer of the same size in its place."""
    import torch
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    vocab = len(AutoTokenizer.from_pretrained(folder))
    config = AutoConfig.for_model(model_type, vocab_size=vocab, hidden_size=32, num_hidden_layers=2,
                                  num_attention_heads=2, intermediate_size=64, max_position_embeddings=130,
                                  pad_token_id=0)
    for name in os.listdir(folder):
        if name.endswith(".safetensors") or name == "config.json":
            os.remove(os.path.join(folder, name))
    torch.manual_seed(0)
    AutoModel.from_config(config).eval().save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def other_encoders(tmp_path_factory) -> dict[str, str]:
    """Tiny random encoders other than BERT, mean-pooled: RoBERTa-style positions, DistilBERT, and two whose
    attention bypasses transformers' attention interface (DeBERTa-v2, MPNet), which packing cannot serve."""
    return {kind: wrap_sentence_transformers(_swap_architecture(
        save_tiny_bert(str(tmp_path_factory.mktemp(kind))), kind), "mean")
        for kind in ("roberta", "xlm-roberta", "distilbert", "deberta-v2", "mpnet")}


def _pair(folder: str):
    return load_model(folder, device="cpu"), load_model(folder, device="cpu", packed="on")


def _ids(model, texts=TEXTS) -> list[list[int]]:
    return [model.tokenizer(text, truncation=True, max_length=model.caps.max_model_len)["input_ids"]
            for text in texts]


@pytest.mark.parametrize("flavour", ["bert_mean", "bert_cls", "bert_lasttoken", "bert_dense_normalize",
                                     "decoder_lasttoken", "gpt2_lasttoken"])
def test_packed_gives_the_padded_vectors(flavour, request):
    padded, packed = _pair(request.getfixturevalue(flavour))
    assert (padded.forward_layout, packed.forward_layout) == ("padded", "packed")
    ids = _ids(padded)
    a, b = padded.embed(ids).numpy(), packed.embed(ids).numpy()
    np.testing.assert_allclose(b, a, atol=2e-5)
    assert cosines(a, b).min() > 0.99999
    # every token's state too, padding left out (task token_embed)
    for row_a, row_b in zip(padded.token_embed(ids), packed.token_embed(ids)):
        np.testing.assert_allclose(row_b, row_a, atol=2e-5)


@pytest.mark.parametrize("kind", ["roberta", "xlm-roberta", "distilbert"])
def test_packed_other_encoders(kind, other_encoders):
    padded, packed = _pair(other_encoders[kind])
    assert packed.forward_layout == "packed"
    ids = _ids(padded)
    np.testing.assert_allclose(packed.embed(ids).numpy(), padded.embed(ids).numpy(), atol=2e-5)


def test_packed_engine_matches_sentence_transformers(matryoshka_model):
    """Through the Engine (prompts, Matryoshka cut, normalisation) against sentence-transformers in float32."""
    engine = Engine(load_model(matryoshka_model, device="cpu", packed="on"), max_batch_tokens=256, max_batch_size=8)
    assert engine.model.forward_layout == "packed"
    result = engine.run([EmbedRequest(model="m", inputs=TEXTS, params={"prompt_name": "query"})])[0]
    result.raise_for_error()
    reference = st_reference(matryoshka_model).encode(TEXTS, prompt_name="query")
    assert cosines(result.embeddings, reference).min() > 0.99999


@pytest.mark.parametrize("kind", ["deberta-v2", "mpnet"])
def test_the_gate_falls_back_to_padded_in_one_line(kind, other_encoders, caplog):
    """DeBERTa-v2 and MPNet run attention of their own: packed, texts would see each other (DeBERTa-v2 agrees to
    ~0.9998 on the probe texts, enough for a float16 gate and not for this one). They serve padded, said once."""
    padded = load_model(other_encoders[kind], device="cpu")
    with caplog.at_level(logging.INFO, logger="embedfleet.worker.engine.packed"):
        model = load_model(other_encoders[kind], device="cpu", packed="on")
    lines = [r for r in caplog.records if r.name == "embedfleet.worker.engine.packed"]
    assert len(lines) == 1 and lines[0].levelno == logging.WARNING
    assert "padded: packed forward disagrees with padded" in lines[0].getMessage()
    assert model.forward_layout == "padded" and model.packer is None
    ids = _ids(model)
    np.testing.assert_array_equal(model.embed(ids).numpy(), padded.embed(ids).numpy())


def test_auto_packs_only_on_cuda_in_half_precision(bert_mean, caplog):
    with caplog.at_level(logging.INFO, logger="embedfleet.worker.engine.packed"):
        model = load_model(bert_mean, device="cpu", packed="auto")
    assert model.forward_layout == "padded" and model.packer is None
    assert "auto packs on CUDA in float16/bfloat16; this is cpu float32" in caplog.text


def test_the_flag_and_its_env_var(monkeypatch):
    assert WorkerSettings.from_args([], "w", "").packed == "auto"
    assert WorkerSettings.from_args(["--packed", "on"], "w", "").packed == "on"
    monkeypatch.setenv("EMBEDFLEET_PACKED", "off")
    assert WorkerSettings.from_args([], "w", "").packed == "off"


def test_half_precision_packs_when_the_float32_gate_passes(minilm_path, caplog):
    """MiniLM in bfloat16: packed and padded differ by bfloat16's rounding (0.99992 on the probe texts), which a
    gate of 0.99999 in the serving dtype always refused. The gate runs in float32; the dtype's own check then
    judges the packed path, and packed serves what padded bfloat16 serves, to the dtype's rounding."""
    with caplog.at_level(logging.INFO, logger="embedfleet.worker.engine.packed"):
        packed = load_model(minilm_path, device="cpu", dtype="bfloat16", packed="on")
    assert packed.forward_layout == "packed", caplog.text
    assert "probe cosine vs padded in float32" in caplog.text
    assert packed.fidelity >= 0.999  # the dtype's check, on the packed path
    padded, exact = load_model(minilm_path, device="cpu", dtype="bfloat16"), load_model(minilm_path, device="cpu")
    ids = _ids(padded)
    a, b, c = (m.embed(ids).numpy() for m in (padded, packed, exact))
    assert cosines(a, b).min() > 0.999
    assert cosines(b, c).min() > 0.999  # packed bfloat16 against padded float32


def test_a_packed_path_the_dtype_check_refuses_is_unpacked_and_padded_judged_alone(tmp_path, caplog):
    """Packed passes its float32 gate, then fails float16's check (it overflows): the worker unpacks, says so,
    and gives the padded path its own check, which here refuses the dtype too, with the dtype's message."""
    from embedfleet.common.errors import StartupError
    from tests.tinymodels import save_float16_overflowing_bert

    folder = save_float16_overflowing_bert(str(tmp_path / "overflow"))
    with caplog.at_level(logging.INFO, logger="embedfleet.worker.engine.packed"), \
            pytest.raises(StartupError, match=r"in float16 agrees with float32 only to cosine NaN"):
        load_model(folder, device="cpu", dtype="float16", packed="on")
    said = [r.getMessage() for r in caplog.records if r.name == "embedfleet.worker.engine.packed"]
    assert said[0].endswith("forward: packed (SDPA per text; probe cosine vs padded in float32 1.000000)"), said
    assert "forward: padded: packed in float16 fails (ValueError: " in said[1], said


@pytest.mark.parametrize("packed", ["on", "off"])
def test_the_start_up_lines_say_padded_tokens_only_for_a_padded_worker(packed, bert_mean, redis_url, tmp_path):
    """A packed pass has no padding: its budget bounds real tokens, and the probe's and serving lines say so."""
    done = subprocess.run([sys.executable, "-m", "embedfleet.producer.cli", "worker", "--model", bert_mean, "--packed",
                           packed, "--probe-seconds", "0.5", "--burst", "--no-cache", "--redis-url", redis_url],
                          env=clean_env(tmp_path), capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    said = [line for line in done.stderr.splitlines() if "batch budget probe" in line or "serving model" in line]
    assert len(said) == 2, done.stderr[-3000:]
    unit = "tokens" if packed == "on" else "padded tokens"
    for line in said:
        assert re.search(rf"\b\d+ {unit}, \d+ rows", line) and ("padded" in line) == (packed == "off"), line
