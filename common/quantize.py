"""The integer and packed-bit casts of float32 embeddings (numpy only): the worker's `embed_dtype` casts and the
gateway's Cohere `embedding_types` both use these, so that the same floats give the same codes either way.

int8 / uint8 follow sentence-transformers' `quantize_embeddings` (256 buckets per dimension over the rows'
ranges); binary / ubinary pack `x > 0` eight dimensions per byte (binary: the packed byte minus 128).
"""

from __future__ import annotations

import numpy as np

PACKED = ("binary", "ubinary")  # one bit per dimension, eight dimensions per byte
INTEGER = ("int8", "uint8", *PACKED)


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


def quantize(vectors: np.ndarray, embed_dtype: str, ranges: np.ndarray | None = None) -> np.ndarray:
    """Float32 rows -> int8 / uint8 codes (over `ranges`, default the rows' own) or packed bits."""
    vectors = np.asarray(vectors, dtype=np.float32)
    if embed_dtype in ("int8", "uint8"):
        codes = _scalar_codes(vectors, quantization_ranges(vectors) if ranges is None else ranges)
        return codes.astype(np.uint8) if embed_dtype == "uint8" else (codes - 128).astype(np.int8)
    if embed_dtype == "ubinary":
        return np.packbits(vectors > 0, axis=-1)
    if embed_dtype == "binary":
        # sentence-transformers' signed layout: the packed byte minus 128.
        return (np.packbits(vectors > 0, axis=-1).astype(np.int16) - 128).astype(np.int8)
    raise ValueError(f"{embed_dtype!r} is no integer embed_dtype: allowed are {list(INTEGER)}")
