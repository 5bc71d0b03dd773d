"""Reduced precision only where it holds: a model served in float16/bfloat16, or on another engine (ONNX
Runtime, OpenVINO, int8), must agree with float32 torch.

bfloat16 runs ~1.5x faster than float32 on CPUs with AVX512-BF16/AMX, and half precision is the norm on
GPUs, but some checkpoints lose accuracy in it. The check embeds a few probe texts in float32, casts the
transformer (or hands it to the engine), embeds them again, and refuses to serve below the gate.
"""

from __future__ import annotations

import math

import torch

from embedfleet.common.errors import StartupError

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
    ids = probe_token_lists(model)
    reference = model.embed(ids)
    model.module.to(dtype)
    reduced = model.embed(ids)
    cosine = torch.nn.functional.cosine_similarity(reference, reduced).min().item()
    if not cosine >= min_cosine:  # NaN (an overflow) fails too
        model.module.to(torch.float32)
        raise ValueError(f"model '{model.caps.name}' in {str(dtype).removeprefix('torch.')} agrees with "
                         f"float32 only to {_cosine(cosine, 5)} on the probe texts (at least {min_cosine} is "
                         "required): serve it in float32 (--dtype float32)")
    return cosine


def _cosine(cosine: float, digits: int) -> str:
    """A gate's finding: the cosine, or what a NaN one means (the reduced path's vectors are not finite)."""
    return "cosine NaN: its vectors overflow (inf or NaN)" if math.isnan(cosine) else f"cosine {cosine:.{digits}f}"


def probe_token_lists(model) -> list[list[int]]:
    """The probe texts as the model's token ids (truncated to its max length)."""
    limit = model.caps.max_model_len
    return [model.tokenizer(text, truncation=True, max_length=limit)["input_ids"] for text in PROBE_TEXTS]


def engine_fidelity(model, backend, min_cosine: float, engine: str) -> float:
    """Hand `model` (a float32 torch LoadedModel) `backend` as its transformer; returns the lowest probe
    cosine against float32 torch (pooled and projected, before normalisation).

    Raises StartupError, leaving the model on torch, when the engine falls below `min_cosine`.
    """
    ids = probe_token_lists(model)
    reference = model.embed(ids)
    model.backend = backend
    cosine = torch.nn.functional.cosine_similarity(reference, model.embed(ids)).min().item()
    if not cosine >= min_cosine:  # NaN (an overflow) fails too
        model.backend = None
        raise StartupError(f"model '{model.caps.name}' on --engine {engine} agrees with float32 torch only to "
                           f"{_cosine(cosine, 6)} on the probe texts (the gate is {min_cosine}; --fidelity-gate "
                           "sets it): serve it with --engine torch, or delete a broken export")
    return cosine
