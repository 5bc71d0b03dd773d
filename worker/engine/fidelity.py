"""Reduced precision only where it holds: a model served in float16/bfloat16 must agree with float32.

bfloat16 runs ~1.5x faster than float32 on CPUs with AVX512-BF16/AMX, and half precision is the norm on
GPUs, but some checkpoints lose accuracy in it. The check embeds a few probe texts in float32, casts the
transformer, embeds them again, and refuses to serve below MIN_COSINE.
"""

from __future__ import annotations

import torch

PROBE_TEXTS = (
    "The quick brown fox jumps over the lazy dog.",
    "Return the number of items in the container.",
    "Embeddings map text to vectors so that similar meanings lie close together.",
    "Paris is the capital of France.",
    "def add(a, b):\n    return a + b",
    "A very long sentence that keeps going, with commas, clauses and numbers like 3.14159 and 2026, "
    "to exercise more positions of the model than the short probes do.",
    "x",
)
MIN_COSINE = 0.999


def cast_with_fidelity_check(model, dtype: torch.dtype, min_cosine: float = MIN_COSINE) -> float:
    """Cast `model.module` (a LoadedModel's, in float32) to `dtype`; returns the lowest probe cosine.

    Raises ValueError, leaving the module in float32, when reduced precision falls below `min_cosine`.
    """
    limit = model.caps.max_model_len
    ids = [model.tokenizer(text, truncation=True, max_length=limit)["input_ids"] for text in PROBE_TEXTS]
    reference = model.embed(ids)
    model.module.to(dtype)
    reduced = model.embed(ids)
    cosine = torch.nn.functional.cosine_similarity(reference, reduced).min().item()
    if cosine < min_cosine:
        model.module.to(torch.float32)
        raise ValueError(f"model '{model.caps.name}' in {str(dtype).removeprefix('torch.')} agrees with "
                         f"float32 only to cosine {cosine:.5f} on the probe texts (at least {min_cosine} is "
                         "required): serve it in float32 (--dtype float32)")
    return cosine
