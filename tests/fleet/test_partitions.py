"""One model over two and three redis-servers (its partitions, common/shards.py): producers spread its requests
over all of them and find each again by its id, a worker per partition serves them, and every read of the model
(queue depth, level stats, live workers, the fleet snapshot) sums over its partitions."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
import redis

from embedfleet.common.protocol import keys, rqkeys
from embedfleet.common.redisserver import RedisServer
from embedfleet import AsyncProducer, Producer
from embedfleet.producer.client.fleet import level_stats
from tests.nullworker import NULL, null_worker


@pytest.fixture
def partitions(tmp_path):
    """Three redis-servers of the test's own (the third is used by the three-partition tests)."""
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(RedisServer(tmp_path / f"p{i}")).url for i in range(3)]


def _jobs_on(urls: list[str]) -> list[int]:
    """Request jobs (rq:job:*) each Redis holds."""
    counts = []
    for url in urls:
        with redis.Redis.from_url(url) as client:
            counts.append(sum(1 for _ in client.scan_iter(rqkeys.rq_job_key("*"), count=1000)))
    return counts


def _results_on(urls: list[str], ids: list[str]) -> list[int]:
    """Results of `ids` each Redis holds."""
    counts = []
    for url in urls:
        with redis.Redis.from_url(url) as client:
            counts.append(sum(client.exists(keys.result_key(i)) for i in ids))
    return counts


@pytest.mark.parametrize("count", [2, 3])
def test_a_model_over_partitions_is_spread_served_and_read_whole(partitions, count):
    urls = partitions[:count]
    with contextlib.ExitStack() as stack:
        workers = [stack.enter_context(null_worker(url)) for url in urls]  # advertised, not serving yet
        with Producer(urls[0], shards={NULL: urls}) as producer:
            ids = [producer.submit([f"text {i}"], NULL) for i in range(30 * count)]
            assert _jobs_on(urls) == [30] * count  # round robin: evenly
            assert producer.queue_depth(NULL) == 30 * count and producer.live_workers(NULL) == count
            assert sum(s.depth for s in producer.level_stats(NULL)) == 30 * count
            fleet = producer.fleet()
            (row,) = fleet["models"]
            assert row["partitions"] == count and row["live_workers"] == count
            assert row["queues"][0]["depth"] == 30 * count and row["redis"].count("redis://") == count
            for worker in workers:
                worker.serve()
            results = [producer.wait(i, 30) for i in ids]
            assert all(r.ok and r.embeddings.shape == (1, 4) for r in results)
            assert _results_on(urls, ids) == [30] * count  # each partition's worker answered its own
        with Producer(urls[-1], shards={NULL: urls}) as stranger:  # ids it did not submit: found by asking each
            assert [stranger.status(i) for i in ids[:count]] == ["finished"] * count
            assert all(stranger.get(i).ok for i in ids[-count:])
        # a partition added later: the ids placed before are still found, new ones reach it too
        with Producer(urls[0], shards={NULL: [*urls, partitions[2]] if count == 2 else urls}) as grown:
            assert grown.get(ids[0]).ok and grown.get(ids[1]).ok


def test_the_async_producer_spreads_and_finds_its_requests(partitions):
    urls = partitions[:2]

    async def ask() -> list[str]:
        async with AsyncProducer(urls[0], shards={NULL: urls}) as producer:
            ids = [await producer.submit([f"t{i}"], NULL) for i in range(20)]
            results = [await producer.wait(i, 30) for i in ids]
            assert all(r.ok for r in results)
            assert await producer.queue_depth(NULL) == 0 and await producer.live_workers(NULL) == 2
            return ids

    with null_worker(urls[0]) as first, null_worker(urls[1]) as second:
        first.serve()
        second.serve()
        ids = asyncio.run(ask())
    assert _results_on(urls, ids) == [10, 10]


