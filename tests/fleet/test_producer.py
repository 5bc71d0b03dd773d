"""Producer end to end: real redis-server, real rq, the real BatchWorker and Engine on all-MiniLM-L6-v2."""

from __future__ import annotations

import asyncio
import builtins
import threading
import time

import numpy as np
import pytest
from rq import Queue
from rq.job import Job, JobStatus
from sentence_transformers import SentenceTransformer

from embedfleet.common.errors import (CancelledError, InputTooLongError, NotFoundError, NoWorkerError, TimeoutError,
                                      UnavailableError, UnknownModelError, ValidationError)
from embedfleet.common.params import PoolingParams
from embedfleet.common.policy import RESULT_TTL
from embedfleet.common.protocol import keys
from embedfleet.common.protocol.jobdata import JOB_FUNC
from embedfleet.common.result import Result
from embedfleet.common.serializer import MsgpackSerializer
from embedfleet import AsyncProducer, Producer
from embedfleet.producer.client.core import looked_at
from tests import harness
from tests.harness import burst
from tests.realtexts import corpus_texts

ROUNDS = 25  # closes with a read in flight (before the fix, one of about ten hung)


@pytest.fixture(scope="module")
def reference(minilm_path):
    return SentenceTransformer(minilm_path, device="cpu")


@pytest.fixture
def producer(redis_url):
    with Producer(redis_url) as producer:
        yield producer


@pytest.fixture
def idle_worker(engine, redis_client):
    """A registered, advertised worker that has not started serving: requests stay pending."""
    return harness.idle_worker(engine, redis_client)


@pytest.fixture
def serving_worker(fleet, engine):
    """A worker serving in a thread until the test ends."""
    return fleet.serve(engine)


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def test_embed_matches_sentence_transformers_on_varied_real_texts(producer, serving_worker, reference):
    texts = corpus_texts()
    assert len(texts) >= 50
    assert max(len(reference.tokenizer(t)["input_ids"]) for t in texts) > reference.max_seq_length

    vectors = producer.embed(texts, truncate_prompt_tokens=-1)

    expected = reference.encode(texts)
    assert vectors.shape == expected.shape == (len(texts), 384) and vectors.dtype == np.float32
    assert cosines(vectors, expected).min() >= 0.99999


def test_requests_submitted_before_a_worker_starts_are_batched(producer, engine, idle_worker, redis_client):
    texts = corpus_texts()
    batches = [texts[i % len(texts): i % len(texts) + 1 + i % 3] for i in range(40)]
    ids = producer.submit_many(batches, "minilm", truncate_prompt_tokens=-1)
    assert len(ids) == 40 and all(producer.get(i) is None for i in ids)
    passes = engine.forward_passes

    burst(idle_worker)

    used = engine.forward_passes - passes
    assert used < len(ids), f"{used} forward passes for {len(ids)} requests"
    for request_id, batch in zip(ids, batches):
        alone = engine.run([producer_request(batch)])[0].embeddings
        assert cosines(producer.wait(request_id, 5).embeddings, alone).min() >= 0.99999


def producer_request(texts):
    from embedfleet.common.params import PoolingParams
    from embedfleet.common.request import EmbedRequest

    return EmbedRequest(model="minilm", inputs=texts, params=PoolingParams(truncate_prompt_tokens=-1))


def test_pending_request_get_none_wait_times_out_then_result_expires(producer, idle_worker, redis_client):
    request_id = producer.submit(["pending for now"])
    assert producer.get(request_id) is None
    assert producer.status(request_id) == "queued"
    with pytest.raises(TimeoutError, match=rf"no result for request {request_id} after 0.3 s \(status: queued\)"):
        producer.wait(request_id, timeout=0.3)

    burst(idle_worker)

    result = producer.wait(request_id, timeout=5)
    assert result.ok and result.model == "minilm" and result.embeddings.shape == (1, 384)
    assert result.usage.prompt_tokens == 5  # [CLS] pending for now [SEP]
    assert producer.status(request_id) == "finished"
    assert 0 < redis_client.ttl(keys.result_key(request_id)) <= RESULT_TTL
    assert 0 < redis_client.ttl(keys.notify_key(request_id)) <= RESULT_TTL


def test_our_timeout_is_the_builtin_timeout_error(producer, idle_worker):
    request_id = producer.submit(["nobody serves this yet"])
    with pytest.raises(builtins.TimeoutError) as caught:  # what `except TimeoutError` in user code means
        producer.wait(request_id, timeout=0.2)
    assert caught.value.code == "timeout" and isinstance(caught.value, TimeoutError)


