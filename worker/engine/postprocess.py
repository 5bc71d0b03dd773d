"""After pooling: Matryoshka cut, L2 normalisation and the cast to the requested output dtype (numpy).

The order follows sentence-transformers: pool -> Dense (in the model) -> cut to `dimensions` -> normalise
(only when use_activation) -> quantise/cast. Casts return arrays in the storage type of common.dtypes.
"""

from __future__ import annotations

import numpy as np

from embedfleet.common.dtypes import float32_to_bfloat16_bits
from embedfleet.common.quantize import INTEGER, quantize

_FP8 = {"fp8_e4m3": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2"}  # embed_dtype -> torch's dtype
_BY_VALUE = ("float32", "float16", "bfloat16")  # casts of one value at a time, whatever rows are beside it


def cut_and_normalise(vectors: np.ndarray, dimensions: int | None, normalize: bool) -> np.ndarray:
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
    if embed_dtype in INTEGER:
        return quantize(vectors, embed_dtype, ranges)
    if embed_dtype in _FP8:
        # torch's cast, as vLLM does it: round to nearest even; beyond the format's range (448 for e4m3,
        # 57344 for e5m2) is NaN / inf, which only unnormalised outputs can reach.
        import torch  # noqa: PLC0415 - only these casts need it: a null-model worker loads torch for them alone

        return torch.tensor(vectors).to(getattr(torch, _FP8[embed_dtype])).view(torch.uint8).numpy()
    raise ValueError(f"unknown embed_dtype {embed_dtype!r}")


def finish_together(groups: list[np.ndarray], dimensions: int | None, normalize: bool,
                    embed_dtype: str) -> list[np.ndarray]:
    """`cast(cut_and_normalise(rows, dimensions, normalize), embed_dtype)` of each array of rows (a request's),
    computed over all of them at once: the same values (both work row by row), one numpy call for a round in
    place of one per request. int8 and uint8 scale by each request's own ranges: cast apart."""
    final = cut_and_normalise(np.concatenate(groups) if len(groups) > 1 else groups[0], dimensions, normalize)
    together = embed_dtype in _BY_VALUE
    stored = cast(final, embed_dtype) if together else final
    out, offset = [], 0
    for rows in groups:
        mine = stored[offset:offset + len(rows)]
        out.append(mine if together else cast(mine, embed_dtype))
        offset += len(rows)
    return out
