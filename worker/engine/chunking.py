"""Long inputs in chunks (vLLM's chunked processing): cut token ids into model-length chunks, each with the
special tokens a single sequence gets, and combine the pooled chunk vectors into one per input by a
token-count-weighted mean. Pure: numpy only, no tokenizer, no model.

What the combined vector is: the weighted mean of what the model gives each chunk alone (pooling and any
Dense layer, before normalisation), normalised afterwards as the model would be. For a mean-pooling model
without Dense layers that is the mean over every token of every chunk, each token having seen only its own
chunk; it is not the vector a model with a longer context would give the whole text.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Specials:
    """The special tokens a tokenizer puts around one sequence (e.g. [CLS] ... [SEP], or ... <eos>)."""

    prefix: tuple[int, ...] = ()
    suffix: tuple[int, ...] = ()

    @property
    def count(self) -> int:
        return len(self.prefix) + len(self.suffix)


def find_specials(with_specials: list[int], content: list[int]) -> Specials | None:
    """Where `content` (the input tokenised without special tokens) sits inside `with_specials`; None
    if it does not sit there whole (a tokenizer whose post-processing changes the content itself)."""
    extra = len(with_specials) - len(content)
    if extra < 0:
        return None
    for start in range(extra + 1):
        if with_specials[start:start + len(content)] == content:
            return Specials(tuple(with_specials[:start]), tuple(with_specials[start + len(content):]))
    return None


def split(content: list[int], max_len: int, specials: Specials = Specials()) -> list[list[int]]:
    """`content` cut into chunks of at most `max_len` tokens, each wrapped in `specials`, in order."""
    room = max_len - specials.count
    if room < 1:
        raise ValueError(f"a chunk of {max_len} tokens leaves no room next to {specials.count} special tokens")
    prefix, suffix = list(specials.prefix), list(specials.suffix)
    return [prefix + content[start:start + room] + suffix for start in range(0, len(content), room)]


def combine(vectors: np.ndarray, owners: list[int], weights: list[int], count: int) -> np.ndarray:
    """Rows of `vectors` (one per chunk) -> `count` rows: row i is the mean of the chunks whose owner is
    i, each weighted by its entry in `weights` (its token count)."""
    vectors = np.asarray(vectors, dtype=np.float64)
    owner = np.asarray(owners, dtype=np.int64)
    weight = np.asarray(weights, dtype=np.float64)[:, None]
    sums = np.zeros((count, vectors.shape[1]), np.float64)
    np.add.at(sums, owner, vectors * weight)
    totals = np.bincount(owner, weights=weight[:, 0], minlength=count)[:, None]
    return (sums / np.maximum(totals, 1e-12)).astype(np.float32)
