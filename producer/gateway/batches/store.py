"""Files and batches in Redis: every read and write of the Batch API's keys (common/protocol/keys.py).

Status changes and collected lines go through two small Lua scripts, so that a change is checked against
the state it changes (a cancel cannot be overwritten by a runner's `completed`; a line is counted once) and,
for a runner, against its lease: a replica that lost its lease writes nothing.
"""

from __future__ import annotations

import json
import time

import redis.asyncio as aioredis

from common.protocol import keys

# KEYS[1] embedfleet:batch:<id> HASH (HGET status, HSET), KEYS[2] embedfleet:batches:active ZSET (ZREM on
# an end), KEYS[3] embedfleet:batch:<id>:lease STRING (GET; DEL on an end), KEYS[4..] keys deleted on an end
# ARGV: 1 batch id, 2 lease token ('' = no lease needed: a route), 3 the statuses it may change from (space-
# separated), 4 the new status, 5 '1' = the batch ends, 6.. field/value pairs set with it
# Returns {1} (changed), {0, status} (its status was another), {-1} (the lease is not ours), {-2} (no batch).
_TRANSITION = """
if ARGV[2] ~= '' and redis.call('GET', KEYS[3]) ~= ARGV[2] then return {-1} end
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return {-2} end
if not string.find(' ' .. ARGV[3] .. ' ', ' ' .. status .. ' ', 1, true) then return {0, status} end
redis.call('HSET', KEYS[1], 'status', ARGV[4], unpack(ARGV, 6))
if ARGV[5] == '1' then
  redis.call('ZREM', KEYS[2], ARGV[1])
  redis.call('DEL', unpack(KEYS, 3))
end
return {1}
"""

# KEYS[1] embedfleet:batch:<id>:lease STRING (GET), KEYS[2] embedfleet:batch:<id>:lines HASH (HSETNX,
# PEXPIRE), KEYS[3] embedfleet:batch:<id> HASH (HINCRBY completed / failed / input_tokens, PTTL)
# ARGV: 1 lease token, then per line: index, counter (`completed` or `failed`), prompt tokens, the line
# (stored with a first byte '1' for a 2xx answer, bound for the output file, '0' for the error file)
# Returns how many lines were new (each counted once), -1 (the lease is not ours) or -2 (no batch).
_COLLECT = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
local ttl = redis.call('PTTL', KEYS[3])
if ttl == -2 then return -2 end
local added = 0
for i = 2, #ARGV, 4 do
  if redis.call('HSETNX', KEYS[2], ARGV[i], ARGV[i + 3]) == 1 then
    redis.call('HINCRBY', KEYS[3], ARGV[i + 1], 1)
    redis.call('HINCRBY', KEYS[3], 'input_tokens', ARGV[i + 2])
    added = added + 1
  end
end
if ttl > 0 then redis.call('PEXPIRE', KEYS[2], ttl) end
return added
"""

# KEYS[1] embedfleet:batch:<id>:lease STRING; ARGV: 1 token, 2 lease (ms), 3 '1' = renew, '0' = release
_LEASE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if ARGV[3] == '1' then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return redis.call('DEL', KEYS[1])
"""

MAX_LISTED = 10_000  # ids one listing reads (OpenAI's own cap on a file listing's page)


class LeaseLost(Exception):
    """This replica's lease on a batch lapsed (another may drive it now): the runner stops writing."""


class BatchGone(Exception):
    """The batch expired or was deleted while it ran."""


def _text(raw) -> str:
    return raw.decode() if isinstance(raw, bytes) else raw


