"""Commands packed into Redis's protocol in C, for every connection common/redisclient.py makes.

redis-py 8 hands each argument to its encoder in Python (type checks, str -> bytes) before hiredis packs the
command: ~1 us an argument, and a one-job enqueue has ~45 (rq's job fields), a round's finish a few per job.
hiredis's `pack_command` takes str, bytes, int and float itself and writes exactly what redis-py writes for
them (UTF-8, strict; ints and floats as `repr`; a memoryview's bytes, copied, where redis-py sends it without a
copy: nothing here sends one); what it refuses (bool and None, which redis-py refuses with a DataError;
bytearray) and a command name of several words ("CONFIG GET", which redis-py splits) go to the connection's
own packer, unchanged.
"""

from __future__ import annotations

try:  # the worker's and gateway's extras install it; a producer may run without
    from hiredis import pack_command
except ImportError:  # pragma: no cover - hiredis is in every extra that sends a round's writes
    pack_command = None


class Packer:
    """A redis-py connection's command packer (`pack(*args) -> list of bytes`): hiredis where it packs the
    command as redis-py would, else `fallback` (the connection's own)."""

    __slots__ = ("fallback",)

    def __init__(self, fallback):
        self.fallback = fallback

    def pack(self, *args) -> list:
        name = args[0]
        if isinstance(name, str) and " " not in name:
            try:
                return [pack_command(args)]
            except TypeError:  # bool, None, bytearray, a type of its own: redis-py decides (or refuses)
                pass
        return self.fallback(*args)


def fast(connection) -> bool:
    """Whether hiredis packs as `connection` would: its text is encoded UTF-8, strictly (redis-py's default)."""
    encoder = connection.encoder
    return pack_command is not None and encoder.encoding.lower().replace("-", "") == "utf8" \
        and encoder.encoding_errors == "strict"


def install(connection) -> None:
    """Give a sync or asyncio redis-py connection the Packer, its own packer kept as the fallback; nothing
    where hiredis is missing or the connection encodes text otherwise. Idempotent (a reconnect calls it again)."""
    own = getattr(connection, "_command_packer", None)
    if isinstance(own, Packer) or not fast(connection):
        return
    fallback = own.pack if own is not None else connection._pack_command_python  # (asyncio without hiredis)
    connection._command_packer = Packer(fallback)


def on_connect(connection) -> None:
    """A sync client's `redis_connect_func`: the Packer, then redis-py's own handshake."""
    install(connection)
    connection.on_connect()


async def on_connect_async(connection) -> None:
    """An asyncio client's `redis_connect_func`: the Packer, then redis-py's own handshake."""
    install(connection)
    await connection.on_connect()