def test_wait_on_an_id_never_submitted_is_not_found_at_once(producer, idle_worker):
    # A 120 s timeout: were the id waited for, the test would end in TimeoutError, not NotFoundError.
    with pytest.raises(NotFoundError, match="never submitted") as caught:
        producer.wait("0123456789abcdef", timeout=120)
    assert caught.value.param == "id"

    async def wait_async():
        async with AsyncProducer(producer.redis_url) as aio:
            await aio.wait("0123456789abcdef", timeout=120)

    with pytest.raises(NotFoundError, match="never submitted"):
        asyncio.run(wait_async())


def test_dimensions_equal_to_the_full_size_is_a_no_op_on_a_non_matryoshka_model(producer, serving_worker):
    full = producer.embed(["the full vector"], dimensions=384, timeout=60)
    np.testing.assert_allclose(full, producer.embed(["the full vector"], timeout=60), atol=1e-6)
    with pytest.raises(ValidationError, match="send 384"):
        producer.submit("x", dimensions=64)


def test_wait_longer_than_redis_py_default_socket_timeout(producer, idle_worker):
    """redis-py 8 times sockets out after 5 s by default: a long wait must still end in our TimeoutError."""
    request_id = producer.submit(["nobody serves this yet"])
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        producer.wait(request_id, timeout=6)
    assert time.monotonic() - started >= 6


def test_wait_wakes_on_the_result_without_polling(producer, engine, redis_client):
    def calls(command: str) -> int:
        return int(redis_client.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0))

    # --no-cache: the GETs counted must be the waiter's; the worker's in-flight dedup reads its markers with GET
    held = harness.idle_worker(engine, redis_client, cache=False)
    request_id = producer.submit("wake me up")
    gets, blmoves = calls("get"), calls("blmove")
    late = threading.Timer(1.5, burst, args=(held,))  # the result lands later
    late.start()
    assert producer.wait(request_id, timeout=30).ok
    late.join(30)
    assert calls("blmove") - blmoves >= 1  # the notify list moved onto itself: the wake-up stays for others
    assert calls("get") - gets <= 2, "wait polled for the result instead of blocking on its notify list"


def test_unknown_model_fails_at_submit_and_nothing_is_enqueued(producer, idle_worker, redis_client):
    with pytest.raises(UnknownModelError, match=r"model 'nope' is not served .* served models: \['minilm'\]"):
        producer.submit("x", model="nope")
    assert not redis_client.keys("rq:queue:*")


def test_no_worker_at_all_fails_at_submit(producer, redis_url):
    with pytest.raises(NoWorkerError, match="no worker is alive") as caught:
        producer.submit("x")
    # it names the Redis it looked at (often not the fleet's: some other program's) and what to do
    assert f"on Redis {redis_url}" in caught.value.message and "`make up`" in caught.value.message
    assert "--redis-url" in caught.value.message
    with pytest.raises(UnknownModelError, match=f"not served on Redis {redis_url}: no worker is alive there"):
        producer.submit("x", model="all-MiniLM-L6-v2")

    async def submit_async():
        async with AsyncProducer(redis_url) as aio:
            await aio.submit("x")

    with pytest.raises(NoWorkerError, match=f"on Redis {redis_url}: no worker is alive there; start the fleet"):
        asyncio.run(submit_async())


def test_no_worker_names_the_redis_without_its_password(configured_redis):
    server = configured_redis("user fleet on >s3cret-pw ~* &* +@all")
    url = server.url.replace("redis://", "redis://fleet:s3cret-pw@")
    with Producer(url) as producer, pytest.raises(NoWorkerError) as caught:
        producer.submit("x")
    assert "s3cret-pw" not in caught.value.message
    assert f"redis://fleet:***@127.0.0.1:{server.port}/0" in caught.value.message, caught.value.message


def test_the_fallback_url_is_said_to_be_one():
    assert "the fallback URL" in looked_at(["redis://127.0.0.1:6379/0"])
    assert looked_at(["redis://127.0.0.1:6390/0", "redis://u:pw@10.0.0.2:6379/1"]) == \
        "Redis redis://127.0.0.1:6390/0, redis://u:***@10.0.0.2:6379/1"


def test_invalid_params_fail_at_submit_with_what_is_allowed(producer, idle_worker):
    with pytest.raises(ValidationError, match=r"`dimensions` is not supported by model 'minilm'.*384"):
        producer.submit("x", dimensions=64)
    with pytest.raises(ValidationError, match=r"truncate_prompt_tokens.*-1 .*positive integer"):
        producer.submit("x", truncate_prompt_tokens=0)
    with pytest.raises(ValidationError, match=r"embed_dtype.*float32"):
        producer.submit("x", embed_dtype="float64")
    with pytest.raises(ValidationError, match=r"embed_dtype.*float32"):  # fields on top of params too
        producer.submit("x", params=PoolingParams(use_activation=False), embed_dtype="float64")
    for bad_input in (5, None, {"a": 1}, [1.5]):
        with pytest.raises(ValidationError, match="input"):
            producer.submit(bad_input)


