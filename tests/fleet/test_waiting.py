"""Waiting that scales (issue #9): AsyncProducer waits, as_completed and results() against a real
redis-server and the real BatchWorker serving its null model (the queue path, no compute).

The producer connects as the documented `embedfleet-producer` ACL user (docs/security.md), so that CLIENT LIST tells its
connections apart from the worker's and the test's.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import redis
from rq.job import Job

from embedfleet.common.errors import NotFoundError, UnavailableError
from embedfleet import AsyncProducer, Producer
from embedfleet.common.protocol import keys, rqkeys
from embedfleet.producer.client.core import CAPS_CACHE_SECONDS
from tests.answers import MODEL, advertise, answer
from tests.acls import documented_acl
from tests.nullworker import NULL
from tests.nullworker import null_worker as serving_null_worker
WAITS = 10_000
FOREIGN = 2_000


@pytest.fixture
def producer_url(redis_url, redis_client) -> str:
    """The session's Redis as the documented producer user."""
    for command in documented_acl({"producer": "p-secret", "worker": "w-secret"}):
        redis_client.execute_command(*command)
    yield redis_url.replace("redis://", "redis://embedfleet-producer:p-secret@")
    redis_client.execute_command("ACL", "DELUSER", "embedfleet-producer", "embedfleet-worker")


def producer_connections(client: redis.Redis) -> int:
    return sum(1 for c in client.client_list() if c["user"] == "embedfleet-producer")


class Sampler:
    """The most producer connections CLIENT LIST showed, sampled every 20 ms in a thread."""

    def __init__(self, client: redis.Redis):
        self.client, self.peak, self.samples = client, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, producer_connections(self.client))
            self.samples += 1

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(5)
        return self.peak


@pytest.fixture
def null_worker(redis_url):
    with serving_null_worker(redis_url) as worker:
        yield worker


def test_10000_concurrent_waits_use_at_most_4_connections(producer_url, redis_client, null_worker):
    """Each of 10,000 coroutines submits one request and waits for it, all at once, beside 2,000 waits on
    requests another client submitted (the notify-list path); the producer's connections, submits
    included, never exceed 4, and results are read by MGETs, never one GET each."""
    sampler = Sampler(redis_client)
    with Producer(redis_url_of(producer_url)) as other:
        foreign = other.submit_many([[f"foreign {i}"] for i in range(FOREIGN)], NULL)

    async def one(producer, i):
        return await producer.wait(await producer.submit([f"text {i}"], NULL), timeout=240)

    async def main():
        async with AsyncProducer(producer_url) as producer:
            await producer.models()
            redis_client.config_resetstat()
            tasks = [asyncio.ensure_future(one(producer, i)) for i in range(WAITS)]
            tasks += [asyncio.ensure_future(producer.wait(i, timeout=240)) for i in foreign]
            while redis_client.llen("rq:queue:" + keys.queue_name(NULL)) < WAITS + FOREIGN:
                await asyncio.sleep(0.1)  # all submitted, none served yet
            null_worker.serve()
            return await asyncio.gather(*tasks)

    began = time.monotonic()
    try:
        results = asyncio.run(main())
    finally:
        peak = sampler.stop()
    elapsed = time.monotonic() - began
    stats = redis_client.info("commandstats")
    assert len(results) == WAITS + FOREIGN and all(r.ok and r.embeddings.shape == (1, 4) for r in results)
    assert len({r.id for r in results}) == WAITS + FOREIGN and [r.id for r in results[WAITS:]] == foreign
    assert sampler.samples > 10 and peak >= 3, "the sampler saw nothing: the test would prove nothing"
    assert peak <= 4, f"{peak} producer connections at peak for {WAITS + FOREIGN} waits"
    mgets = stats["cmdstat_mget"]["calls"]
    assert mgets < WAITS / 5, f"{mgets} MGETs for {WAITS} waits: reads are not coalesced"
    # The adverts too: 10,000 submits that find them stale together share one read (under load each used to
    # read them itself: 600 reads, each an SMEMBERS and an MGET).
    reads = stats["cmdstat_smembers"]["calls"]
    assert reads <= elapsed / CAPS_CACHE_SECONDS + 10, f"{reads} reads of the adverts in {elapsed:.0f} s"
    assert stats.get("cmdstat_get", {"calls": 0})["calls"] < 100  # a GET per wait would be 10,000


