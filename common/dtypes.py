"""Output dtypes and byte orders: how an embedding array is laid out in a result blob.

Storage per `embed_dtype` (numpy, before the byte order is applied):
float32 -> float32, float16 -> float16, bfloat16 -> uint16 (the top half of a float32; numpy has no
bfloat16), int8 -> int8, uint8 -> uint8, binary -> int8 and ubinary -> uint8, eight dimensions packed
per byte (sentence-transformers' `quantize_embeddings` layout), fp8_e4m3 / fp8_e5m2 -> uint8 (the bits of
torch's float8_e4m3fn / float8_e5m2, as vLLM stores them; numpy has no fp8).
"""

from __future__ import annotations

import functools
import sys

import numpy as np

_STORAGE = {
    "float32": np.dtype(np.float32),
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(np.uint16),
    "int8": np.dtype(np.int8),
    "uint8": np.dtype(np.uint8),
    "binary": np.dtype(np.int8),
    "ubinary": np.dtype(np.uint8),
    "fp8_e4m3": np.dtype(np.uint8),
    "fp8_e5m2": np.dtype(np.uint8),
}
FP8_DTYPES = ("fp8_e4m3", "fp8_e5m2")


def resolve_endianness(endianness: str) -> str:
    """'native' becomes this machine's order, so that a blob always names its real byte order."""
    return sys.byteorder if endianness == "native" else endianness


@functools.lru_cache(maxsize=64)  # asked for each result written and read
def storage_dtype(embed_dtype: str, endianness: str) -> np.dtype:
    """The numpy dtype the bytes of `embed_dtype` are stored as, in the given byte order."""
    try:
        base = _STORAGE[embed_dtype]
    except KeyError:
        raise ValueError(f"unknown embed_dtype {embed_dtype!r}: allowed are {sorted(_STORAGE)}") from None
    order = "<" if resolve_endianness(endianness) == "little" else ">"
    return base.newbyteorder(order) if base.itemsize > 1 else base


def float32_to_bfloat16_bits(values: np.ndarray) -> np.ndarray:
    """Round float32 to bfloat16 (nearest, ties to even) and return the 16 bits as uint16."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounding = ((bits >> 16) & 1) + np.uint32(0x7FFF)
    return ((bits + rounding) >> 16).astype(np.uint16)


def bfloat16_bits_to_float32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def _fp8_table(exponent_bits: int, finite_only: bool) -> np.ndarray:
    """The float32 value of each of the 256 fp8 bit patterns (sign, exponent, mantissa; IEEE-style
    subnormals). e4m3fn (`finite_only`) has no infinities: only S.1111.111 is NaN; e5m2 is IEEE."""
    mantissa_bits = 7 - exponent_bits
    bias = (1 << (exponent_bits - 1)) - 1
    codes = np.arange(256, dtype=np.int64)
    sign = np.where(codes >> 7, -1.0, 1.0)
    exponent = (codes >> mantissa_bits) & ((1 << exponent_bits) - 1)
    mantissa = codes & ((1 << mantissa_bits) - 1)
    scale = float(1 << mantissa_bits)
    values = np.where(exponent == 0, mantissa / scale * 2.0 ** (1 - bias),
                      (1 + mantissa / scale) * 2.0 ** (exponent - bias))
    top = (1 << exponent_bits) - 1
    if finite_only:
        values = np.where((exponent == top) & (mantissa == (1 << mantissa_bits) - 1), np.nan, values)
    else:
        values = np.where(exponent == top, np.where(mantissa == 0, np.inf, np.nan), values)
    return (sign * values).astype(np.float32)


_FP8_VALUES = {"fp8_e4m3": _fp8_table(4, finite_only=True), "fp8_e5m2": _fp8_table(5, finite_only=False)}


def fp8_bits_to_float32(bits: np.ndarray, embed_dtype: str) -> np.ndarray:
    """Widen stored fp8 bits (uint8) to the float32 values they encode."""
    return _FP8_VALUES[embed_dtype][np.asarray(bits, dtype=np.uint8)]


def to_bytes(array: np.ndarray, embed_dtype: str, endianness: str) -> bytes:
    """Serialise an array already in `embed_dtype`'s storage type, in the requested byte order."""
    return np.ascontiguousarray(array, dtype=storage_dtype(embed_dtype, endianness)).tobytes()


def from_bytes(data: bytes, embed_dtype: str, endianness: str, shape) -> np.ndarray:
    """The stored array, converted to native byte order (bfloat16 stays as its uint16 bits)."""
    stored = np.frombuffer(data, dtype=storage_dtype(embed_dtype, endianness)).reshape(tuple(shape))
    return stored.astype(stored.dtype.newbyteorder("="), copy=False)
