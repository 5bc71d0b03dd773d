"""The async clients (AsyncProducer, the gateway) across a Redis restart and against a Redis that hangs.

A restart leaves every pooled connection stale; the first command on each must be retried on a fresh
connection, not answered with "Connection closed by server". Workers are stood in for by tests.answers.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

import httpx
import pytest
import redis

from embedfleet.common.errors import UnavailableError
from embedfleet.common.redisclient import CLOSE_TIMEOUT
from embedfleet.common.redisserver import RedisServer
from embedfleet import AsyncProducer, Producer
from tests.answers import MODEL, advertise, answer
from tests.gatewayserver import Server, settings

WAITERS = 400


@pytest.fixture(autouse=True)
def _no_stopped_redis(restartable_redis):
    yield
    os.kill(restartable_redis.process.pid, signal.SIGCONT)  # never leave a stopped process behind


def connected_clients(client: redis.Redis) -> int:
    return int(client.info("clients")["connected_clients"])


async def until(check, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not await asyncio.to_thread(check):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


def test_400_async_waiters_ride_out_a_redis_restart(restartable_redis):
    """Every waiter whose result is stored after the restart gets it (none sees a stale connection)."""
    client = redis.Redis.from_url(restartable_redis.url)
    advertise(client)

    async def main():
        async with AsyncProducer(restartable_redis.url) as producer:
            ids = await producer.submit_many([[f"text {i}"] for i in range(WAITERS)], MODEL)
            waits = [asyncio.ensure_future(producer.wait(i, timeout=120)) for i in ids]
            # The reply listener and the command connections are open: every one of them will go stale.
            await until(lambda: connected_clients(client) >= 3, 30, "the producer's connections")
            await asyncio.sleep(0.3)  # every waiter's first look is done: only a wake-up can end its wait
            await asyncio.to_thread(restartable_redis.restart)
            await asyncio.to_thread(answer, client, ids)
            return ids, await asyncio.gather(*waits, return_exceptions=True)

    ids, results = asyncio.run(main())
    failed = [repr(r) for r in results if isinstance(r, BaseException)]
    assert not failed, f"{len(failed)} of {WAITERS} waiters failed, e.g. {failed[0]}"
    assert [r.id for r in results] == ids and all(r.embeddings.shape == (1, 4) for r in results)


def test_a_request_that_a_redis_restart_lost_is_retryable_not_expired(tmp_path):
    """A Redis restarted without its data loses a waiting request's job: the wait fails with a retryable
    UnavailableError (the gateway's 503) that says so, never 'expired' (404: OpenAI clients do not retry it)."""
    server = RedisServer(tmp_path / "redis").start()  # no AOF, no RDB: the restart loses every key
    try:
        client = redis.Redis.from_url(server.url)
        advertise(client)

        async def main():
            async with AsyncProducer(server.url) as producer:
                [request_id] = await producer.submit_many([["nobody answers this"]], MODEL)
                waiting = asyncio.ensure_future(producer.wait(request_id, timeout=60))
                await until(lambda: connected_clients(client) >= 3, 30, "the producer's connections")
                await asyncio.to_thread(server.restart)
                with pytest.raises(UnavailableError, match="gone from Redis before its result was stored") as lost:
                    await waiting
                return lost.value

        assert asyncio.run(main()).code == "redis_unavailable"
    finally:
        server.stop()


def test_gateway_answers_its_next_requests_after_a_redis_restart(restartable_redis):
    client = redis.Redis.from_url(restartable_redis.url)
    advertise(client)
    with Producer(restartable_redis.url) as producer:
        ids = producer.submit_many([[f"text {i}"] for i in range(200)], MODEL)
    answer(client, ids)
    server = Server(settings(restartable_redis.url))

    async def read_all() -> list[int]:
        # A client per round: idle keep-alive connections could meet uvicorn's own keep-alive timeout.
        async with httpx.AsyncClient(base_url=server.url, limits=httpx.Limits(max_connections=len(ids)),
                                     timeout=60) as http:
            responses = await asyncio.gather(*(http.get(f"/v1/jobs/{i}") for i in ids))
        return [r.status_code for r in responses]

    async def main():
        before = await read_all()
        pooled = connected_clients(client)
        await asyncio.to_thread(restartable_redis.restart)
        return before, pooled, await read_all()

    try:
        before, pooled, after = asyncio.run(main())
    finally:
        server.stop()
    assert before == [200] * len(ids)
    # this test's client + the gateway's two command connections, all stale after the restart
    assert pooled >= 3, f"only {pooled} Redis connections were open: the test would prove nothing"
    assert after == [200] * len(ids), f"{after.count(503)} of {len(ids)} answered 503 after the restart"


def test_close_returns_promptly_when_redis_stops_answering(restartable_redis):
    """A Redis that accepts bytes but never answers (a frozen host, a stuck TLS peer) cannot hang close()."""
    client = redis.Redis.from_url(restartable_redis.url)
    advertise(client)
    process = restartable_redis.process

    async def main():
        producer = AsyncProducer(restartable_redis.url)
        waiting = asyncio.ensure_future(producer.wait(await producer.submit(["never answered"], MODEL), 60))
        await asyncio.sleep(0.2)
        os.kill(process.pid, signal.SIGSTOP)
        try:
            # The bound is close()'s own: a few CLOSE_TIMEOUTs, far below the 30 s socket timeout.
            await asyncio.wait_for(producer.close(), 4 * CLOSE_TIMEOUT)
        finally:
            os.kill(process.pid, signal.SIGCONT)
        assert waiting.done()
        with pytest.raises(UnavailableError, match="closed while waiting"):
            await waiting

    asyncio.run(main())