def test_a_result_that_landed_before_the_wait_began(redis_url, redis_client):
    """Own ids (whose reply came while nobody waited) and foreign ids alike return at once."""
    advertise(redis_client)
    with Producer(redis_url) as sync:
        foreign = sync.submit(["submitted elsewhere"], MODEL)

    async def main():
        async with AsyncProducer(redis_url) as producer:
            own = await producer.submit(["mine"], MODEL)
            answer(redis_client, [own, foreign])
            await asyncio.sleep(0.3)  # the reply stream entry came and went: nobody waited yet
            started = time.monotonic()
            results = [await producer.wait(i, timeout=30) for i in (own, foreign)]
            return results, time.monotonic() - started

    (own_result, foreign_result), took = asyncio.run(main())
    assert own_result.ok and foreign_result.ok and took < 5


def test_wake_ups_lost_while_the_listeners_reconnect_are_not_missed(producer_url, redis_client):
    """Both listeners lose their connections; while they cannot reconnect the results land and their
    wake-ups are lost (reply stream and notify lists deleted). The reconnect looks at every waited id."""
    advertise(redis_client)
    with Producer(redis_url_of(producer_url)) as sync:
        foreign = sync.submit_many([[f"elsewhere {i}"] for i in range(5)], MODEL)
    own_ids: list[str] = []

    async def main():
        async with AsyncProducer(producer_url) as producer:
            own = await producer.submit_many([[f"mine {i}"] for i in range(5)], MODEL)
            own_ids.extend(own)
            waits = [asyncio.ensure_future(producer.wait(i, timeout=60)) for i in [*own, *foreign]]
            deadline = time.monotonic() + 20
            while not {"xread", "blpop"} <= {c["cmd"] for c in redis_client.client_list()
                                             if c["user"] == "embedfleet-producer"}:
                assert time.monotonic() < deadline, "the two listeners never blocked"
                await asyncio.sleep(0.05)  # until both listeners wait
            redis_client.execute_command("ACL", "SETUSER", "embedfleet-producer", "off")
            redis_client.client_kill_filter(user="embedfleet-producer")
            await asyncio.to_thread(answer, redis_client, [*own, *foreign])
            stream = next(iter(producer._links.values())).replies.stream
            redis_client.delete(stream, *(keys.notify_key(i) for i in [*own, *foreign]))
            await asyncio.sleep(1.0)
            assert not any(w.done() for w in waits)  # nothing could wake them yet
            redis_client.execute_command("ACL", "SETUSER", "embedfleet-producer", "on")
            return await asyncio.wait_for(asyncio.gather(*waits), 30)

    results = asyncio.run(main())
    assert [r.id for r in results] == [*own_ids, *foreign] and all(r.ok for r in results)


def redis_url_of(producer_url: str) -> str:
    return producer_url.replace("embedfleet-producer:p-secret@", "")


def test_as_completed_yields_in_landing_order_failures_included(redis_url, redis_client):
    advertise(redis_client)

    async def main():
        async with AsyncProducer(redis_url) as producer:
            ids = await producer.submit_many([[f"text {i}"] for i in range(6)], MODEL)
            assert await producer.cancel(ids[2])  # its result is a "cancelled" error
            seen = []
            async for result in producer.as_completed(ids, timeout=30):
                seen.append(result)
                if len(seen) == 1:
                    await asyncio.to_thread(answer, redis_client, [ids[4]])
                elif len(seen) == 2:
                    await asyncio.to_thread(answer, redis_client, [i for i in ids if i not in (ids[2], ids[4])])
            with pytest.raises(TimeoutError, match="1 of 1 results did not land"):
                async for _ in producer.as_completed([await producer.submit(["never"], MODEL)], timeout=0.3):
                    pass
            return ids, seen

    ids, seen = asyncio.run(main())
    assert [r.id for r in seen[:2]] == [ids[2], ids[4]]
    assert sorted(r.id for r in seen) == sorted(ids)
    assert seen[0].error_code == "cancelled" and all(r.ok for r in seen[1:])


