"""Redis is the trust boundary: what a producer reads back from it is checked, ids are never reused, and
every key the producer side creates expires. Workers are stood in for by tests.answers."""

from __future__ import annotations

import asyncio

import httpx
import numpy as np
import pytest
import redis
from rq import Queue
from rq.job import Job

from embedfleet.common.errors import DecodeError, DuplicateRequestError, TimeoutError
from embedfleet.common.policy import JOB_TTL, RESULT_TTL
from embedfleet.common.protocol import enqueueing, keys
from embedfleet.common.protocol.jobdata import job_reply_to
from embedfleet.common.redisclient import connect_async
from embedfleet.common.redisserver import RedisServer
from embedfleet.common.request import EmbedRequest
from embedfleet.common.result import Result
from embedfleet.common.serializer import MsgpackSerializer
from embedfleet import AsyncProducer, Producer
from embedfleet.producer.gateway.core.service import save_job_options
from tests.acls import documented_acl
from tests.answers import MODEL, advertise, answer
from tests.gatewayserver import Server, settings



@pytest.fixture
def producer(redis_url, redis_client):
    advertise(redis_client)
    with Producer(redis_url) as producer:
        yield producer


def queue(producer: Producer) -> Queue:
    return Queue(keys.queue_name(MODEL), connection=producer.redis, serializer=MsgpackSerializer)


def test_an_enqueue_under_an_id_in_use_is_refused(producer, redis_client):
    finished, pending = producer.submit(["finished"], MODEL), producer.submit(["pending"], MODEL)
    answer(redis_client, [finished])
    stored = redis_client.get(keys.result_key(finished))
    for used in (finished, pending):
        thief = EmbedRequest(id=used, model=MODEL, inputs=["someone else's text"])
        with pytest.raises(DuplicateRequestError, match=used):
            enqueueing.enqueue(producer.redis, enqueueing.enqueue_args(  # all or none
                keys.queue_name(MODEL), [EmbedRequest(model=MODEL, inputs=["fresh"]), thief]))
    assert redis_client.get(keys.result_key(finished)) == stored
    assert queue(producer).job_ids == [finished, pending]  # the fresh request went in with nobody
    job = Job.fetch(pending, connection=redis_client, serializer=MsgpackSerializer)
    assert EmbedRequest.decode(job.args[0]).inputs == ["pending"]


def test_a_forged_reply_stream_entry_does_not_fail_an_async_wait(redis_url, redis_client, producer):
    async def main():
        async with AsyncProducer(redis_url) as aproducer:
            request_id = await aproducer.submit(["text"], MODEL)
            stream = job_reply_to(Job.fetch(request_id, connection=redis_client, serializer=MsgpackSerializer))
            waiting = asyncio.ensure_future(aproducer.wait(request_id, timeout=60))
            await asyncio.sleep(0.2)
            for fields in ({"id": request_id}, {"id": b"\xff\xfe"}, {"other": "field"}):
                redis_client.xadd(stream, fields)  # forged: no result behind them
            await asyncio.sleep(0.5)
            assert not waiting.done()
            await asyncio.to_thread(answer, redis_client, [request_id])
            return await asyncio.wait_for(waiting, 30)

    assert asyncio.run(main()).ok


def test_a_forged_wake_up_does_not_fail_a_wait(redis_url, redis_client, producer):
    request_id = producer.submit(["text"], MODEL)
    redis_client.rpush(keys.notify_key(request_id), 1)  # forged: the result is not there
    with pytest.raises(TimeoutError):  # not "result expired": the request is still queued
        producer.wait(request_id, timeout=0.5)

    async def main():
        async with AsyncProducer(redis_url) as aproducer:  # its notify-list path: an id it did not submit
            waiting = asyncio.ensure_future(aproducer.wait(request_id, timeout=60))
            await asyncio.sleep(0.2)
            redis_client.rpush(keys.notify_key(request_id), 1)
            await asyncio.sleep(0.5)
            assert not waiting.done()
            assert not redis_client.exists(keys.notify_key(request_id))  # dropped, not taken again and again
            await asyncio.to_thread(answer, redis_client, [request_id])
            return await asyncio.wait_for(waiting, 30)

    assert asyncio.run(main()).ok