def test_over_long_input_fails_alone_with_the_limit(producer, idle_worker):
    long_text = "many words " * 300
    bad = producer.submit([long_text])
    good = producer.submit(["fine"])
    burst(idle_worker)

    with pytest.raises(InputTooLongError, match=r"256") as info:
        producer.wait(bad, 5)
    assert "truncate_prompt_tokens" in info.value.message and "602" in info.value.message
    assert producer.status(bad) == "failed"
    assert producer.wait(good, 5).ok


def test_malformed_message_fails_its_job_and_the_worker_goes_on(producer, idle_worker, redis_client):
    good = producer.submit(["before"])
    queue = Queue(keys.queue_name("minilm"), connection=redis_client, serializer=MsgpackSerializer)
    queue.enqueue(JOB_FUNC, b"\xc1 not msgpack", job_id="garbage")
    after = producer.submit(["after"])
    burst(idle_worker)

    assert producer.wait(good, 5).ok and producer.wait(after, 5).ok
    job = queue.fetch_job("garbage")
    assert job.get_status() == JobStatus.FAILED
    assert "malformed embed request" in job.latest_result().exc_string
    blob = Result.decode(redis_client.get(keys.result_key("garbage")))
    assert blob.error_code == "decode_error"


def test_cancel_a_pending_request(producer, idle_worker):
    request_id = producer.submit(["never mind"])
    assert producer.cancel(request_id) is True
    assert producer.status(request_id) == "cancelled"
    queue = Queue(keys.queue_name("minilm"), connection=producer.redis, serializer=MsgpackSerializer)
    assert queue.fetch_job(request_id).get_status() == JobStatus.CANCELED  # rq agrees
    assert request_id in queue.canceled_job_registry.get_job_ids() and len(queue) == 0
    assert producer.cancel(request_id) is False
    burst(idle_worker)
    assert producer.get(request_id).error_code == "cancelled"


def test_async_producer_embeds_concurrently(redis_url, serving_worker, reference):
    texts = [f"async request number {i}" for i in range(12)]

    async def main():
        async with AsyncProducer(redis_url) as producer:
            vectors = await asyncio.gather(*(producer.embed([t]) for t in texts))
            result = await producer.wait(await producer.submit(texts[:2]), timeout=30)
            return vectors, result

    vectors, result = asyncio.run(main())
    assert cosines(np.concatenate(vectors), reference.encode(texts)).min() >= 0.99999
    tokens = sum(len(reference.tokenizer(t)["input_ids"]) for t in texts[:2])
    assert result.model == "minilm" and result.usage.prompt_tokens == tokens and result.embeddings.shape == (2, 384)


def test_async_waiters_share_one_reply_connection(redis_url, redis_client, idle_worker, producer):
    """A hundred pending waits hold one blocked connection (the reply stream), not a hundred BLPOPs."""
    foreign = producer.submit(["submitted by another producer"])  # waited on through its notify list

    async def main():
        async with AsyncProducer(redis_url) as aproducer:
            ids = [await aproducer.submit([f"text {i}"]) for i in range(100)]
            waits = [asyncio.ensure_future(aproducer.wait(i, timeout=60)) for i in [*ids, foreign]]
            await asyncio.sleep(0.5)
            blocked = int(redis_client.info("clients")["blocked_clients"])
            serve = asyncio.get_running_loop().run_in_executor(None, burst, idle_worker)
            results = await asyncio.gather(*waits)
            await serve
            return blocked, results

    blocked, results = asyncio.run(main())
    assert blocked == 2, f"{blocked} blocked Redis clients for 101 waiters"  # the stream + the foreign BLPOP
    assert len(results) == 101 and all(r.ok and r.embeddings.shape == (1, 384) for r in results)


def test_cancel_from_elsewhere_wakes_an_async_waiter(redis_url, idle_worker, producer):
    async def main():
        async with AsyncProducer(redis_url) as aproducer:
            request_id = await aproducer.submit(["cancel me"])
            waiting = asyncio.ensure_future(aproducer.wait(request_id, timeout=30))
            await asyncio.sleep(0.2)
            started = time.monotonic()
            assert await asyncio.to_thread(producer.cancel, request_id)  # another client's cancel
            with pytest.raises(CancelledError, match="cancelled before a worker took it"):
                await waiting
            return time.monotonic() - started

    assert asyncio.run(main()) < 10  # woken by the reply stream, not by its 30 s timeout