def test_results_yields_each_of_this_producers_results_once(redis_url, redis_client):
    advertise(redis_client)

    async def main():
        async with AsyncProducer(redis_url) as producer:
            with Producer(redis_url) as sync:
                foreign = sync.submit(["not ours"], MODEL)
            ids = await producer.submit_many([[f"text {i}"] for i in range(20)], MODEL)
            stream = producer.results()
            first = asyncio.ensure_future(stream.__anext__())
            await asyncio.sleep(0.2)
            await asyncio.to_thread(answer, redis_client, [foreign, *ids])
            seen = [await asyncio.wait_for(first, 10)]
            while len(seen) < len(ids):
                seen.append(await asyncio.wait_for(stream.__anext__(), 10))
            with pytest.raises(asyncio.TimeoutError):  # nothing more: no repeat, not the foreign one
                await asyncio.wait_for(stream.__anext__(), 0.5)
            await stream.aclose()
            return ids, seen

    ids, seen = asyncio.run(main())
    assert sorted(r.id for r in seen) == sorted(ids)


def test_coalesced_submits_fail_alone(redis_url, redis_client):
    """Callers whose submits share a transaction are refused one by one: past max_queue_depth in arrival
    order, and a taken id fails only its own caller."""
    from embedfleet.common.errors import DuplicateRequestError, QueueFullError
    from embedfleet.common.request import EmbedRequest
    from embedfleet.producer.client.asubmit import Submitter
    from redis.asyncio import Redis

    advertise(redis_client)

    async def main():
        async with AsyncProducer(redis_url, max_queue_depth=3) as producer:
            outcomes = await asyncio.gather(*(producer.submit([f"text {i}"], MODEL) for i in range(5)),
                                            return_exceptions=True)
        connection = Redis.from_url(redis_url)
        submitter = Submitter(connection, None)
        taken = outcomes[0]
        clash = EmbedRequest(id=taken, model=MODEL, inputs=["reuses an id"])
        fresh = EmbedRequest(model=MODEL, inputs=["fresh"])
        together = await asyncio.gather(submitter.submit(MODEL, [clash]), submitter.submit(MODEL, [fresh]),
                                        return_exceptions=True)
        await submitter.close()
        await connection.aclose()
        return outcomes, together, fresh.id

    outcomes, together, fresh = asyncio.run(main())
    accepted = [o for o in outcomes if isinstance(o, str)]
    refused = [o for o in outcomes if isinstance(o, QueueFullError)]
    assert len(accepted) == 3 and len(refused) == 2 and "the limit is 3" in refused[0].message
    assert isinstance(together[0], DuplicateRequestError) and together[1] is None
    queued = [i.decode() for i in redis_client.lrange("rq:queue:" + keys.queue_name(MODEL), 0, -1)]
    assert sorted(queued) == sorted([*accepted, fresh])


def test_a_notify_key_that_is_no_list_fails_no_other_wait(redis_url, redis_client):
    """Someone made one request's notify key a string: the one BLPOP over all notify lists would fail for
    every waiter; that id leaves it (its wait looks at its result instead) and the others still wake."""
    advertise(redis_client)
    with Producer(redis_url) as sync:
        spoiled, fine = sync.submit_many([["spoiled"], ["fine"]], MODEL)
    redis_client.set(keys.notify_key(spoiled), "not a list")

    async def main():
        async with AsyncProducer(redis_url) as producer:
            waits = [asyncio.ensure_future(producer.wait(i, timeout=30)) for i in (spoiled, fine)]
            await asyncio.sleep(0.5)
            await asyncio.to_thread(answer, redis_client, [spoiled, fine])
            # the publish's RPUSH was refused (WRONGTYPE, through lib.lua's pcall): no wake-up reached that list
            assert redis_client.get(keys.notify_key(spoiled)) == b"not a list"
            return await asyncio.wait_for(asyncio.gather(*waits), 20)

    assert [r.id for r in asyncio.run(main())] == [spoiled, fine]


def test_a_sync_wait_whose_job_vanishes_meanwhile_is_told_redis_lost_it(redis_url, redis_client):
    """The job was there when the wait began, then it is gone with no result (a Redis restarted without its
    data, a flush, an eviction: here its hash is deleted): the wait ends with a retryable UnavailableError when
    its BLPOP comes back, not a ResultTimeoutError, nor a 404-like NotFoundError."""
    advertise(redis_client)
    with Producer(redis_url) as producer:
        request_id = producer.submit(["nobody answers this"], MODEL)
        deleted = threading.Timer(0.5, redis_client.delete, [Job.key_for(request_id)])
        deleted.start()
        try:
            with pytest.raises(UnavailableError, match="is gone from Redis before its result was stored"):
                producer.wait(request_id, timeout=3)  # one BLPOP of 3 s, then the look that finds it gone
        finally:
            deleted.join()


