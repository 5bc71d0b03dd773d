"""A result blob's header beyond embed's keys, read back and checked (common/result.py's docstring draws the layout):
Redis is input, so each key is checked for type before a Result holds it, and a decoded Result's tasks and sections
against its shape and bytes (`result`: the Result being decoded)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

# The numpy kinds a section may hold: floats, ints and the storage of bfloat16 / fp8 bits (Redis is input).
_SECTION_KINDS = {"f2", "f4", "i1", "u1", "u2", "i4"}


@dataclass(frozen=True)
class Section:
    """One array of a version-2 blob (common/result.py's docstring)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    parts: tuple[int, ...] | None = None

    @property
    def nbytes(self) -> int:
        return np.dtype(self.dtype).itemsize * math.prod(self.shape)

    def header(self) -> dict:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape),
                **({"parts": list(self.parts)} if self.parts is not None else {})}


def task_fields(head: dict) -> dict:
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


def section_fields(head: dict) -> dict:
    """A version-2 header's sections and vocab_size, checked for type (a version-1 blob has none)."""
    sections, vocab = head.get("sections"), head.get("vocab_size")
    if not isinstance(sections, list) or not all(isinstance(s, dict) for s in sections):
        raise ValueError("a version-2 blob needs its sections")
    built = []
    for s in sections:
        name, dtype, shape, parts = s.get("name"), s.get("dtype"), s.get("shape"), s.get("parts")
        if not (isinstance(name, str) and isinstance(dtype, str) and dtype[:1] in "<>|" and dtype[1:] in _SECTION_KINDS
                and isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)
                and (parts is None or (isinstance(parts, list) and all(type(p) is int and p >= 0 for p in parts)))):
            raise ValueError(f"section {s!r} is no (name, dtype, shape[, parts])")
        built.append(Section(name, dtype, tuple(shape), None if parts is None else tuple(parts)))
    if vocab is not None and type(vocab) is not int:
        raise ValueError("vocab_size must be an integer")
    return {"sections": tuple(built), "vocab_size": vocab}


def check_sections(result) -> None:
    """The sections fill the array bytes exactly; each one's parts cover its rows, one part per input."""
    if sum(s.nbytes for s in result.sections) != len(result.data):
        raise ValueError(f"sections of {sum(s.nbytes for s in result.sections)} bytes in {len(result.data)}")
    for s in result.sections:
        if s.parts is not None and (not s.shape or sum(s.parts) != s.shape[0] or len(s.parts) != result.shape[0]):
            raise ValueError(f"section {s.name}: parts {list(s.parts)} do not cover its {s.shape} for "
                             f"{result.shape[0]} inputs")


def check_task_shapes(result) -> None:
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
