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
"""

from __future__ import annotations

import struct
import time
from dataclasses import dataclass, field, replace

import numpy as np

from common.protocol import keys
from common.codec import packb, unpackb
from common.dtypes import (FP8_DTYPES, bfloat16_bits_to_float32, fp8_bits_to_float32, from_bytes,
                           resolve_endianness, to_bytes)
from common.errors import DecodeError, EmbedfleetError, error_from_code

MAGIC = b"EFR"
VERSION = 1
_PREFIX = struct.Struct(">3sBI")


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

    @classmethod
    def success(cls, request_id: str, model: str, array: np.ndarray, embed_dtype: str,
                endianness: str, prompt_tokens: int) -> Result:
        """`array` must already be in the storage type of `embed_dtype` (see common.dtypes)."""
        order = resolve_endianness(endianness)
        return cls(id=request_id, model=model, embed_dtype=embed_dtype, endianness=order,
                   shape=tuple(array.shape), usage=Usage(prompt_tokens),
                   data=to_bytes(array, embed_dtype, order))

    def with_task(self, task: str, *, parts=None, labels=(), items=None) -> Result:
        """This result marked as an answer of `task`, with that task's header keys."""
        return replace(self, task=task, parts=None if parts is None else tuple(int(p) for p in parts),
                       labels=tuple(labels), items=items)

    @classmethod
    def failure(cls, request_id: str, model: str, error: EmbedfleetError) -> Result:
        return cls(id=request_id, model=model, status="error", error_code=error.code,
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
        stored = self.stored
        if self.embed_dtype in FP8_DTYPES:
            return fp8_bits_to_float32(stored, self.embed_dtype)
        return bfloat16_bits_to_float32(stored) if self.embed_dtype == "bfloat16" else stored

    @property
    def scores(self) -> np.ndarray:
        """score: shape (n,); classify: (n, labels), probabilities (or logits without activation)."""
        return self.embeddings

    @property
    def multi_vectors(self) -> list[np.ndarray]:
        """token_embed: one (tokens, d) array per input."""
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
        })
        return _PREFIX.pack(MAGIC, VERSION, len(header)) + header + self.data

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
            if magic != MAGIC or version != VERSION:
                raise ValueError(f"not a version-{VERSION} result blob")
            start = _PREFIX.size
            head = unpackb(raw[start:start + size])
            error = head["error"] or {}
            result = cls(
                id=head["id"], model=head["model"], status=head["status"],
                embed_dtype=head["embed_dtype"], endianness=head["endianness"],
                shape=tuple(head["shape"]), usage=Usage(head["usage"]["prompt_tokens"]),
                data=bytes(raw[start + size:]), error_code=error.get("code"),
                error_message=error.get("message"), error_param=error.get("param"),
                finished_at=head["finished_at"], **_task_fields(head),
                spans=None if head.get("spans") is None else tuple(tuple(int(v) for v in span)
                                                                  for span in head["spans"]))
            if result.parts is not None and (sum(result.parts) != result.shape[0] or min(result.parts, default=0) < 0):
                raise ValueError(f"parts {list(result.parts)} do not add up to the {result.shape[0]} rows")
            _check_task_shapes(result)
            if result.spans is not None and (len(result.spans) != result.shape[0]
                                             or any(len(span) != 5 for span in result.spans)):
                raise ValueError(f"{len(result.spans)} spans for {result.shape[0]} rows")
            if result.ok:
                result.stored  # noqa: B018 - checks that the bytes fit the declared shape and dtype
            return result
        except Exception as exc:
            raise DecodeError(f"malformed result blob: {exc}", bytes(raw)) from exc


def _task_fields(head: dict) -> dict:
    """The task header keys, checked for type: Redis is input."""
    task, parts = head.get("task", "embed"), head.get("parts")
    labels, items = head.get("labels", []), head.get("items")
    if not isinstance(task, str):
        raise ValueError(f"task must be a string, got {task!r}")
    if parts is not None and not (isinstance(parts, list) and all(type(p) is int for p in parts)):
        raise ValueError("parts must be a list of integers")
    if not (isinstance(labels, list) and all(isinstance(label, str) for label in labels)):
        raise ValueError("labels must be a list of strings")
    if items is not None and not isinstance(items, list):
        raise ValueError("items must be a list")
    return {"task": task, "parts": None if parts is None else tuple(parts), "labels": tuple(labels),
            "items": items}


def _check_task_shapes(result: Result) -> None:
    """Labels name the columns, items answer the inputs one each (tokenize: ids, tokens, special flags and
    offsets of one length): what readers index without further checks."""
    if result.labels and (len(result.shape) != 2 or len(result.labels) != result.shape[1]):
        raise ValueError(f"{len(result.labels)} labels for an array of shape {list(result.shape)}")
    if result.items is None:
        return
    if not result.shape or len(result.items) != result.shape[0]:
        raise ValueError(f"{len(result.items)} items for {result.shape[0] if result.shape else 0} inputs")
    for item in result.items:
        if result.task == "detokenize" and not isinstance(item, str):
            raise ValueError("a detokenize item must be a string")
        if result.task == "tokenize":
            ids, tokens, special = (item.get(k) if isinstance(item, dict) else None
                                    for k in ("ids", "tokens", "special"))
            offsets = item.get("offsets")
            if not (isinstance(ids, list) and all(type(i) is int for i in ids)
                    and isinstance(tokens, list) and all(isinstance(t, str) for t in tokens)
                    and isinstance(special, list) and all(isinstance(f, bool) for f in special)
                    and len(ids) == len(tokens) == len(special)
                    and (offsets is None or (isinstance(offsets, list) and len(offsets) == len(ids) and all(
                        isinstance(o, list) and len(o) == 2 and all(type(v) is int for v in o) for o in offsets)))):
                raise ValueError("a tokenize item must hold ids, tokens, special flags (and offsets) of one length")


def publish(pipe, result: Result, ttl: int, reply_to: str | None = None, only_if_absent: bool = False) -> None:
    """Queue on a Redis pipeline what makes a result visible: the blob, a wake-up on the request's notify
    list (BLPOP waiters) and, for an AsyncProducer's request, an entry on its reply stream. A gateway
    job's answer options (keys.job_options_key), if any, now expire with the result."""
    pipe.set(keys.result_key(result.id), result.encode(), ex=ttl, nx=only_if_absent)
    pipe.rpush(keys.notify_key(result.id), 1)
    pipe.expire(keys.notify_key(result.id), ttl)
    pipe.expire(keys.job_options_key(result.id), ttl)  # a gateway job's options go with its result
    if reply_to:
        pipe.xadd(reply_to, {"id": result.id}, maxlen=keys.REPLY_STREAM_MAXLEN, approximate=True)
        pipe.expire(reply_to, ttl)