def test_a_wait_on_a_job_that_vanished_is_not_found_at_once_in_both_clients(redis_url, redis_client):
    """The job hash is gone (deleted, or expired unserved) and no result landed: nothing will ever answer,
    so neither client waits out its timeout. A foreign id is not found; an own id (submitted by this
    AsyncProducer, which wakes through its reply stream, within the job's TTL) cannot have expired, so Redis
    lost it: a retryable UnavailableError (the gateway's 503). A 120 s timeout: a wait that waited would end
    in TimeoutError."""
    advertise(redis_client)
    with Producer(redis_url) as sync:
        foreign, by_sync = sync.submit_many([["submitted elsewhere"], ["waited by the sync client"]], MODEL)
        redis_client.delete(Job.key_for(foreign), Job.key_for(by_sync))
        with pytest.raises(NotFoundError, match="never submitted, or it expired") as sync_error:
            sync.wait(by_sync, timeout=120)

    async def main():
        async with AsyncProducer(redis_url) as producer:
            own = await producer.submit(["mine"], MODEL)
            redis_client.delete(Job.key_for(own))
            outcomes = await asyncio.gather(*(producer.wait(i, timeout=120) for i in (own, foreign)),
                                            return_exceptions=True)
            return dict(zip((own, foreign), outcomes))

    outcomes = asyncio.run(main())
    own, foreign_outcome = outcomes.values()
    assert isinstance(foreign_outcome, NotFoundError), outcomes
    assert foreign_outcome.message == f"no request with id {foreign} (never submitted, or it expired)"
    assert foreign_outcome.param == sync_error.value.param == "id"
    assert isinstance(own, UnavailableError) and own.code == "redis_unavailable", outcomes
    assert "is gone from Redis before its result was stored" in own.message and "send it again" in own.message


def test_a_job_key_of_a_foreign_type_fails_its_wait_alone_in_both_clients(redis_url, redis_client, null_worker):
    """Someone wrote a string at an id's rq job key (Redis is input): a wait for that id fails alone with a
    NotFoundError that says so, in both clients; the AsyncProducer's reader goes on (before, its first look's
    WRONGTYPE killed the reader and failed every later wait of the producer); status says not_found and a
    cancel finds no request."""
    spoiled = "spoiled-id"
    redis_client.set(rqkeys.rq_job_key(spoiled), "not a hash")
    null_worker.serve()

    async def main():
        async with AsyncProducer(redis_url) as producer:
            with pytest.raises(NotFoundError, match="holds no job"):
                await producer.wait(spoiled, timeout=30)
            assert await producer.status(spoiled) == "not_found"
            fine = await producer.submit(["fine"], NULL)
            return await producer.wait(fine, timeout=30)

    assert asyncio.run(main()).ok
    with Producer(redis_url) as producer:
        with pytest.raises(NotFoundError, match=f"no request with id {spoiled}"):
            producer.wait(spoiled, timeout=30)
        assert producer.status(spoiled) == "not_found"
        with pytest.raises(NotFoundError, match=f"no request with id {spoiled}"):
            producer.cancel(spoiled)
        assert producer.wait(producer.submit(["fine"], NULL), timeout=30).ok


def test_a_read_redis_refuses_fails_its_waits_and_the_reader_goes_on(redis_url, redis_client, null_worker):
    """Redis refuses one of the reader's commands (here an ACL without EXISTS, which a first look without a
    result sends): those waits fail with an UnavailableError that quotes Redis; the reader goes on, and a later
    wait whose result is in is answered (before, the reader died and every later wait failed)."""
    null_worker.serve()
    with Producer(redis_url) as producer:
        done = producer.submit(["answered"], NULL)
        assert producer.wait(done, timeout=30).ok
    redis_client.execute_command("ACL", "SETUSER", "no-exists", "on", ">n-secret", "~*", "&*", "+@all", "-exists")
    try:
        async def main():
            async with AsyncProducer(redis_url.replace("redis://", "redis://no-exists:n-secret@")) as producer:
                with pytest.raises(UnavailableError, match="Redis refused reading the result: .*exists"):
                    await producer.wait("never-submitted", timeout=30)
                return await producer.wait(done, timeout=30)

        assert asyncio.run(main()).id == done
    finally:
        redis_client.execute_command("ACL", "DELUSER", "no-exists")
