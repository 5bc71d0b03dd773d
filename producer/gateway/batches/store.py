"""Files and batches in Redis: every read and write of the Batch API's keys (common/protocol/keys.py).

Status changes, collected lines and leases go through the protocol's Lua scripts (common/protocol/scripts/
batch*.lua), so that a change is checked against the state it changes (a cancel cannot be overwritten by a
runner's `completed`; a line is counted once) and, for a runner, against its lease: a replica that lost its
lease writes nothing.

On a Redis Cluster (`clustered`) each file's and each batch's keys are one slot of their own (batchkeys.own_tag), the
indexes another: a transaction holds one object's keys and the index is written after it (a listing drops ids
whose object is gone; a runner forgets an ended batch it finds active), a batch's input is copied part by part
(COPY cannot cross slots), and an ending batch leaves the active index in a second step. On a plain Redis every
command is as it was.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator

import redis
import redis.asyncio as aioredis

from embedfleet.common.protocol import batchkeys, scripts
from embedfleet.producer.gateway.batches.parts import PartWriter, read_parts

MAX_LISTED = 10_000  # ids one listing reads (OpenAI's own cap on a file listing's page)
LINES_PER_READ = 256  # collected lines one read of an output file takes (a few MB at most)


class LeaseLost(Exception):
    """This replica's lease on a batch lapsed (another may drive it now): the runner stops writing."""


class BatchGone(Exception):
    """The batch expired or was deleted while it ran."""


def _text(raw) -> str:
    return raw.decode() if isinstance(raw, bytes) else raw