def test_many_foreign_long_polls_do_not_starve_other_commands(redis_url, idle_worker, producer):
    """Waits on ids another producer submitted BLPOP on a pool of their own; more of them than the pool
    holds queue for a slot, and every one still gets its result."""
    foreign = producer.submit_many([[f"foreign {i}"] for i in range(80)])

    async def main():
        async with AsyncProducer(redis_url) as aproducer:
            waits = [asyncio.ensure_future(aproducer.wait(i, timeout=60)) for i in foreign]
            await asyncio.sleep(0.5)
            assert await asyncio.wait_for(aproducer.get(foreign[0]), 5) is None  # not stuck behind BLPOPs
            assert await asyncio.wait_for(aproducer.status(foreign[0]), 5) == "queued"
            serve = asyncio.get_running_loop().run_in_executor(None, burst, idle_worker)
            results = await asyncio.gather(*waits)
            await serve
            return results

    results = asyncio.run(main())
    assert [r.id for r in results] == foreign and all(r.ok for r in results)


def test_closing_an_async_producer_fails_its_pending_waits_at_once(redis_url, idle_worker):
    async def main():
        producer = AsyncProducer(redis_url)
        waiting = asyncio.ensure_future(producer.wait(await producer.submit(["never served"]), timeout=60))
        await asyncio.sleep(0.2)
        await producer.close()
        with pytest.raises(UnavailableError, match="closed while waiting"):
            await asyncio.wait_for(waiting, 10)

    asyncio.run(main())


def test_closing_the_hub_ends_its_reader_even_with_a_read_in_flight(redis_url, redis_client):
    """close() cancels the reader while its read may be on the wire and the connection closes under it:
    redis-py can take that cancel, and a reader that then went back to wait for work hung the event loop's
    shutdown (asyncio.run waited for it for ever). Bounded: ROUNDS closes, each reader must end in 10 s."""
    from embedfleet.common.redisclient import close_async, connect_async
    from embedfleet.producer.client.waiters import WaitHub

    async def status(request_id):
        return "queued"

    async def once(n: int) -> None:
        connection = connect_async(redis_url)
        hub = WaitHub(connection, status)
        landed, pending = f"landed-{n}", f"pending-{n}"
        hub.expect([landed, pending])
        for request_id in (landed, pending):
            redis_client.hset(Job.key_for(request_id), "status", "queued")
        waits = hub.watch(landed), hub.watch(pending)
        blob = Result.success(landed, "m", np.ones((1, 2), np.float32), "float32", "little", 1).encode()
        redis_client.set(keys.result_key(landed), blob)
        hub.recheck()  # a read of both: the result of one, then a look at the other's job
        await asyncio.wait_for(waits[0], 10)
        reader = hub._task
        hub.close(UnavailableError("closed"))  # the look at the other's job may be in flight now
        await close_async(connection)
        await asyncio.wait_for(asyncio.gather(reader, return_exceptions=True), 10)
        assert isinstance(waits[1].exception(), UnavailableError)

    for n in range(ROUNDS):
        asyncio.run(once(n))


def test_a_recheck_wakes_waiters_whose_reply_was_lost_in_an_outage(redis_url, redis_client):
    """After a listener reconnects the hub looks at its waiters' result keys: a stream entry lost with a
    restarted Redis (or trimmed meanwhile) must not leave a waiter hanging."""
    from embedfleet.common.redisclient import close_async, connect_async
    from embedfleet.producer.client.waiters import WaitHub

    async def status(request_id):
        return "queued"

    async def main():
        connection = connect_async(redis_url)
        hub = WaitHub(connection, status)
        hub.expect(["landed", "pending"])  # ours: a first look that finds nothing waits for the stream
        for request_id in ("landed", "pending"):  # ...once it finds their jobs (an id without one fails)
            redis_client.hset(Job.key_for(request_id), "status", "queued")
        landed, pending = hub.watch("landed"), hub.watch("pending")
        await asyncio.sleep(0.2)
        assert not landed.done() and not pending.done()
        blob = Result.success("landed", "m", np.ones((1, 2), np.float32), "float32", "little", 1).encode()
        redis_client.set(keys.result_key("landed"), blob)  # its reply stream entry never came
        hub.recheck()
        assert (await asyncio.wait_for(landed, 5)).id == "landed"
        assert not pending.done()
        hub.close(UnavailableError("closed"))
        assert isinstance(pending.exception(), UnavailableError)
        await close_async(connection)

    asyncio.run(main())
