"""Result blobs: one binary value per request, a msgpack header plus the raw array bytes.

Layout: b"EFR" | version (1 byte) | header length (4 bytes, big-endian) | msgpack header | array bytes.
The header holds status, model, embed_dtype, shape, endianness, usage and error; the array bytes decode
with `numpy.frombuffer(data, common.dtypes.storage_dtype(embed_dtype, endianness)).reshape(shape)`.

Tasks other than `embed` add header keys only where they differ from embed's, so an embed blob is byte for
byte what it was and older readers still decode the rest (they ignore keys they do not know):
`task` (absent = "embed"); `parts` (token_embed and token_classify: rows per input; the array is every
input's rows back to back, shape (sum(parts), d), d = labels for token_classify); `labels` (classify and
token_classify: the label name of each column); `items` (tokenize and detokenize: one JSON-like value per
input, no array). score answers shape (n,), classify (n, labels).

Version 2 (written only for answers made of several arrays: task sparse_embed, and a request with `outputs`) adds
`sections` to the header and lays several arrays back to back in the array bytes, in the header's order; `shape`
is then (n inputs, 0). Each section is {"name", "dtype" (numpy's dtype string, byte order included: "<f4",
">i4", "<u2"...), "shape", "parts" (optional: rows or values per input)}; section k's bytes start where section
k-1's end (each is prod(shape) * itemsize long), so each decodes with
`numpy.frombuffer(data, dtype, count=prod(shape), offset=start).reshape(shape)`:

    dense           (n, d)        one vector per input, stored as `embed_dtype` (bfloat16 and fp8: their bits)
    sparse_ids      (nnz,)  int32 the token ids of each input's non-zero weights, ascending; parts: per input
    sparse_weights  (nnz,)  float32 the weights of those ids, aligned with sparse_ids; same parts
    colbert         (t, d)        every input's ColBERT token vectors back to back (`embed_dtype`); parts: per input

`vocab_size` (header) is the sparse vectors' dimension: ids run from 0 to vocab_size - 1. Version-1 readers
refuse a version-2 blob instead of misreading its bytes.
"""

from __future__ import annotations

import math
import struct
import time
from dataclasses import MISSING, dataclass, field, fields, replace
from typing import NamedTuple

import numpy as np

from embedfleet.common.codec import packb, unpackb
from embedfleet.common.dtypes import (FP8_DTYPES, bfloat16_bits_to_float32, fp8_bits_to_float32, from_bytes,
                                      resolve_endianness, to_bytes)
from embedfleet.common.errors import DecodeError, EmbedfleetError, error_from_code
from embedfleet.common.resultheader import Section, check_sections, check_task_shapes, section_fields, task_fields

MAGIC = b"EFR"
VERSION = 1
SECTIONS_VERSION = 2  # a blob with `sections` (several arrays)
_PREFIX = struct.Struct(">3sBI")


class SparseVector(NamedTuple):
    """One input's sparse vector: vocabulary ids (int32, ascending) and their weights (float32)."""

    indices: np.ndarray
    values: np.ndarray

    def to_dict(self) -> dict[int, float]:
        """{token id: weight}, FlagEmbedding's `lexical_weights` shape (its keys are strings of the ids)."""
        return {int(i): float(v) for i, v in zip(self.indices, self.values)}


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens


@dataclass(frozen=True)
class Result:
    """A finished request: embeddings (status "ok") or an error (status "error")."""

    id: str
    model: str
    status: str = "ok"
    embed_dtype: str = "float32"
    endianness: str = "little"
    shape: tuple[int, ...] = (0, 0)
    usage: Usage = field(default_factory=Usage)
    data: bytes = b""
    error_code: str | None = None
    error_message: str | None = None
    error_param: str | None = None
    finished_at: float = field(default_factory=time.time)
    task: str = "embed"
    parts: tuple[int, ...] | None = None
    labels: tuple[str, ...] = ()
    items: list | None = None
    # Late chunking: per row (input index, token start, token end, char start, char end), ends exclusive;
    # char -1 for token-id inputs. None for one row per input.
    spans: tuple[tuple[int, int, int, int, int], ...] | None = None
    sections: tuple[Section, ...] | None = None  # a version-2 blob's arrays, in the order of their bytes
    vocab_size: int | None = None  # the dimension of sparse vectors

    @classmethod
    def success(cls, request_id: str, model: str, array: np.ndarray, embed_dtype: str,
                endianness: str, prompt_tokens: int) -> Result:
        """`array` must already be in the storage type of `embed_dtype` (see common.dtypes)."""
        order = resolve_endianness(endianness)
        return cls._built(id=request_id, model=model, embed_dtype=embed_dtype, endianness=order,
                          shape=tuple(array.shape), usage=Usage(prompt_tokens),
                          data=to_bytes(array, embed_dtype, order))

    @classmethod
    def _built(cls, **values) -> Result:
        """`cls(**values)` for the worker's own values, without the frozen dataclass's __init__, which sets each
        of the 19 fields through object.__setattr__: 6.5 us a result, and a worker builds one per request (the
        rest of a one-text request's finish costs about as much). The same instance: every default, a fresh
        `finished_at` (tests/unit/test_result_built.py compares the two)."""
        result = object.__new__(cls)
        object.__setattr__(result, "__dict__", {**_DEFAULTS, "usage": _NO_USAGE, "finished_at": time.time(), **values})
        return result

    def with_task(self, task: str, *, parts=None, labels=(), items=None) -> Result:
        """This result marked as an answer of `task`, with that task's header keys."""
        return replace(self, task=task, parts=None if parts is None else tuple(int(p) for p in parts),
                       labels=tuple(labels), items=items)

    @classmethod
    def of_sections(cls, request_id: str, model: str, task: str, count: int, arrays: list, embed_dtype: str,
                    endianness: str, prompt_tokens: int, vocab_size: int | None = None) -> Result:
        """A version-2 answer for `count` inputs: `arrays` holds (name, array, parts) in the storage type each is
        kept as (dense and colbert: `embed_dtype`'s, common.dtypes), written in the requested byte order."""
        order = resolve_endianness(endianness)
        sections, chunks = [], []
        for name, array, parts in arrays:
            stored = np.ascontiguousarray(array)
            if stored.dtype.itemsize > 1:
                stored = stored.astype(stored.dtype.newbyteorder("<" if order == "little" else ">"), copy=False)
            sections.append(Section(name, stored.dtype.str, tuple(int(d) for d in stored.shape),
                                    None if parts is None else tuple(int(p) for p in parts)))
            chunks.append(stored.tobytes())
        return cls(id=request_id, model=model, embed_dtype=embed_dtype, endianness=order, shape=(count, 0),
                   usage=Usage(prompt_tokens), data=b"".join(chunks), task=task, sections=tuple(sections),
                   vocab_size=vocab_size)

    def section(self, name: str) -> np.ndarray | None:
        """A version-2 blob's array `name` in native byte order (bfloat16 / fp8 as their bits), or None."""
        start = 0
        for section in self.sections or ():
            if section.name == name:
                array = np.frombuffer(self.data, section.dtype, math.prod(section.shape), start)
                array = array.reshape(section.shape)
                return array.astype(array.dtype.newbyteorder("="), copy=False)
            start += section.nbytes
        return None

    def _parts(self, name: str) -> tuple[int, ...]:
        return next(s.parts for s in self.sections if s.name == name)

    def _widened(self, stored: np.ndarray) -> np.ndarray:
        if self.embed_dtype in FP8_DTYPES:
            return fp8_bits_to_float32(stored, self.embed_dtype)
        return bfloat16_bits_to_float32(stored) if self.embed_dtype == "bfloat16" else stored

    @property
    def sparse(self) -> list[SparseVector]:
        """task sparse_embed, or "sparse" in `outputs`: one SparseVector per input."""
        self.raise_for_error()
        ids, weights = self.section("sparse_ids"), self.section("sparse_weights")
        if ids is None or weights is None:
            raise ValueError(f"this {self.task} result holds no sparse vectors")
        ends = np.cumsum(self._parts("sparse_ids"))
        return [SparseVector(ids[end - count:end], weights[end - count:end])
                for end, count in zip(ends, self._parts("sparse_ids"))]

    @property
    def dense(self) -> np.ndarray:
        """The dense vectors of a multi-output answer (as `embeddings`), shape (n, d)."""
        self.raise_for_error()
        stored = self.section("dense") if self.sections is not None else self.stored
        if stored is None:
            raise ValueError("this result holds no dense vectors: ask for outputs including 'dense'")
        return self._widened(stored)

    @property
    def colbert(self) -> list[np.ndarray]:
        """The ColBERT vectors of a multi-output answer: one (tokens, d) array per input."""
        return self.multi_vectors

    @classmethod
    def failure(cls, request_id: str, model: str, error: EmbedfleetError) -> Result:
        return cls._built(id=request_id, model=model, status="error", error_code=error.code,
                          error_message=error.message, error_param=error.param)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def stored(self) -> np.ndarray:
        """The array exactly as stored (bfloat16 as uint16 bits, fp8 as uint8 bits), in native byte order."""
        return from_bytes(self.data, self.embed_dtype, self.endianness, self.shape)

    @property
    def embeddings(self) -> np.ndarray:
        """Shape (n, d) in native byte order; bfloat16 and fp8 widened to float32, packed bits left packed."""
        self.raise_for_error()
        if self.sections is not None:  # a multi-output answer: its dense part
            return self.dense
        return self._widened(self.stored)

    @property
    def scores(self) -> np.ndarray:
        """score: shape (n,); classify: (n, labels), probabilities (or logits without activation)."""
        return self.embeddings

    @property
    def multi_vectors(self) -> list[np.ndarray]:
        """token_embed (and a multi-output answer's colbert part): one (tokens, d) array per input."""
        if self.sections is not None:
            self.raise_for_error()
            stored = self.section("colbert")
            if stored is None:
                raise ValueError("this result holds no ColBERT vectors: ask for outputs including 'colbert'")
            rows, ends = self._widened(stored), np.cumsum(self._parts("colbert"))
            return [rows[end - count:end] for end, count in zip(ends, self._parts("colbert"))]
        rows = self.embeddings
        if self.parts is None:
            return [rows]
        ends = np.cumsum(self.parts)
        return [rows[end - count:end] for end, count in zip(ends, self.parts)]

    @property
    def error(self) -> EmbedfleetError | None:
        if self.ok:
            return None
        return error_from_code(self.error_code or "internal_error", self.error_message or "",
                               self.error_param)

    def raise_for_error(self) -> None:
        if not self.ok:
            raise self.error

    def encode(self) -> bytes:
        header = packb({
            "id": self.id, "model": self.model, "status": self.status,
            "embed_dtype": self.embed_dtype, "endianness": self.endianness, "shape": list(self.shape),
            "usage": {"prompt_tokens": self.usage.prompt_tokens},
            "error": None if self.ok else
            {"code": self.error_code, "message": self.error_message, "param": self.error_param},
            "finished_at": self.finished_at,
            **self._task_header(),
            **({"spans": [list(span) for span in self.spans]} if self.spans is not None else {}),
            **({"sections": [s.header() for s in self.sections]} if self.sections is not None else {}),
            **({"vocab_size": self.vocab_size} if self.vocab_size is not None else {}),
        })
        version = VERSION if self.sections is None else SECTIONS_VERSION
        return _PREFIX.pack(MAGIC, version, len(header)) + header + self.data

    def _task_header(self) -> dict:
        header: dict = {}
        if self.task != "embed":
            header["task"] = self.task
        if self.parts is not None:
            header["parts"] = list(self.parts)
        if self.labels:
            header["labels"] = list(self.labels)
        if self.items is not None:
            header["items"] = self.items
        return header

    @classmethod
    def decode(cls, raw: bytes) -> Result:
        try:
            magic, version, size = _PREFIX.unpack_from(raw)
            if magic != MAGIC or version not in (VERSION, SECTIONS_VERSION):
                raise ValueError(f"not a version-{VERSION} or -{SECTIONS_VERSION} result blob")
            start = _PREFIX.size
            head = unpackb(raw[start:start + size])
            error = head["error"] or {}
            result = cls(
                id=head["id"], model=head["model"], status=head["status"],
                embed_dtype=head["embed_dtype"], endianness=head["endianness"],
                shape=tuple(head["shape"]), usage=Usage(head["usage"]["prompt_tokens"]),
                data=bytes(raw[start + size:]), error_code=error.get("code"),
                error_message=error.get("message"), error_param=error.get("param"),
                finished_at=head["finished_at"], **task_fields(head),
                spans=None if head.get("spans") is None else tuple(tuple(int(v) for v in span)
                                                                  for span in head["spans"]),
                **({} if version == VERSION else section_fields(head)))
            if result.parts is not None and (sum(result.parts) != result.shape[0] or min(result.parts, default=0) < 0):
                raise ValueError(f"parts {list(result.parts)} do not add up to the {result.shape[0]} rows")
            check_task_shapes(result)
            if result.spans is not None and (len(result.spans) != result.shape[0]
                                             or any(len(span) != 5 for span in result.spans)):
                raise ValueError(f"{len(result.spans)} spans for {result.shape[0]} rows")
            if result.sections is not None:
                check_sections(result)
            elif result.ok:
                result.stored  # noqa: B018 - checks that the bytes fit the declared shape and dtype
            return result
        except Exception as exc:
            raise DecodeError(f"malformed result blob: {exc}", bytes(raw)) from exc


def inputs_answered(raw: bytes) -> int | None:
    """How many inputs a result blob answers, from its header alone (the array bytes are not copied): its
    `parts` (rows per input) where it has them, else its first dimension; None where the header does not say."""
    try:
        _magic, _version, size = _PREFIX.unpack_from(raw)
        head = unpackb(raw[_PREFIX.size:_PREFIX.size + size])
        count = len(head["parts"]) if isinstance(head.get("parts"), list) else head["shape"][0]
    except Exception:  # noqa: BLE001 - a hint for a message, never a reason to fail
        return None
    return count if type(count) is int and count > 0 else None


# Result._built's defaults: each field's own (`usage` and `finished_at`, built per result, are set there)
_DEFAULTS = {f.name: f.default for f in fields(Result) if f.default is not MISSING}
_NO_USAGE = Usage()  # frozen: one instance serves every result that says no usage
