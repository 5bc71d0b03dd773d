"""A live fleet for the real-client tests: BatchWorker threads serving loaded engines (tests/harness.py), a
real uvicorn gateway, and a guard that fails a test whose client library tries to reach anything but this machine."""

from __future__ import annotations

import contextlib
import ipaddress
import socket
from collections.abc import Iterator

import httpx

from tests.harness import Fleet

# What a worker started by `embedfleet worker` advertises about itself (GET /info reads it).
WORKER_INFO = {"device": "cpu", "dtype": "float32", "max_batch_tokens": 8192, "max_batch_size": 64,
               "budget_source": "flags", "max_jobs": 64}


@contextlib.contextmanager
def live_gateway(redis_url: str, engines: list, **fields) -> Iterator[str]:
    """One serving worker thread per engine, advertised before the gateway starts; yields the gateway's URL.
    The Redis is flushed first: a module-scoped fleet on the session's redis-server starts from nothing that
    other modules' tests left (their `redis_url` fixture flushes per test, these fixtures once)."""
    with Fleet(redis_url, flush=True) as fleet:
        for engine in engines:
            fleet.serve(engine, info=WORKER_INFO)
        yield fleet.gateway(**fields).url


@contextlib.contextmanager
def live_fleet(redis_url: str, engines: dict, **fields) -> Iterator[httpx.Client]:
    """`live_gateway` over `engines` (name -> Engine), yielding an httpx client on the gateway."""
    with live_gateway(redis_url, list(engines.values()), **fields) as url, \
            httpx.Client(base_url=url, timeout=60) as client:
        yield client


def forbid_internet(monkeypatch) -> list:
    """Every name lookup but localhost's and every socket connection to an address that is not loopback (or a
    Unix socket) is refused and recorded: a client library that would download an encoding or call a model hub
    fails the test instead. Returns the list of attempts."""
    attempts: list = []
    connect, connect_ex, getaddrinfo = socket.socket.connect, socket.socket.connect_ex, socket.getaddrinfo

    def local(address) -> bool:
        if isinstance(address, (str, bytes)):  # AF_UNIX
            return True
        try:
            return ipaddress.ip_address(address[0]).is_loopback
        except ValueError:  # a host name: resolved names reach connect() as addresses, so this is not one
            return False

    def guarded(self, address):
        if not local(address):
            attempts.append(address)
            raise ConnectionRefusedError(f"test: no network beyond loopback (tried {address!r})")
        return connect(self, address)

    def guarded_ex(self, address):
        if not local(address):
            attempts.append(address)
            return 111  # ECONNREFUSED
        return connect_ex(self, address)

    def resolve(host, *args, **kwargs):
        name = host.decode() if isinstance(host, bytes) else host
        if name not in (None, "localhost", "127.0.0.1", "::1"):
            attempts.append(name)
            raise socket.gaierror(socket.EAI_NONAME, f"test: no name lookups beyond localhost (asked {name!r})")
        return getaddrinfo(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", resolve)
    monkeypatch.setattr(socket.socket, "connect", guarded)
    monkeypatch.setattr(socket.socket, "connect_ex", guarded_ex)
    return attempts
