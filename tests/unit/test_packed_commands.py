"""A round's writes are packed in C (common.protocol.scripts.packed) byte for byte as redis-py packs them, and by
redis-py itself wherever hiredis would pack otherwise (no Redis: nothing is sent)."""

from __future__ import annotations

import pytest
import redis

from common.protocol import scripts


def _connection(**options):
    return redis.Redis(**options).connection_pool.make_connection()  # connects only when used


COMMANDS = [
    [("SET", "embedfleet:result:abc", b"\x00\xffEFR" * 100, "EX", 3600, "NX")],
    [("SET", "k", b"v", "EX", 60), scripts.FINISH.command(["q", "wip"], ["worker", "1.5", 7, "", b"", "é"])],
    [scripts.TAKE.command(["a"], [64, 0.25, -3, 2**70, "x y"], by_source=True)],
]


@pytest.mark.parametrize("commands", COMMANDS)
def test_packed_as_redis_py_packs(commands):
    connection = _connection()
    assert scripts.packed(connection, commands) == b"".join(connection.pack_commands(commands))


@pytest.mark.parametrize("commands", [[("SET", "k", bytearray(b"v"))], [("CONFIG GET", "maxmemory")],
                                      [("SET", "k", memoryview(b"v"))]])
def test_what_hiredis_would_pack_otherwise_goes_through_redis_py(commands):
    connection = _connection()
    assert scripts.packed(connection, commands) == b"".join(connection.pack_commands(commands))


def test_refusals_stay_redis_pys():
    with pytest.raises(redis.DataError, match="bool"):
        scripts.packed(_connection(), [("SET", "k", True)])
    latin = _connection(encoding="latin-1")
    assert scripts.packed(latin, [("SET", "k", "é")]) == b"".join(latin.pack_commands([("SET", "k", "é")]))