def test_a_result_stored_under_another_requests_id_is_refused(producer, redis_client):
    request_id = producer.submit(["text"], MODEL)
    other = Result.success("someone-else", MODEL, np.ones((1, 4), np.float32), "float32", "little", 1)
    redis_client.set(keys.result_key(request_id), other.encode())
    with pytest.raises(DecodeError, match="names request 'someone-else'"):
        producer.get(request_id)


def _gateway_job(server, payload: dict) -> str:
    response = httpx.post(f"{server.url}/v1/jobs", json=payload, timeout=30)
    assert response.status_code == 202, response.text
    return response.json()["id"]


def test_a_jobs_options_expire_with_its_result(redis_url, redis_client, producer):
    server = Server(settings(redis_url))
    try:
        job_id = _gateway_job(server, {"input": "text", "model": MODEL, "encoding_format": "base64"})
        assert redis_client.ttl(keys.job_options_key(job_id)) > RESULT_TTL  # while it waits
        answer(redis_client, [job_id])
        assert 0 < redis_client.ttl(keys.job_options_key(job_id)) <= redis_client.ttl(keys.result_key(job_id))
        assert httpx.get(f"{server.url}/v1/jobs/{job_id}", timeout=30).json()["status"] == "finished"
    finally:
        server.stop()

    # Options saved after the result landed (the enqueue comes first) take the result's time left.
    late = producer.submit(["fast"], MODEL)
    answer(redis_client, [late])

    async def save():
        connection = connect_async(redis_url)
        await save_job_options(connection, late, "{}")
        await connection.aclose()

    asyncio.run(save())
    assert 0 < redis_client.ttl(keys.job_options_key(late)) <= redis_client.ttl(keys.result_key(late))


SHARED = ("rq:queues", f"rq:queue:{keys.queue_name(MODEL)}", f"rq:canceled:{keys.queue_name(MODEL)}",
          keys.MODELS_KEY, keys.queued_tokens_key(keys.queue_name(MODEL)))  # one counter per queue, like it


def test_every_key_the_producer_side_creates_expires(redis_url, redis_client, producer):
    server = Server(settings(redis_url))
    try:
        jobs = [_gateway_job(server, {"input": "text", "model": MODEL}) for _ in range(2)]
        assert httpx.delete(f"{server.url}/v1/jobs/{jobs[1]}", timeout=30).status_code == 200
        answer(redis_client, jobs[:1])
        httpx.get(f"{server.url}/v1/jobs/{jobs[0]}", timeout=30)
        httpx.get(f"{server.url}/v1/jobs/unknown", timeout=30)
    finally:
        server.stop()
    waited, cancelled = producer.submit(["a"], MODEL), producer.submit(["b"], MODEL)
    answer(redis_client, [waited])
    producer.wait(waited, timeout=10)
    assert producer.cancel(cancelled)

    async def async_side():
        async with AsyncProducer(redis_url) as aproducer:
            request_id = await aproducer.submit(["c"], MODEL)
            await asyncio.to_thread(answer, redis_client, [request_id])
            await aproducer.wait(request_id, timeout=10)

    asyncio.run(async_side())
    forever = {key.decode() for key in redis_client.scan_iter() if redis_client.ttl(key) == -1}
    assert forever <= set(SHARED), f"keys without a TTL: {sorted(forever - set(SHARED))}"
    longest = max(redis_client.ttl(key) for key in redis_client.scan_iter())
    assert longest <= JOB_TTL + RESULT_TTL


