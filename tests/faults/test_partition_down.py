"""A model over two Redis, one of them stopped under load (common/shards.py, producer/client/placement.py): new
requests go to the other partition, callers waiting on the stopped one get a 503 that names it, nothing on the
live partition is lost, and once it is back (AOF) every request it held is answered. Bounded: a fixed number of
submits, every wait with a timeout."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request

import pytest

from embedfleet.common.errors import UnavailableError
from embedfleet.common.redisserver import RedisServer
from embedfleet import AsyncProducer, Producer
from tests import gatewayserver
from tests.nullworker import NULL, null_worker

BEFORE, DURING = 150, 150  # submits before the stop, and while the partition is down


@pytest.fixture
def two_partitions(tmp_path):
    servers = [RedisServer(tmp_path / f"p{i}", appendonly=True).start() for i in range(2)]
    yield servers
    for server in servers:
        server.stop()


def test_a_partition_stopped_under_load(two_partitions):
    live, stopped = two_partitions
    urls = [live.url, stopped.url]
    with null_worker(live.url) as first, null_worker(stopped.url) as second, \
            Producer(live.url, shards={NULL: urls}) as producer:
        first.serve()
        second.serve()
        before = [producer.submit([f"before {i}"], NULL) for i in range(BEFORE)]
        placed = {url: [i for i in before if producer.url_of(i) == url] for url in urls}
        assert len(placed[live.url]) == len(placed[stopped.url]) == BEFORE // 2  # both got traffic
        stopped.stop()

        accepted, refused = [], 0
        for i in range(DURING):
            try:
                accepted.append(producer.submit([f"during {i}"], NULL))
            except UnavailableError:
                refused += 1
        assert len(accepted) >= 0.95 * DURING, f"{refused} of {DURING} new requests refused"
        assert {producer.url_of(i) for i in accepted} == {live.url}  # all on the live partition
        with pytest.raises(UnavailableError, match=f"partition 2 of 2 of model '{NULL}'.*{stopped.port}"):
            producer.wait(placed[stopped.url][-1], 5)
        assert asyncio.run(_async_during(urls, placed[stopped.url][-1])) == 20
        # reads of the model go on with the partition that answers: status, metrics, KEDA's depth
        (row,) = producer.fleet()["models"]
        assert row["name"] == NULL and row["live_workers"] == 1
        assert producer.live_workers(NULL) == 1 and producer.queue_depth(NULL) >= 0
        # the live partition's requests, before and during the outage: none lost
        assert all(producer.wait(i, 30).ok for i in placed[live.url] + accepted)

        stopped.start()  # back, its AOF replayed: what it held is answered, and it takes new requests again
        assert all(producer.wait(i, 30).ok for i in placed[stopped.url])
        after, deadline = [], time.monotonic() + 30  # it rejoins once placement.DOWN_SECONDS have passed
        while stopped.url not in {producer.url_of(i) for i in after}:
            assert time.monotonic() < deadline, "the partition did not rejoin"
            after.append(producer.submit(["after"], NULL))
        assert all(producer.wait(i, 30).ok for i in after)


async def _async_during(urls: list[str], waiting: str) -> int:
    """Requests an AsyncProducer gets answered while the second partition is down; a wait on `waiting`, an id on
    that partition, rides out the outage until its timeout, then answers 503 naming it."""
    async with AsyncProducer(urls[0], shards={NULL: urls}) as producer:
        with pytest.raises(UnavailableError, match=f"partition 2 of 2 of model '{NULL}'"):
            await producer.wait(waiting, 1)
        ids = [await producer.submit([f"async {i}"], NULL) for i in range(20)]
        return sum([(await producer.wait(i, 30)).ok for i in ids])


def test_the_gateway_while_a_partition_is_down(two_partitions):
    """New HTTP requests are answered by the live partition; a job on the stopped one answers 503 naming it, and is
    there again once it is back."""
    live, stopped = two_partitions
    urls = [live.url, stopped.url]
    with null_worker(live.url) as first, null_worker(stopped.url) as second, \
            Producer(live.url, shards={NULL: urls}) as producer:
        first.serve()
        second.serve()
        shards = f"{NULL}={live.url},{stopped.url}"
        gateway = gatewayserver.Server(gatewayserver.settings(live.url, redis_shards=shards))
        try:
            jobs = [_http(gateway.url, "POST", "/v1/jobs", {"model": NULL, "input": f"job {i}"}) for i in range(4)]
            assert {status for status, _ in jobs} == {202}
            on_stopped = [body["id"] for _, body in jobs if producer.url_of(body["id"]) == stopped.url]
            assert len(on_stopped) == 2  # the gateway spread them too
            stopped.stop()
            answers = [_http(gateway.url, "POST", "/v1/embeddings", {"model": NULL, "input": f"t{i}"})
                       for i in range(DURING // 5)]
            assert sum(status == 200 for status, _ in answers) >= 0.95 * len(answers)
            status, body = _http(gateway.url, "GET", f"/v1/jobs/{on_stopped[0]}")
            assert status == 503 and "partition 2 of 2" in json.dumps(body), body
            stopped.start()
            status, body = _http(gateway.url, "GET", f"/v1/jobs/{on_stopped[0]}?wait=30")
            assert status == 200 and body["status"] == "finished", body
        finally:
            gateway.stop()


def _http(base: str, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(base + path, method=method, headers={"Content-Type": "application/json"},
                                     data=None if body is None else json.dumps(body).encode())
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())
