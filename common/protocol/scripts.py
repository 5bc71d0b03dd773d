"""The Lua scripts of the protocol, loaded one way: each file of scripts/ with lib.lua before it and the key
prefixes and limits they name filled in ({{NAME}}: keys.py's, rqkeys.py's or common/names.py's), run by SHA (EVALSHA)
and loaded again when the server lost it (a restart).

Each script's header lists every key it touches (KEYS, and the keys it builds from ids) and its ARGV.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import redis
import redis.asyncio as aioredis
import redis.cluster

from embedfleet.common import names, packing
from embedfleet.common.protocol import keys, rqkeys, slotmoves

FOLDER = Path(__file__).with_name("scripts")
_PLACEHOLDER = re.compile(r"\{\{([A-Z_]+)\}\}")
_NAMED = (keys, rqkeys, names)  # where a script's {{NAME}} is defined


def _filled(text: str) -> str:
    def value(match: re.Match) -> str:
        name = match.group(1)
        found = next((module for module in _NAMED if hasattr(module, name)), None)
        if found is None:
            raise KeyError(f"{name} in a Lua script is not defined in common/protocol/keys.py, rqkeys.py or "
                           "common/names.py")
        return str(getattr(found, name))

    return _PLACEHOLDER.sub(value, text)


class Script:
    """One script of scripts/, with lib.lua before it."""

    def __init__(self, name: str):
        self.name = name
        self.source = _filled((FOLDER / "lib.lua").read_text() + "\n" + (FOLDER / f"{name}.lua").read_text())
        self.sha = hashlib.sha1(self.source.encode()).hexdigest()

    def __call__(self, connection: redis.Redis, keys_: list[str], args: list):
        if slotmoves.is_cluster(connection):  # sent again while its slot is being moved (slotmoves.py)
            return slotmoves.while_moving(lambda: self._run(connection, keys_, args), connection)
        return self._run(connection, keys_, args)

    def _run(self, connection: redis.Redis, keys_: list[str], args: list):
        try:
            return connection.evalsha(self.sha, len(keys_), *keys_, *args)
        except redis.exceptions.NoScriptError:  # EVAL runs and caches it: only EVAL/EVALSHA rights needed
            return connection.eval(self.source, len(keys_), *keys_, *args)

    async def run_async(self, connection: aioredis.Redis, keys_: list[str], args: list):
        if slotmoves.is_cluster(connection):
            return await slotmoves.while_moving_async(lambda: self._run_async(connection, keys_, args))
        return await self._run_async(connection, keys_, args)

    async def _run_async(self, connection: aioredis.Redis, keys_: list[str], args: list):
        try:
            return await connection.evalsha(self.sha, len(keys_), *keys_, *args)
        except redis.exceptions.NoScriptError:
            return await connection.eval(self.source, len(keys_), *keys_, *args)

    def queue(self, pipe, keys_: list[str], args: list, by_source: bool = False) -> None:
        """Queue on a pipeline by SHA; where the server lost the script (NoScriptError) the caller sends the
        pipeline again `by_source` (EVAL, which caches it again)."""
        pipe.execute_command(*self.command(keys_, args, by_source))  # (a cluster's pipeline has no eval())

    def command(self, keys_: list[str], args: list, by_source: bool = False) -> tuple:
        """The run as a raw command (by SHA, or `by_source`), for `send_at_once`."""
        return ("EVAL", self.source, len(keys_), *keys_, *args) if by_source else \
            ("EVALSHA", self.sha, len(keys_), *keys_, *args)


def send_at_once(client: redis.Redis, commands: list[tuple]) -> list:
    """Run `commands` (a script's `command`s among them) as one pipeline sent in ONE write; their raw replies
    in order, an error reply in place of its value. (A redis-py pipeline writes one piece per 6 KB, and each
    write lets the GIL go and waits to take it back: a worker's finish thread, which sends a round's result
    blobs, spent a third of its time there.)"""
    if isinstance(client, redis.cluster.RedisCluster):
        return _send_to_slot(client, commands)
    pool = client.connection_pool
    connection = pool.get_connection()
    try:
        connection.send_packed_command([packed(connection, commands)])
        replies: list = []
        for _ in commands:
            try:
                replies.append(connection.read_response())
            except redis.ResponseError as exc:  # its reply was read whole: the next ones follow
                replies.append(exc)
        return replies
    except BaseException:  # a reply half read (or none): this connection is in no known state
        connection.disconnect()
        raise
    finally:
        pool.release(connection)


def _send_to_slot(cluster: redis.cluster.RedisCluster, commands: list[tuple]) -> list:
    """send_at_once on a Redis Cluster: the commands lie in one slot (keys.py) and go to its master. A reply
    MOVED (the slot's master changed: a failover, a resharding), ASK or TRYAGAIN (the slot is being moved)
    means that command did not run: the slot map is read again and the whole write sent once more where the
    slot is, with slotmoves.py's backoff until the move ends (its SETs may run twice, the same blob; the
    script ran nowhere yet). What is still refused then comes back as the replies say."""
    def send() -> list:
        replies = send_at_once(_node_client(cluster, commands[-1]), commands)
        moving = next((r for r in replies if isinstance(r, Exception) and slotmoves.slot_moving(r)), None)
        if moving is not None:
            raise moving
        return replies

    try:
        return slotmoves.while_moving(send, cluster)
    except redis.RedisError as exc:
        if not slotmoves.slot_moving(exc):
            raise
        return send_at_once(_node_client(cluster, commands[-1]), commands)


def _node_client(cluster: redis.cluster.RedisCluster, script: tuple) -> redis.Redis:
    """The client of the master that holds the slot of `script`'s first key (its third argument)."""
    return cluster.get_node_from_key(script[3]).redis_connection


def bulk_limit(connection: redis.Redis) -> int | None:
    """Redis's proto-max-bulk-len: the most bytes one value (one script argument) may have; None where CONFIG
    GET is refused (an ACL user without @dangerous, a managed Redis that renames or hides CONFIG) or says
    nothing. Raises what a Redis that does not answer raises."""
    try:
        found = connection.config_get("proto-max-bulk-len")
    except redis.ResponseError:
        return None
    try:
        value = int(found["proto-max-bulk-len"])
    except (KeyError, TypeError, ValueError):
        return None
    return value if value > 0 else None


def packed(connection, commands: list[tuple]) -> bytes:
    """`commands` in Redis's protocol, as redis-py's own packer writes them, in one piece: each packed in C
    where common/packing.py says hiredis packs it as redis-py would (all the protocol's commands), else by
    redis-py, which encodes each argument in Python (~4 us a command: a round's result SETs and its finish
    script's arguments cost the finish thread more than the rest of its work)."""
    if packing.fast(connection) and all(isinstance(command[0], str) and " " not in command[0] for command in commands):
        try:  # (redis-py splits a first argument of several words: "CONFIG GET")
            return b"".join([packing.pack_command(command) for command in commands])
        except TypeError:  # an argument hiredis does not take (bytearray, bool, None): redis-py decides
            pass
    return b"".join(connection.pack_commands(commands))


ENQUEUE, TAKE, FINISH, REFRESH = Script("enqueue"), Script("take"), Script("finish"), Script("refresh")
RECOVER, GIVE_BACK, CANCEL = Script("recover"), Script("giveback"), Script("cancel")
JOIN, PUBLISH = Script("join"), Script("publish")
SAVE_OPTIONS, WITHDRAW = Script("saveoptions"), Script("withdraw")
INFLIGHT_ATTACH, INFLIGHT_RELEASE = Script("inflightattach"), Script("inflightrelease")
# OpenAI's Batch API (producer/gateway/batches/store.py)
BATCH_TRANSITION, BATCH_COLLECT, BATCH_LEASE = Script("batchtransition"), Script("batchcollect"), Script("batchlease")
ALL = (ENQUEUE, TAKE, FINISH, REFRESH, RECOVER, GIVE_BACK, CANCEL, JOIN, PUBLISH, SAVE_OPTIONS, WITHDRAW,
       INFLIGHT_ATTACH, INFLIGHT_RELEASE, BATCH_TRANSITION, BATCH_COLLECT, BATCH_LEASE)