class Store:
    """The Batch API's Redis reads and writes, on one asyncio connection (the gateway's default Redis);
    `clustered`: that Redis is a Redis Cluster."""

    def __init__(self, connection: aioredis.Redis, clustered: bool = False):
        self.connection = connection
        self.clustered = clustered

    def file_key(self, file_id: str) -> str:
        return batchkeys.file_key(file_id, self.clustered)

    def batch_key(self, batch_id: str) -> str:
        return batchkeys.batch_key(batch_id, self.clustered)

    def input_key(self, batch_id: str) -> str:
        return batchkeys.batch_input_key(batch_id, self.clustered)

    def lines_key(self, batch_id: str) -> str:
        return batchkeys.batch_lines_key(batch_id, self.clustered)

    def lease_key(self, batch_id: str) -> str:
        return batchkeys.batch_lease_key(batch_id, self.clustered)

    # -- files ------------------------------------------------------------------------------------
    def file_writer(self, file_id: str, part_bytes: int) -> PartWriter:
        """A writer of the file's bytes, part by part, under its staging key (commit_file puts it in place)."""
        return PartWriter(self.connection, batchkeys.file_upload_key(file_id, self.clustered), part_bytes)

    async def commit_file(self, meta: dict, writer: PartWriter, ttl: int) -> None:
        """The written file in place with its meta (`bytes` and `parts` from the writer), listed."""
        await writer.close()
        meta = {**meta, "bytes": writer.size, "parts": writer.parts}
        key = self.file_key(meta["id"])
        async with self.connection.pipeline(transaction=True) as pipe:
            pipe.hset(writer.key, "meta", json.dumps(meta))
            pipe.execute_command("RENAME", writer.key, key)  # redis-py's cluster pipeline blocks its rename()
            pipe.expire(key, ttl)
            if not self.clustered:
                _index_file(pipe, meta["id"])
            await pipe.execute()
        if self.clustered:  # the index is another slot: listed once the file is in place
            async with self.connection.pipeline(transaction=False) as pipe:
                _index_file(pipe, meta["id"])
                await pipe.execute()

    async def discard(self, writer: PartWriter) -> None:
        await self.connection.delete(writer.key)

    def file_parts(self, file_id: str) -> AsyncIterator[bytes]:
        """The file's bytes part by part (parts.read_parts: FileNotFoundError once it is gone)."""
        return read_parts(self.connection, self.file_key(file_id))

    async def file_meta(self, file_id: str) -> dict | None:
        raw = await self.connection.hget(self.file_key(file_id), "meta")
        return json.loads(raw) if raw else None

    async def delete_file(self, file_id: str) -> None:
        if self.clustered:  # two slots: the file goes first (an index member without its file is dropped)
            await self.connection.delete(self.file_key(file_id))
            await self.connection.zrem(batchkeys.FILES_KEY, file_id)
            return
        async with self.connection.pipeline(transaction=True) as pipe:
            pipe.delete(batchkeys.file_key(file_id))
            pipe.zrem(batchkeys.FILES_KEY, file_id)
            await pipe.execute()

    async def list_files(self) -> list[dict]:
        """Every stored file's meta, oldest first (ids whose file expired are dropped from the index)."""
        return await self._listed(batchkeys.FILES_KEY, self.file_key, "meta")

    # -- batches ----------------------------------------------------------------------------------
    async def create_batch(self, meta: dict) -> bool:
        """The batch, with a copy of its input file made in Redis (no byte of it passes through here);
        False when the input file is gone."""
        batch_id, created = meta["id"], _ms()  # created_at is whole seconds: the index orders by ms
        key = self.batch_key(batch_id)
        if not await self._copy_input(meta["input_file_id"], batch_id):
            return False
        async with self.connection.pipeline(transaction=True) as pipe:
            pipe.hset(key, mapping={"meta": json.dumps(meta), "status": "validating", "total": 0,
                                    "completed": 0, "failed": 0, "input_tokens": 0})
            pipe.expire(key, batchkeys.BATCH_TTL)
            pipe.expire(self.input_key(batch_id), batchkeys.BATCH_TTL)
            if not self.clustered:
                _index_batch(pipe, batch_id, created)
            await pipe.execute()
        if self.clustered:  # the indexes are another slot: the batch is whole before a runner can claim it
            async with self.connection.pipeline(transaction=False) as pipe:
                _index_batch(pipe, batch_id, created)
                await pipe.execute()
        return True

    async def _copy_input(self, file_id: str, batch_id: str) -> bool:
        """The file's hash copied to the batch's input (False when the file is gone). On a Redis Cluster the two
        are in different slots: copied part by part (one part held at a time), its meta last, so that a copy
        cut short reads as a missing input."""
        source, target = self.file_key(file_id), self.input_key(batch_id)
        if not self.clustered:
            return bool(await self.connection.copy(source, target, replace=True))
        meta = await self.connection.hget(source, "meta")
        await self.connection.delete(target)
        try:
            index = 0
            async for part in read_parts(self.connection, source):
                async with self.connection.pipeline(transaction=True) as pipe:
                    pipe.hset(target, batchkeys.file_part_field(index), part)
                    pipe.expire(target, batchkeys.FILE_UPLOAD_TTL)
                    await pipe.execute()
                index += 1
        except FileNotFoundError:
            await self.connection.delete(target)
            return False
        await self.connection.hset(target, "meta", meta)
        return True

    async def batch(self, batch_id: str) -> dict | None:
        """The batch's hash as text fields (`meta` parsed), or None."""
        raw = await self.connection.hgetall(self.batch_key(batch_id))
        return _batch(raw) if raw else None

    async def list_batches(self) -> list[dict]:
        return await self._listed(batchkeys.BATCHES_KEY, self.batch_key, None)

    def input_parts(self, batch_id: str) -> AsyncIterator[bytes]:
        """The batch's input file, part by part (FileNotFoundError once it is gone)."""
        return read_parts(self.connection, self.input_key(batch_id))

    async def transition(self, batch_id: str, before: tuple[str, ...], after: str, *, token: str = "",
                         end: bool = False, **fields) -> str | None:
        """Set status `after` (and `fields`) if the status is one of `before`: None when changed, else the
        status found. With `token`, only while that lease holds (else LeaseLost). `end`: the batch leaves
        the active set and its work keys (input, lines, lease) go."""
        work = [self.input_key(batch_id), self.lines_key(batch_id)] if end else []
        pairs = [x for name, value in fields.items() for x in (name, value)]
        # on a Redis Cluster the active index is another slot: the script gets a stand-in of the batch's slot
        # (an absent key: its ZREM does nothing) and the batch leaves the index once it ended (a replica that
        # dies between finds it ended and forgets it: Runner's Drive.run)
        active = self.batch_key(batch_id) + ":active" if self.clustered else batchkeys.ACTIVE_BATCHES_KEY
        reply = await scripts.BATCH_TRANSITION.run_async(
            self.connection, [self.batch_key(batch_id), active, self.lease_key(batch_id), *work],
            [batch_id, token, " ".join(before), after, "1" if end else "0", *pairs])
        code = int(reply[0])
        if code == 1 and end and self.clustered:
            await self.forget(batch_id)
        if code == -1:
            raise LeaseLost(batch_id)
        if code == -2:
            raise BatchGone(batch_id)
        return None if code == 1 else _text(reply[1])

    async def forget(self, batch_id: str) -> None:
        """Take an ended (or vanished) batch out of the active set."""
        await self.connection.zrem(batchkeys.ACTIVE_BATCHES_KEY, batch_id)

    async def active(self) -> list[str]:
        return [_text(i) for i in await self.connection.zrange(batchkeys.ACTIVE_BATCHES_KEY, 0, MAX_LISTED - 1)]

    # -- a runner's lease and its collected lines --------------------------------------------------
    async def claim(self, batch_id: str, token: str, lease: float) -> bool:
        return bool(await self.connection.set(self.lease_key(batch_id), token, nx=True,
                                              px=int(lease * 1000)))

    async def renew(self, batch_id: str, token: str, lease: float) -> bool:
        return bool(await scripts.BATCH_LEASE.run_async(self.connection, [self.lease_key(batch_id)],
                                                         [token, int(lease * 1000), "1"]))

    async def release(self, batch_id: str, token: str) -> None:
        await scripts.BATCH_LEASE.run_async(self.connection, [self.lease_key(batch_id)], [token, 0, "0"])

    async def collect(self, batch_id: str, token: str, lines: list[tuple[int, bool, int, bytes]]) -> int:
        """Record lines (index, ok, prompt tokens, the output line) not recorded yet; returns how many were
        new. Raises LeaseLost / BatchGone (nothing written)."""
        args: list = [token]
        for index, ok, tokens, line in lines:
            args += [index, "completed" if ok else "failed", tokens, (b"1" if ok else b"0") + line]
        added = int(await scripts.BATCH_COLLECT.run_async(
            self.connection, [self.lease_key(batch_id), self.lines_key(batch_id), self.batch_key(batch_id)],
            args))
        if added == -1:
            raise LeaseLost(batch_id)
        if added == -2:
            raise BatchGone(batch_id)
        return added

    async def collected(self, batch_id: str) -> set[int]:
        return {int(i) for i in await self.connection.hkeys(self.lines_key(batch_id))}

    async def lines(self, batch_id: str, total: int) -> AsyncIterator[tuple[bool, bytes]]:
        """Each collected line in order, a few hundred per read: whether it was answered with a 2xx (the output
        file) or not (the error file), and the line."""
        for start in range(0, total, LINES_PER_READ):
            found = await self.connection.hmget(self.lines_key(batch_id),
                                                list(range(start, min(start + LINES_PER_READ, total))))
            for value in found:
                if value is not None:
                    yield value[:1] == b"1", value[1:]

    async def answers(self) -> bool:
        """Whether Redis answers now (a write that failed while it does failed for what it wrote)."""
        try:
            return bool(await self.connection.ping())
        except (redis.RedisError, OSError):
            return False

    # -- listings ---------------------------------------------------------------------------------
    async def _listed(self, index: str, key_of, field: str | None) -> list[dict]:
        ids = [_text(i) for i in await self.connection.zrange(index, -MAX_LISTED, -1)]
        async with self.connection.pipeline(transaction=False) as pipe:
            for i in ids:
                pipe.hget(key_of(i), field) if field else pipe.hgetall(key_of(i))
            found = await pipe.execute()
        gone = [i for i, raw in zip(ids, found) if not raw]
        if gone:
            await self.connection.zrem(index, *gone)
        if field:
            return [json.loads(raw) for raw in found if raw]
        return [_batch(raw) for raw in found if raw]


def _index_file(pipe, file_id: str) -> None:
    pipe.zadd(batchkeys.FILES_KEY, {file_id: _ms()})
    # no file outlives FILE_TTL_MAX: older members are gone files (a listing only reads the newest)
    pipe.zremrangebyscore(batchkeys.FILES_KEY, "-inf", f"({_ms() - batchkeys.FILE_TTL_MAX * 1000}")


def _index_batch(pipe, batch_id: str, created: int) -> None:
    pipe.zadd(batchkeys.BATCHES_KEY, {batch_id: created})
    pipe.zadd(batchkeys.ACTIVE_BATCHES_KEY, {batch_id: created})
    pipe.zremrangebyscore(batchkeys.BATCHES_KEY, "-inf", f"({created - batchkeys.BATCH_TTL * 1000}")  # expired ones


def _batch(raw: dict) -> dict:
    batch = {_text(k): _text(v) for k, v in raw.items()}
    batch["meta"] = json.loads(batch.get("meta", "{}"))
    return batch


def now() -> int:
    return int(time.time())


def _ms() -> int:
    return int(time.time() * 1000)
