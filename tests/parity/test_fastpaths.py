"""Fast paths keep fidelity: the attention kernel the worker serves with (SDPA) against eager attention, and
reduced precision (bfloat16) against sentence-transformers in float32, on real corpus texts incl. long ones."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AutoModel

from embedfleet.common.request import EmbedRequest
from tests.realtexts import corpus_texts
from embedfleet.worker.engine.engine import Engine
from embedfleet.worker.engine.models.loader import load_model


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


@pytest.fixture(scope="module")
def texts() -> list[str]:
    return corpus_texts()[:48]


@pytest.fixture(scope="module")
def reference(minilm_path, texts) -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(minilm_path, device="cpu").encode(texts, batch_size=16, convert_to_numpy=True)


def embed(engine: Engine, texts: list[str]) -> np.ndarray:
    request = EmbedRequest(model=engine.caps.name, inputs=texts, params={"truncate_prompt_tokens": -1})
    return engine.run([request])[0].embeddings


def test_the_served_attention_kernel_matches_eager_attention(minilm_path, minilm_engine, texts, reference):
    assert minilm_engine.model.module.config._attn_implementation == "sdpa"  # what the worker serves with
    eager = load_model(minilm_path, served_name="minilm")
    eager.module = AutoModel.from_pretrained(eager.module.config._name_or_path, attn_implementation="eager",
                                             dtype=torch.float32).eval()
    served = embed(minilm_engine, texts)
    assert cosines(served, embed(Engine(eager, max_batch_tokens=2048), texts)).min() >= 0.99999
    assert cosines(served, reference).min() >= 0.99999


def test_bfloat16_stays_within_its_bound(minilm_path, texts, reference):
    reduced = Engine(load_model(minilm_path, served_name="minilm", dtype="bfloat16"), max_batch_tokens=2048)
    assert str(next(reduced.model.module.parameters()).dtype) == "torch.bfloat16"
    assert cosines(embed(reduced, texts), reference).min() >= 0.9999
