"""What a request costs Redis (issue 38), and what the lean records (--rq-records lean, the default) still give
users and rq's tools: commands per request on the whole path (the producer's wait included) within the issue's
targets, counted by the server (INFO commandstats, those run inside scripts included); `rq info` lists the
queues a producer used, and lists them again after Redis lost its list; a request wakes on one path only, and
a waiter that did not submit it finds that path (another producer's reply stream, or the notify list).

The reliability side of lean runs in the suites it belongs to, each on the lean default: a killed worker's
jobs (tests/faults/test_leases.py, lean and full), poison (tests/faults/test_leases.py), cancel
(tests/fleet/test_producer.py, tests/fleet/test_contract.py), drain (tests/faults/test_leases.py), a Redis
restart (tests/faults/test_faults.py, tests/faults/test_reconnect.py); and lean's contract against full's and
rq's own records: tests/fleet/test_contract.py.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading

import redis

from embedfleet import AsyncProducer, Producer
from embedfleet.common.policy import RESULT_TTL
from embedfleet.common.protocol import keys, rqkeys
from tests.nullworker import NULL, null_worker
from tests.commands import wait_for

SYNC_REQUESTS, ASYNC_REQUESTS = 40, 256
# the issue's targets; the counts today: 23 and ~7.5 (before issue 38: 82 and 32)
SYNC_COMMANDS, ASYNC_COMMANDS = 25, 10


def commands(conn: redis.Redis) -> int:
    """Commands the server has run (its INFO commandstats: commands inside scripts included)."""
    return sum(stats["calls"] for name, stats in conn.info("commandstats").items() if name != "cmdstat_info")


def test_a_request_costs_redis_at_most_the_issues_commands(redis_url, redis_client):
    """One at a time through Producer.embed and many in flight through AsyncProducer.embed, against a real
    worker (the null model, lean records): commands per request, everything counted, the worker's heartbeat
    included (a few commands a second)."""
    with null_worker(redis_url) as worker, Producer(redis_url) as producer:
        worker.serve()
        producer.embed("warm", NULL, timeout=30)  # scripts loaded, adverts read
        before = commands(redis_client)
        for i in range(SYNC_REQUESTS):
            assert producer.embed(f"one at a time {i}", NULL, timeout=30).shape == (1, 4)
        sync = (commands(redis_client) - before) / SYNC_REQUESTS

        async def many() -> float:
            async with AsyncProducer(redis_url) as aproducer:
                await aproducer.embed("warm", NULL, timeout=30)
                start = commands(redis_client)
                vectors = await asyncio.gather(*(aproducer.embed(f"in flight {i}", NULL, timeout=60)
                                                 for i in range(ASYNC_REQUESTS)))
                assert all(v.shape == (1, 4) for v in vectors)
                return (commands(redis_client) - start) / ASYNC_REQUESTS

        in_flight = asyncio.run(many())
    print(f"\nRedis commands per request: sync one at a time {sync:.1f}, async in flight {in_flight:.1f}")
    assert sync <= SYNC_COMMANDS and in_flight <= ASYNC_COMMANDS, (sync, in_flight)


def rq_info(url: str) -> str:
    """`rq info --raw` as an operator runs it."""
    done = subprocess.run([sys.executable, "-m", "rq.cli", "info", "--raw", "--url", url], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_rq_info_lists_the_queues_a_lean_fleet_uses_even_after_redis_lost_the_list(redis_url, redis_client):
    """A producer lists a queue in rq:queues with its first enqueue there (not with every one); the workers'
    beats list their queues again, should Redis lose the list (a flush, a restart without its data)."""
    queue = keys.queue_name(NULL)
    with null_worker(redis_url) as worker, Producer(redis_url) as producer:
        ids = producer.submit_many([["a"], ["b"]], NULL)
        assert f"queue {queue} 2, 0 executing, 0 finished, 0 failed" in rq_info(redis_url)
        redis_client.delete(rqkeys.RQ_QUEUES)  # Redis lost it (the producer listed it once, and is done)
        worker.recover()  # what each beat of a worker runs (every third of its lease)
        assert f"queue {queue} 2, 0 executing" in rq_info(redis_url)
        worker.serve()
        assert all(producer.wait(i, timeout=30).ok for i in ids)


def test_a_request_wakes_on_its_own_path_and_a_waiter_that_did_not_submit_it_finds_that_path(redis_url,
                                                                                          redis_client):
    """An AsyncProducer's request wakes on its reply stream only, a Producer's on its notify list only; the
    other client waiting for it (as the gateway's GET /v1/jobs/{id}?wait does on another replica) reads the
    request's job to learn which, and is woken there."""
    with null_worker(redis_url) as worker, Producer(redis_url) as sync:
        by_sync = sync.submit(["submitted by the sync client"], NULL)

        async def main():
            async with AsyncProducer(redis_url) as submitter, AsyncProducer(redis_url) as other:
                by_async = await submitter.submit(["submitted by an async client"], NULL)
                waits = [asyncio.ensure_future(other.wait(by_async, timeout=30)),  # another's reply stream
                         asyncio.ensure_future(other.wait(by_sync, timeout=30)),  # a notify list
                         asyncio.ensure_future(asyncio.to_thread(sync.wait, by_async, 30))]  # the stream, sync
                await asyncio.sleep(0.3)  # every wait has looked and found nothing: each waits on its path
                assert not any(w.done() for w in waits)
                worker.serve()
                results = await asyncio.gather(*waits)
                woken = [fields[b"id"].decode() for _, fields in redis_client.xrange(submitter._links[
                    redis_url].replies.stream) if b"id" in fields]  # before the producer goes (and its stream)
                return by_async, results, woken

        by_async, results, woken = asyncio.run(main())
        assert [r.id for r in results] == [by_async, by_sync, by_async] and all(r.ok for r in results)
        assert woken == [by_async]  # one wake-up each, on its own path
        assert not redis_client.exists(keys.notify_key(by_async))
        assert redis_client.lrange(keys.notify_key(by_sync), 0, -1) == [b"1"]


def test_the_wake_up_stays_for_every_sync_waiter_of_one_request(redis_url):
    """Producer.wait moves the notify list's element onto the same list (BLMOVE): two clients waiting for one
    request both wake, and the list keeps its TTL."""
    with null_worker(redis_url) as worker, Producer(redis_url) as first, Producer(redis_url) as second:
        request_id = first.submit(["waited for twice"], NULL)
        results = []
        threads = [threading.Thread(target=lambda p=p: results.append(p.wait(request_id, timeout=30)))
                   for p in (first, second)]
        for thread in threads:
            thread.start()
        worker.serve()
        for thread in threads:
            thread.join(40)
        assert [r.id for r in results] == [request_id] * 2
        wait_for(lambda: 0 < redis.Redis.from_url(redis_url).ttl(keys.notify_key(request_id)) <= RESULT_TTL)