def _batch_runs(gateway: Server, worker) -> dict:
    """The Batch API as the recipe's producer user: upload, create, serve the lines with `worker` (a
    BatchWorker not yet started), read the counts."""
    import json
    import threading

    import openai

    from tests.harness import serve

    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0)
    lines = "".join(json.dumps({"custom_id": str(i), "method": "POST", "url": "/v1/embeddings",
                                "body": {"input": f"text {i}"}}) + "\n" for i in range(3))
    uploaded = client.files.create(file=("in.jsonl", lines.encode()), purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h")
    with serve(worker):
        for _ in range(1200):  # 60 s at most
            if batch.status in ("completed", "failed", "expired", "cancelled"):
                break
            batch = client.batches.retrieve(batch.id, timeout=30)
            threading.Event().wait(0.05)
        assert batch.status == "completed", batch
        assert len(client.files.content(batch.output_file_id).text.splitlines()) == 3
    return batch.request_counts.model_dump()


def test_the_documented_acl_recipe_runs_a_fleet(bert_mean):
    """Producer, AsyncProducer and gateway as `embedfleet-producer`, a worker batch as `embedfleet-worker`:
    everything works, Redis denied nothing, and each user is refused what it has no business doing."""
    from tests.harness import burst, idle_worker, worker
    from tests.tinymodels import engine_for

    passwords = {"producer": "p-secret", "worker": "w-secret"}
    with RedisServer() as server:
        admin = redis.Redis.from_url(server.url)
        for command in documented_acl(passwords):
            admin.execute_command(*command)
        as_producer = f"redis://embedfleet-producer:{passwords['producer']}@127.0.0.1:{server.port}/0"
        as_worker = f"redis://embedfleet-worker:{passwords['worker']}@127.0.0.1:{server.port}/0"
        held = idle_worker(engine_for(bert_mean), redis.Redis.from_url(as_worker))  # serves once all are queued
        gateway = Server(settings(as_producer))
        try:
            with Producer(as_producer) as producer:
                waited, cancelled = producer.submit(["sync"]), producer.submit(["cancel me"])
                assert producer.status(waited) == "queued" and producer.cancel(cancelled)
                job = _gateway_job(gateway, {"input": "over http"})

                async def async_side():
                    async with AsyncProducer(as_producer) as aproducer:
                        request_id = await aproducer.submit(["async"])
                        await asyncio.to_thread(burst, held)  # one burst serves all three
                        return await aproducer.wait(request_id, timeout=30)

                assert asyncio.run(async_side()).ok and producer.wait(waited, timeout=30).ok
            answered = httpx.get(f"{gateway.url}/v1/jobs/{job}", timeout=30)
            assert answered.status_code == 200 and answered.json()["status"] == "finished"
            serving = worker(engine_for(bert_mean), redis.Redis.from_url(as_worker))
            assert _batch_runs(gateway, serving) == {"total": 3, "completed": 3, "failed": 0}, admin.acl_log()
        finally:
            gateway.stop()
        # The one denial the recipe expects: each worker asks CONFIG GET proto-max-bulk-len once (to name Redis's
        # value limit in a too-large result's error), is refused (-@dangerous), and never asks again.
        denials = admin.acl_log()
        unexpected = [entry for entry in denials if _str(entry.get("object")) != "config|get"]
        assert unexpected == [], "Redis denied the recipe's users something they need"
        assert sum(int(entry["count"]) for entry in denials) <= 2, denials  # two workers, once each

        producer_redis, worker_redis = redis.Redis.from_url(as_producer), redis.Redis.from_url(as_worker)
        for denied in (lambda: producer_redis.set(keys.model_key("fake"), b"x"),
                       lambda: producer_redis.zadd(f"rq:wip:{keys.queue_name('x')}", {"id": 1}),
                       lambda: producer_redis.flushall(), lambda: worker_redis.flushall(),
                       lambda: worker_redis.config_get("*"), lambda: worker_redis.acl_list()):
            with pytest.raises(redis.exceptions.NoPermissionError):
                denied()


def _str(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
