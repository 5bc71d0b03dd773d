"""A worker dying mid-batch: rq's maintenance recovers its jobs (Retry or failure) and producers get an answer.
Also: the background heartbeat thread's death is noticed."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest
from rq import Retry
from rq.job import JobStatus

from embedfleet.common.errors import InternalError
from embedfleet.common.protocol.keys import result_key
from embedfleet.common.protocol.records import RQ_RECORDS
from embedfleet.common.request import EmbedRequest
from embedfleet.common.result import Result
from embedfleet import AsyncProducer
from tests import harness
from tests.harness import burst
from tests.commands import wait_for
from tests.rqjobs import enqueue, rq_queue
from embedfleet.worker.serving.heartbeat import Heartbeat


@pytest.mark.parametrize("records", RQ_RECORDS)
def test_abandoned_batch_is_failed_or_retried_by_rq_maintenance(engine, redis_client, records):
    model = engine.caps.name
    lost, retried = (EmbedRequest(model=model, inputs=[text]) for text in ("lost", "retried"))
    enqueue(redis_client, lost)
    enqueue(redis_client, retried, retry=Retry(max=1))

    dead = harness.worker(engine, redis_client, rq_records=records)  # takes the batch, marks it started, "dies"
    assert dead.take_round(None).size == 2  # started in Redis as it was taken
    queue = rq_queue(redis_client, model)
    assert set(queue.started_job_registry.get_job_ids()) == {lost.id, retried.id}
    assert redis_client.llen(queue.intermediate_queue_key) == 0
    for member in redis_client.zrange(queue.started_job_registry.key, 0, -1):  # its heartbeats stopped
        redis_client.zadd(queue.started_job_registry.key, {member: 1})

    rescuer = harness.worker(engine, redis_client, rq_records=records)
    rescuer.run_maintenance_tasks()  # rq's StartedJobRegistry.cleanup, as every worker runs it

    assert queue.fetch_job(lost.id).get_status() == JobStatus.FAILED
    assert "AbandonedJobError" in queue.fetch_job(lost.id).latest_result().exc_string
    answer = Result.decode(redis_client.get(result_key(lost.id)))
    assert answer.error_code == "internal_error" and "died" in answer.error_message
    assert queue.get_job_ids() == [retried.id] and not redis_client.exists(result_key(retried.id))

    burst(rescuer)
    assert Result.decode(redis_client.get(result_key(retried.id))).ok
    served = queue.fetch_job(retried.id)  # lean: a served job's answer is its record
    assert served.get_status() == JobStatus.FINISHED if records == "full" else served is None


def test_an_async_waiter_is_woken_when_maintenance_fails_its_abandoned_request(
        engine, redis_url, redis_client):
    dead = harness.idle_worker(engine, redis_client)  # the producer enqueues only for a served model

    async def main():
        async with AsyncProducer(redis_url) as producer:  # waits on its reply stream, not on BLPOP
            request_id = await producer.submit(["abandoned"], engine.caps.name)
            redis_client.hdel(f"rq:job:{request_id}", "retries_left")  # no Retry left: it will fail
            dead.take_round(None)  # ... and the worker "dies"
            queue = rq_queue(redis_client, engine.caps.name)
            for member in redis_client.zrange(queue.started_job_registry.key, 0, -1):
                redis_client.zadd(queue.started_job_registry.key, {member: 1})

            waiter = asyncio.ensure_future(producer.wait(request_id, timeout=20))
            await asyncio.sleep(0.2)
            assert not waiter.done()
            await asyncio.to_thread(harness.worker(engine, redis_client).run_maintenance_tasks)
            with pytest.raises(InternalError, match="died"):  # not TimeoutError: the reply stream woke it
                await waiter
            return queue.fetch_job(request_id).get_status()

    assert asyncio.run(main()) == JobStatus.FAILED


def test_ids_stranded_in_the_intermediate_list_are_failed_with_an_answer(engine, redis_client):
    reply = "embedfleet:replies:test"
    request = EmbedRequest(model=engine.caps.name, inputs=["stranded"], reply_to=reply)
    enqueue(redis_client, request)
    queue = rq_queue(redis_client, request.model)
    # rq's own dequeue (BLMOVE into the intermediate list) by a consumer that died before starting it
    assert redis_client.lmove(queue.key, queue.intermediate_queue_key, "LEFT", "RIGHT") == request.id.encode()
    intermediate = queue.intermediate_queue
    rescuer = harness.worker(engine, redis_client)
    rescuer.run_maintenance_tasks()  # rq first only notes when it saw the id ...
    assert redis_client.lrange(queue.intermediate_queue_key, 0, -1) == [request.id.encode()]
    redis_client.set(intermediate.get_first_seen_key(request.id), time.time() - 120)  # ... a minute ago
    rescuer.run_maintenance_tasks()

    assert redis_client.llen(queue.intermediate_queue_key) == 0
    assert queue.fetch_job(request.id).get_status() == JobStatus.FAILED
    answer = Result.decode(redis_client.get(result_key(request.id)))
    assert answer.error_code == "internal_error" and "stuck in the intermediate list" in answer.error_message
    assert [fields for _, fields in redis_client.xrange(reply)] == [{b"id": request.id.encode()}]


class Crash(BaseException):
    """Escapes the beat's `except Exception`, as a bug or an interpreter-level error would."""


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_heartbeat_thread_logs_failures_and_a_dead_thread_is_restarted(caplog):
    calls = []

    def beat():
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("redis said no")
        if len(calls) == 2:
            raise Crash()

    heartbeat = Heartbeat(beat, 0.01, "test-heartbeat")
    with caplog.at_level(logging.INFO):
        heartbeat.start()
        wait_for(lambda: not heartbeat.alive)
        assert "test-heartbeat: beat failed" in caplog.text  # logged with its traceback, thread lived on
        assert "test-heartbeat thread is dying" in caplog.text
        assert heartbeat.ensure_alive() is False
        assert "test-heartbeat thread died; restarting it" in caplog.text
        wait_for(lambda: len(calls) >= 4)
        assert heartbeat.alive and heartbeat.restarts == 1
        heartbeat.stop()
    assert not heartbeat.alive and heartbeat.ensure_alive()  # a stopped heartbeat is not restarted
