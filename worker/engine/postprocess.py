"""After pooling: Matryoshka cut, L2 normalisation and the cast to the requested output dtype (numpy).

The order follows sentence-transformers: pool -> Dense (in the model) -> cut to `dimensions` -> normalise
(only when use_activation) -> quantise/cast. Casts return arrays in the storage type of common.dtypes.
"""

from __future__ import annotations

import numpy as np
import torch

from common.dtypes import float32_to_bfloat16_bits

_FP8 = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}


def finish(vectors: np.ndarray, dimensions: int | None, normalize: bool) -> np.ndarray:
    """Cut float32 rows to their first `dimensions` values, then L2-normalise them if asked.

    Cutting first and normalising after gives the "full vector cut to d, renormalised" a Matryoshka
    model is trained for.
    """
    out = np.asarray(vectors, dtype=np.float32)
    if dimensions is not None:
        out = out[:, :dimensions]
    if normalize:
        # torch.nn.functional.normalize's eps: a zero row stays zero instead of becoming NaN.
        norms = np.maximum(np.linalg.norm(out, axis=-1, keepdims=True), 1e-12)
        out = out / norms
    return np.ascontiguousarray(out, dtype=np.float32)


def quantization_ranges(vectors: np.ndarray) -> np.ndarray:
    """The (2, dim) per-dimension [min; max] ranges int8/uint8 use for one request.

    With two or more rows these are the min and max over the request's own rows, which is exactly what
    `sentence_transformers.quantization.quantize_embeddings(rows, precision)` computes when given no
    calibration set: the output equals that call. A single row has no spread to measure (ST refuses it),
    so it gets the symmetric range [-a, a] in every dimension, a = the row's largest absolute value.
    Either way the codes are relative to the request: compare int8 vectors only within one request, or
    send the whole corpus in one request.
    """
    vectors = np.asarray(vectors, dtype=np.float32)
    if vectors.shape[0] >= 2:
        return np.vstack((vectors.min(axis=0), vectors.max(axis=0)))
    bound = float(np.abs(vectors).max()) if vectors.size else 1.0
    bound = bound or 1.0
    width = vectors.shape[-1]
    return np.vstack((np.full(width, -bound, np.float32), np.full(width, bound, np.float32)))


def _scalar_codes(vectors: np.ndarray, ranges: np.ndarray) -> np.ndarray:
    """quantize_embeddings' 256 buckets per dimension: floor((x - min) / step), clipped to 0..255."""
    ranges = ranges.astype(np.float32, copy=False)
    starts = ranges[0, :]
    steps = (ranges[1, :] - starts) / 255
    steps = np.where(steps == 0, 1, steps)
    return np.clip(np.floor((vectors - starts) / steps), 0, 255)


def cast(vectors: np.ndarray, embed_dtype: str, ranges: np.ndarray | None = None) -> np.ndarray:
    """Float32 rows -> the storage array of `embed_dtype` (see common.dtypes for the layouts)."""
    vectors = np.asarray(vectors, dtype=np.float32)
    if embed_dtype == "float32":
        return vectors
    if embed_dtype == "float16":
        with np.errstate(over="ignore"):  # beyond float16's range is inf, as IEEE rounding says
            return vectors.astype(np.float16)
    if embed_dtype == "bfloat16":
        return float32_to_bfloat16_bits(vectors)
    if embed_dtype in ("int8", "uint8"):
        codes = _scalar_codes(vectors, quantization_ranges(vectors) if ranges is None else ranges)
        return codes.astype(np.uint8) if embed_dtype == "uint8" else (codes - 128).astype(np.int8)
    if embed_dtype in _FP8:
        # torch's cast, as vLLM does it: round to nearest even; beyond the format's range (448 for e4m3,
        # 57344 for e5m2) is NaN / inf, which only unnormalised outputs can reach.
        return torch.tensor(vectors).to(_FP8[embed_dtype]).view(torch.uint8).numpy()
    if embed_dtype == "ubinary":
        return np.packbits(vectors > 0, axis=-1)
    if embed_dtype == "binary":
        # sentence-transformers' signed layout: the packed byte minus 128.
        return (np.packbits(vectors > 0, axis=-1).astype(np.int16) - 128).astype(np.int8)
    raise ValueError(f"unknown embed_dtype {embed_dtype!r}")
