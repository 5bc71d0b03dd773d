"""A file's bytes in Redis as parts of a bounded size (common/protocol/keys.py: embedfleet:file:<id>).

No single Redis value comes near Redis's proto-max-bulk-len (512 MB by default, which a 50,000-line output
of a 1024-dimension model passes) and no process holds a whole file: a writer holds at most one part and
what it was given last, a reader one part at a time. A file is written under its staging key and RENAMEd
into place with its meta once whole, so a reader never sees half a file and a writer that dies leaves
only a staging key that expires.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import redis.asyncio as aioredis

from embedfleet.common.protocol import batchkeys


class PartWriter:
    """Bytes appended into a hash as fields part:0, part:1, ... of exactly `part_bytes` (the last shorter)."""

    def __init__(self, connection: aioredis.Redis, key: str, part_bytes: int):
        self.connection = connection
        self.key = key
        self.part_bytes = part_bytes
        self.buffer = bytearray()
        self.parts = 0
        self.size = 0

    async def start(self) -> PartWriter:
        """Drop what an earlier writer of the same key left (a retry writes the same file again)."""
        await self.connection.delete(self.key)
        return self

    async def write(self, data: bytes) -> None:
        self.buffer += data
        self.size += len(data)
        while len(self.buffer) >= self.part_bytes:
            await self._flush(self.part_bytes)

    async def close(self) -> None:
        """Write what is left (the last part)."""
        if self.buffer:
            await self._flush(len(self.buffer))

    async def _flush(self, size: int) -> None:
        part = bytes(self.buffer[:size])
        del self.buffer[:size]
        async with self.connection.pipeline(transaction=False) as pipe:
            pipe.hset(self.key, batchkeys.file_part_field(self.parts), part)
            pipe.expire(self.key, batchkeys.FILE_UPLOAD_TTL)
            await pipe.execute()
        self.parts += 1


async def read_parts(connection: aioredis.Redis, key: str) -> AsyncIterator[bytes]:
    """The bytes of the file hash at `key`, part by part; FileNotFoundError when it is gone (before or while it
    is read). A file stored before parts existed has its bytes in one `data` field; a batch input of that
    time is a string."""
    if await connection.type(key) in (b"string", "string"):
        data = await connection.get(key)
        if data is None:
            raise FileNotFoundError(key)
        yield data
        return
    meta = await connection.hget(key, "meta")
    if meta is None:
        raise FileNotFoundError(key)
    parts = json.loads(meta).get("parts")
    if parts is None:
        data = await connection.hget(key, "data")
        if data:
            yield data
        return
    for index in range(parts):
        part = await connection.hget(key, batchkeys.file_part_field(index))
        if part is None:  # the file expired or was deleted while it was read
            raise FileNotFoundError(key)
        yield part
