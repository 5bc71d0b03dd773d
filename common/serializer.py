"""An rq serializer on msgpack, so that job payloads are msgpack end to end (never pickle)."""

from __future__ import annotations

from embedfleet.common.codec import packb, unpackb


class MsgpackSerializer:
    """rq calls `dumps`/`loads` for job data, meta and return values; tuples come back as lists."""

    @staticmethod
    def dumps(obj) -> bytes:
        return packb(obj)

    @staticmethod
    def loads(raw: bytes):
        return unpackb(raw)
