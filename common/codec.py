"""msgpack helpers shared by every wire format here."""

from __future__ import annotations

import msgpack


def packb(obj) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def unpackb(raw: bytes):
    return msgpack.unpackb(raw, raw=False, strict_map_key=False)


def unencodable(value) -> str | None:
    """Where `value` (text, or lists and maps of it) holds text that UTF-8, hence msgpack, cannot carry,
    described for an error message; None if all of it can. JSON's "\\ud800" decodes to such text: a lone
    surrogate."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            return f"a lone surrogate (U+{ord(value[exc.start]):04X}) at character {exc.start}"
        return None
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        found = (unencodable(key) if isinstance(key, str) else None) or unencodable(item)
        if found:
            return f"{found} of item {key!r}" if isinstance(value, list) else found
    return None


def check_text(value):
    """A pydantic validator: `value` unchanged if unencodable() finds nothing, else a ValueError."""
    found = unencodable(value)
    if found:
        raise ValueError(f"must be valid Unicode text, found {found}")
    return value
