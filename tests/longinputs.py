"""Long inputs of a tiny BERT (max length MAX_LEN) that the worker embeds in chunks: the `long_model` fixture
(registered for every test module by tests/conftest.py), texts of an exact token count, and the reference
chunked and combined by hand with sentence-transformers. torch loads only when a test uses them."""

from __future__ import annotations

import random

import numpy as np
import pytest

from tests.tinymodels import WORDS, save_tiny_bert, st_reference, wrap_sentence_transformers

MAX_LEN = 32  # the tiny model's max length: 7x of it is still a fast test


@pytest.fixture(scope="module")
def long_model(tmp_path_factory):
    """Tiny BERT, mean pooling, Normalize, max length 32; the worker's model allows 8x that in chunks."""
    from embedfleet.worker.engine.models.loader import load_model

    folder = wrap_sentence_transformers(save_tiny_bert(str(tmp_path_factory.mktemp("long"))), "mean",
                                        normalize=True, max_seq_length=MAX_LEN)
    return folder, load_model(folder, served_name="long", max_embed_len=8 * MAX_LEN)


def words(tokens: int, seed: int = 0) -> str:
    """A text of exactly `tokens` tokens with the special ones ([CLS], [SEP]): every word is one token."""
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(tokens - 2))


def hand_reference(folder: str, text: str, max_len: int = MAX_LEN) -> tuple[np.ndarray, int]:
    """Chunk by hand (content tokens in runs of max_len - 2, each as [CLS] run [SEP]), embed each chunk with
    sentence-transformers (its modules up to Normalize), token-count-weighted mean, normalise. Also returns
    the tokens of all chunks."""
    import torch

    model = st_reference(folder, drop_normalize=True)
    tokenizer = model.tokenizer
    content = tokenizer(text, add_special_tokens=False)["input_ids"]
    room = max_len - 2
    chunks = [[tokenizer.cls_token_id, *content[i:i + room], tokenizer.sep_token_id]
              for i in range(0, len(content), room)]
    vectors = []
    for ids in chunks:
        features = {"input_ids": torch.tensor([ids]), "attention_mask": torch.ones(1, len(ids), dtype=torch.long),
                    "token_type_ids": torch.zeros(1, len(ids), dtype=torch.long)}
        with torch.no_grad():
            vectors.append(model(features)["sentence_embedding"][0].double().numpy())
    weights = np.array([len(ids) for ids in chunks], np.float64)
    mean = (np.stack(vectors) * weights[:, None]).sum(0) / weights.sum()
    return mean / np.linalg.norm(mean), int(weights.sum())


def cosine(a, b) -> float:
    return float(np.dot(a, b) / np.linalg.norm(a) / np.linalg.norm(b))