class Store:
    """The Batch API's Redis reads and writes, on one asyncio connection (the gateway's default Redis)."""

    def __init__(self, connection: aioredis.Redis):
        self.connection = connection
        self._transition = connection.register_script(_TRANSITION)
        self._collect = connection.register_script(_COLLECT)
        self._lease = connection.register_script(_LEASE)

    # -- files ------------------------------------------------------------------------------------
    async def put_file(self, meta: dict, data: bytes, ttl: int) -> None:
        key = keys.file_key(meta["id"])
        async with self.connection.pipeline(transaction=True) as pipe:
            pipe.hset(key, mapping={"meta": json.dumps(meta), "data": data})
            pipe.expire(key, ttl)
            pipe.zadd(keys.FILES_KEY, {meta["id"]: _ms()})
            # no file outlives FILE_TTL_MAX: older members are gone files (a listing only reads the newest)
            pipe.zremrangebyscore(keys.FILES_KEY, "-inf", f"({_ms() - keys.FILE_TTL_MAX * 1000}")
            await pipe.execute()

    async def file_meta(self, file_id: str) -> dict | None:
        raw = await self.connection.hget(keys.file_key(file_id), "meta")
        return json.loads(raw) if raw else None

    async def file_data(self, file_id: str) -> bytes | None:
        return await self.connection.hget(keys.file_key(file_id), "data")

    async def delete_file(self, file_id: str) -> None:
        async with self.connection.pipeline(transaction=True) as pipe:
            pipe.delete(keys.file_key(file_id))
            pipe.zrem(keys.FILES_KEY, file_id)
            await pipe.execute()

    async def list_files(self) -> list[dict]:
        """Every stored file's meta, oldest first (ids whose file expired are dropped from the index)."""
        return await self._listed(keys.FILES_KEY, keys.file_key, "meta")

    # -- batches ----------------------------------------------------------------------------------
    async def create_batch(self, meta: dict, input_data: bytes) -> None:
        batch_id, created = meta["id"], _ms()  # created_at is whole seconds: the index orders by ms
        key = keys.batch_key(batch_id)
        async with self.connection.pipeline(transaction=True) as pipe:
            pipe.hset(key, mapping={"meta": json.dumps(meta), "status": "validating", "total": 0,
                                    "completed": 0, "failed": 0, "input_tokens": 0})
            pipe.expire(key, keys.BATCH_TTL)
            pipe.set(keys.batch_input_key(batch_id), input_data, ex=keys.BATCH_TTL)
            pipe.zadd(keys.BATCHES_KEY, {batch_id: created})
            pipe.zadd(keys.ACTIVE_BATCHES_KEY, {batch_id: created})
            pipe.zremrangebyscore(keys.BATCHES_KEY, "-inf", f"({created - keys.BATCH_TTL * 1000}")  # expired ones
            await pipe.execute()

    async def batch(self, batch_id: str) -> dict | None:
        """The batch's hash as text fields (`meta` parsed), or None."""
        raw = await self.connection.hgetall(keys.batch_key(batch_id))
        return _batch(raw) if raw else None

    async def list_batches(self) -> list[dict]:
        return await self._listed(keys.BATCHES_KEY, keys.batch_key, None)

    async def input_data(self, batch_id: str) -> bytes | None:
        return await self.connection.get(keys.batch_input_key(batch_id))

    async def transition(self, batch_id: str, before: tuple[str, ...], after: str, *, token: str = "",
                         end: bool = False, **fields) -> str | None:
        """Set status `after` (and `fields`) if the status is one of `before`: None when changed, else the
        status found. With `token`, only while that lease holds (else LeaseLost). `end`: the batch leaves
        the active set and its work keys (input, lines, lease) go."""
        work = [keys.batch_input_key(batch_id), keys.batch_lines_key(batch_id)] if end else []
        pairs = [x for name, value in fields.items() for x in (name, value)]
        reply = await self._transition(
            keys=[keys.batch_key(batch_id), keys.ACTIVE_BATCHES_KEY, keys.batch_lease_key(batch_id), *work],
            args=[batch_id, token, " ".join(before), after, "1" if end else "0", *pairs])
        code = int(reply[0])
        if code == -1:
            raise LeaseLost(batch_id)
        if code == -2:
            raise BatchGone(batch_id)
        return None if code == 1 else _text(reply[1])

    async def forget(self, batch_id: str) -> None:
        """Take an ended (or vanished) batch out of the active set."""
        await self.connection.zrem(keys.ACTIVE_BATCHES_KEY, batch_id)

    async def active(self) -> list[str]:
        return [_text(i) for i in await self.connection.zrange(keys.ACTIVE_BATCHES_KEY, 0, MAX_LISTED - 1)]

    # -- a runner's lease and its collected lines --------------------------------------------------
    async def claim(self, batch_id: str, token: str, lease: float) -> bool:
        return bool(await self.connection.set(keys.batch_lease_key(batch_id), token, nx=True,
                                              px=int(lease * 1000)))

    async def renew(self, batch_id: str, token: str, lease: float) -> bool:
        return bool(await self._lease(keys=[keys.batch_lease_key(batch_id)], args=[token, int(lease * 1000), "1"]))

    async def release(self, batch_id: str, token: str) -> None:
        await self._lease(keys=[keys.batch_lease_key(batch_id)], args=[token, 0, "0"])

    async def collect(self, batch_id: str, token: str, lines: list[tuple[int, bool, int, bytes]]) -> int:
        """Record lines (index, ok, prompt tokens, the output line) not recorded yet; returns how many were
        new. Raises LeaseLost / BatchGone (nothing written)."""
        args: list = [token]
        for index, ok, tokens, line in lines:
            args += [index, "completed" if ok else "failed", tokens, (b"1" if ok else b"0") + line]
        added = int(await self._collect(keys=[keys.batch_lease_key(batch_id), keys.batch_lines_key(batch_id),
                                              keys.batch_key(batch_id)], args=args))
        if added == -1:
            raise LeaseLost(batch_id)
        if added == -2:
            raise BatchGone(batch_id)
        return added

    async def collected(self, batch_id: str) -> set[int]:
        return {int(i) for i in await self.connection.hkeys(keys.batch_lines_key(batch_id))}

    async def lines(self, batch_id: str) -> dict[int, tuple[bool, bytes]]:
        """Each collected line: whether it was answered with a 2xx (the output file) or not (the error file)."""
        stored = await self.connection.hgetall(keys.batch_lines_key(batch_id))
        return {int(i): (value[:1] == b"1", value[1:]) for i, value in stored.items()}

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


def _batch(raw: dict) -> dict:
    batch = {_text(k): _text(v) for k, v in raw.items()}
    batch["meta"] = json.loads(batch.get("meta", "{}"))
    return batch


def now() -> int:
    return int(time.time())


def _ms() -> int:
    return int(time.time() * 1000)
