"""Which Redis a client uses when no one names one: rq's default, said once per process on its first connection
to it (common/fleetstate.py), never when a URL, EMBEDFLEET_REDIS_URL or a running `embedfleet up` named one. No
command is sent: redis-py connects on a client's first command."""

from __future__ import annotations

import asyncio
import logging

import pytest

from embedfleet import AsyncProducer, Producer
from embedfleet.common import fleetstate


@pytest.fixture
def nothing_named(tmp_path, monkeypatch):
    monkeypatch.delenv(fleetstate.ENV_REDIS_URL, raising=False)
    monkeypatch.delenv("EMBEDFLEET_REDIS_SHARDS", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # no `up` state file
    monkeypatch.setattr(fleetstate, "_fell_back", False)
    fleetstate._say_default.cache_clear()
    yield
    fleetstate._say_default.cache_clear()


def said(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "the default" in r.getMessage()]


def test_the_default_redis_is_said_once(nothing_named, caplog):
    caplog.set_level(logging.WARNING, logger="embedfleet")
    with Producer() as first, Producer() as second:
        assert first.redis_url == second.redis_url == fleetstate.DEFAULT_REDIS_URL

    async def make() -> None:
        async with AsyncProducer() as producer:
            assert producer.redis_url == fleetstate.DEFAULT_REDIS_URL

    asyncio.run(make())
    assert said(caplog) == ["embedfleet: using Redis redis://127.0.0.1:6379/0, the default: no --redis-url, no "
                            "EMBEDFLEET_REDIS_URL and no `embedfleet up` running"]


def test_a_named_redis_is_not_announced(nothing_named, caplog, monkeypatch):
    caplog.set_level(logging.WARNING, logger="embedfleet")
    with Producer("redis://127.0.0.1:1/0"):
        pass
    monkeypatch.setenv(fleetstate.ENV_REDIS_URL, "redis://127.0.0.1:6379/0")  # the same URL, named
    with Producer():
        pass
    assert said(caplog) == []