def test_level_stats_of_a_partitioned_model_sum_over_its_partitions(partitions):
    from embedfleet.common.shards import ShardMap
    from embedfleet.producer.client.exchanges import run

    urls = partitions[:2]
    with null_worker(urls[0]), null_worker(urls[1]):
        with Producer(urls[0], shards={NULL: urls}) as producer:
            for i in range(6):
                producer.submit([f"x{i}"], NULL, priority="bulk")
            links = {url: redis.Redis.from_url(url) for url in urls}
            try:
                stats = {s.priority: s for s in run(links, level_stats(ShardMap(urls[0], {NULL: urls}), NULL))}
            finally:
                for link in links.values():
                    link.close()
    assert stats["bulk"].depth == 6 and stats["bulk"].oldest_age is not None and stats["interactive"].depth == 0


def test_a_producer_reads_the_partitions_from_the_environment_as_every_command_does(partitions, monkeypatch):
    """Producer() and AsyncProducer() take EMBEDFLEET_REDIS_SHARDS (as `worker`, `status` and `embed` do), and a
    submit_many of ten requests spreads over the partitions, one enqueue per partition."""
    urls = partitions[:2]
    monkeypatch.setenv("EMBEDFLEET_REDIS_SHARDS", f"{NULL}={urls[0]},{urls[1]}")
    with null_worker(urls[0]), null_worker(urls[1]):
        with Producer(urls[0]) as producer:
            assert producer.shards.partitions(NULL) == urls
            producer.submit_many([[f"many {i}"] for i in range(10)], NULL)
            assert _jobs_on(urls) == [5, 5]

        async def spread() -> list[str]:
            async with AsyncProducer(urls[0]) as producer:
                assert producer.shards.partitions(NULL) == urls
                return await producer.submit_many([[f"async {i}"] for i in range(10)], NULL)

        ids = asyncio.run(spread())
        assert _jobs_on(urls) == [10, 10] and len(set(ids)) == 10


def test_a_chosen_id_has_one_home_whoever_submits_it_and_is_never_accepted_twice(partitions):
    """Four producers over three partitions, two listing them in other orders, submit 250 chosen ids 1,125 times
    in all: alone, and in pairs whose ids have different homes (one new, one a retry). Each id is enqueued once,
    on its home (placement.partition_of: the set of partitions, not a producer's order), and every later submit
    of it is refused as a duplicate (issue 49's target: 0 ids accepted twice)."""
    from embedfleet.common.errors import DuplicateRequestError
    from embedfleet.producer.client.placement import partition_of

    urls = partitions[:3]
    orders = [urls, urls[::-1], [urls[1], urls[2], urls[0]], urls]
    ids = [f"order-{i}" for i in range(250)]
    pairs = [ids[i:i + 2] for i in range(0, len(ids), 2)]
    rounds = [[[i] for i in ids[::2]],  # the even ids, alone
              pairs,  # each even id (a retry) with an odd one (new), whose home is often another partition
              [[i] for i in ids], [[i] for i in ids] + pairs]  # every id again, alone and paired
    accepted: list[str] = []
    with contextlib.ExitStack() as stack:
        for url in urls:
            stack.enter_context(null_worker(url))
        for order, submits in zip(orders, rounds):
            with Producer(order[0], shards={NULL: order}) as producer:
                for chosen in submits:
                    with contextlib.suppress(DuplicateRequestError):  # a retry: refused, all or part
                        accepted += producer.submit_many([[f"text of {i}"] for i in chosen], NULL,
                                                         request_ids=chosen)
    where = {}
    for url in urls:
        with redis.Redis.from_url(url) as client:
            for request_id in ids:
                if client.exists(rqkeys.rq_job_key(request_id)):
                    where.setdefault(request_id, []).append(url)
    assert where == {i: [partition_of(urls, i)] for i in ids}  # once each, on its home
    assert {len(v) for v in where.values()} == {1} and len({v[0] for v in where.values()}) == 3  # spread
    assert len(accepted) == len(set(accepted))  # no submit answered an id that was taken before
