"""A round's writes are packed in C (common.protocol.scripts.packed), and so is every command of the clients
common/redisclient.py makes (common/packing.py), byte for byte as redis-py packs them, and by redis-py itself
wherever hiredis would pack otherwise (no Redis but in the last tests: nothing else is sent)."""

from __future__ import annotations

import asyncio

import pytest
import redis

from embedfleet.common import packing
from embedfleet.common.protocol import scripts
from embedfleet.common.redisclient import connect, connect_async


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


def _installed(**options):
    connection = _connection(**options)
    packing.install(connection)
    return connection


ODD = [[("SET", "k", bytearray(b"v"))], [("CONFIG GET", "maxmemory")], [("SET", "k", memoryview(b"v"))]]


@pytest.mark.parametrize("commands", COMMANDS + ODD)
def test_a_connections_packer_packs_as_redis_py_packs(commands):
    connection = _installed()
    assert isinstance(connection._command_packer, packing.Packer)
    assert b"".join(connection.pack_commands(commands)) == b"".join(_connection().pack_commands(commands))


def test_the_packer_keeps_redis_pys_refusals_and_encodings():
    connection = _installed()
    for value in (True, None, 1j):
        with pytest.raises(redis.DataError):
            connection.pack_command("SET", "k", value)
    with pytest.raises(UnicodeEncodeError):
        connection.pack_command("SET", "k", "\ud800")
    latin = _installed(encoding="latin-1")  # hiredis writes UTF-8: this connection keeps redis-py's packer
    assert not isinstance(latin._command_packer, packing.Packer)
    assert latin.pack_command("SET", "k", "é") == _connection(encoding="latin-1").pack_command("SET", "k", "é")
    packing.install(connection)  # again (a reconnect): one Packer, not one around another
    assert not isinstance(connection._command_packer.fallback.__self__, packing.Packer)


VALUES = {"text": "héllo wörld", "bytes": b"\x00\xff\r\n" * 3, "int": -(2**62), "float": 0.1, "big": b"x" * 100_000}


def test_the_clients_of_the_entry_points_pack_in_c_and_round_trip(redis_url):
    client = connect(redis_url)
    try:
        pipe = client.pipeline(transaction=False)
        for name, value in VALUES.items():
            pipe.set(f"packed:{name}", value)
        pipe.execute()
        got = client.mget([f"packed:{name}" for name in VALUES])
        connection = client.connection_pool.get_connection()
        try:
            assert isinstance(connection._command_packer, packing.Packer)
        finally:
            client.connection_pool.release(connection)
    finally:
        client.close()
    assert got == [value if isinstance(value, bytes) else str(value).encode() for value in VALUES.values()]

    async def asynchronous() -> tuple[list, object]:
        aclient = connect_async(redis_url)
        try:
            await aclient.set("packed:async", VALUES["text"])
            found = await aclient.mget(["packed:async", "packed:float"])
            connection = await aclient.connection_pool.get_connection()
            packer = connection._command_packer
            await aclient.connection_pool.release(connection)
            return found, packer
        finally:
            await aclient.aclose()

    found, packer = asyncio.run(asynchronous())
    assert found == [VALUES["text"].encode(), b"0.1"] and isinstance(packer, packing.Packer)
