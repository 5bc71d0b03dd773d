"""msgpack helpers shared by every wire format here."""

from __future__ import annotations

import msgpack


def packb(obj) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def unpackb(raw: bytes):
    return msgpack.unpackb(raw, raw=False, strict_map_key=False)
