"""BatchWorker against a real redis-server and the real Engine on all-MiniLM-L6-v2."""

from __future__ import annotations

import re
import time

import numpy as np
import pytest
from pydantic import ValidationError
from rq import Retry, Worker
from rq.job import JobStatus

from embedfleet.common.codec import packb
from embedfleet.common.policy import RESULT_TTL
from embedfleet.common.protocol import enqueueing
from embedfleet.common.protocol.keys import MODELS_KEY, model_key, model_workers_key, notify_key, queue_name, result_key
from embedfleet.common.protocol.records import RQ_RECORDS
from embedfleet.common.protocol.rqkeys import LEASE_GRACE
from embedfleet.common.request import EmbedRequest
from embedfleet.common.result import Result
from embedfleet.common.serializer import MsgpackSerializer
from tests import harness
from tests.commands import wait_for
from tests.faultymodels import PoisonedModel
from tests.harness import burst, serve
from tests.heldpasses import GatedEngine
from tests.nullworker import null_engine
from tests.rqjobs import enqueue, rq_queue, texts
from tests.tinymodels import engine_for
from embedfleet.worker.serving.advertise import Advertiser
from embedfleet.worker.serving.config import WorkerSettings
from embedfleet.worker.engine.engine import Engine
from embedfleet.worker.engine.models.loader import load_model
from embedfleet.worker.serving.builder import build_worker
from embedfleet.worker.serving.pipeline import BatchWorker
from embedfleet.worker.serving.rqpubsub import PromptSimpleWorker


def cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


@pytest.mark.parametrize("records", RQ_RECORDS)
def test_burst_serves_in_batches_and_matches_single_embeddings(engine, redis_client, records):
    pool = texts(12)  # 40 requests of 1-2 texts drawn from 12, so each text's reference is computed once
    requests = [EmbedRequest(model=engine.caps.name, inputs=[pool[i % 12], pool[(i * 5) % 12]][:1 + i % 2])
                for i in range(40)]
    for request in requests:
        enqueue(redis_client, request)
    passes = engine.forward_passes

    assert burst(engine, redis_client, max_jobs=64, rq_records=records)

    assert engine.forward_passes - passes < len(requests)
    alone = {text: engine.run([EmbedRequest(model=engine.caps.name, inputs=[text])])[0].embeddings[0]
             for text in pool}
    for request in requests:
        result = Result.decode(redis_client.get(result_key(request.id)))
        assert result.ok and result.id == request.id
        assert result.embeddings.shape == (len(request.inputs), engine.caps.embedding_size)
        reference = np.stack([alone[text] for text in request.inputs])
        assert cosine_rows(result.embeddings, reference).min() >= 0.99999
        assert 0 < redis_client.ttl(result_key(request.id)) <= RESULT_TTL
        assert 0 < redis_client.ttl(notify_key(request.id)) <= RESULT_TTL
        assert redis_client.lrange(notify_key(request.id), 0, -1) == [b"1"]

    queue = rq_queue(redis_client, engine.caps.name)
    ids = {request.id for request in requests}
    assert queue.started_job_registry.get_job_ids() == []
    assert redis_client.llen(queue.intermediate_queue_key) == 0 and len(queue) == 0
    assert not redis_client.keys("rq:execution*")  # every Execution was cleaned up (lean writes none)
    assert not redis_client.keys("rq:results:*")  # no rq result stream: the answer is the blob
    if records == "lean":  # a served job's answer is its record: no hash, no finished registry
        assert queue.finished_job_registry.get_job_ids() == [] and not redis_client.keys("rq:job:*")
        return
    assert set(queue.finished_job_registry.get_job_ids()) == ids
    for job in (queue.fetch_job(request.id) for request in requests):
        assert job.get_status() == JobStatus.FINISHED and job.ended_at and job.worker_name
        assert 0 < redis_client.ttl(job.key) <= RESULT_TTL


@pytest.mark.parametrize("records", RQ_RECORDS)
def test_malformed_messages_fail_clearly_and_the_batch_goes_on(engine, redis_client, records):
    model = engine.caps.name
    good = [EmbedRequest(model=model, inputs=[text]) for text in texts(3)]
    invalid = EmbedRequest(model=model, inputs=["x"], params={"dimensions": 8})  # not a Matryoshka model
    garbage, not_a_request, two_args, bad_data, cancelled = (EmbedRequest(model=model, inputs=["?"])
                                                             for _ in range(5))
    for request in good[:2]:
        enqueue(redis_client, request)
    enqueue(redis_client, garbage, b"garbage")
    enqueue(redis_client, not_a_request, packb({"hello": "world"}))
    enqueue(redis_client, two_args, two_args.encode(), b"extra")
    enqueue(redis_client, bad_data)
    redis_client.hset(f"rq:job:{bad_data.id}", "data", b"\xc1\xc1 not msgpack")
    enqueue(redis_client, cancelled)
    rq_queue(redis_client, model).fetch_job(cancelled.id).set_status(JobStatus.CANCELED)  # a racing cancel
    enqueue(redis_client, invalid)
    enqueue(redis_client, good[2])

    reply = "embedfleet:replies:test"
    worker = harness.worker(engine, redis_client, max_jobs=64, rq_records=records)
    burst(worker)
    assert worker.finishing.batches == 1  # everything above was one batch

    queue = rq_queue(redis_client, model)
    reasons = {garbage.id: "malformed embed request", not_a_request.id: "malformed embed request",
               two_args.id: "job args must be", bad_data.id: "job data is not msgpack"}
    assert set(queue.failed_job_registry.get_job_ids()) == set(reasons)
    for job_id, reason in reasons.items():
        job = queue.fetch_job(job_id)
        assert job.get_status() == JobStatus.FAILED
        assert reason in job.latest_result().exc_string
        assert reason in job._exc_info  # also in the job hash, where `rq info`-style tools look
        answer = Result.decode(redis_client.get(result_key(job_id)))
        assert answer.error_code == "decode_error" and reason in answer.error_message
        assert redis_client.llen(notify_key(job_id)) == 1

    for request in good:
        assert Result.decode(redis_client.get(result_key(request.id))).embeddings.shape == (1, 384)
    served_error = Result.decode(redis_client.get(result_key(invalid.id)))
    assert served_error.error_code == "invalid_request" and "dimensions" in served_error.error_message
    if records == "full":
        assert queue.fetch_job(invalid.id).get_status() == JobStatus.FINISHED  # answered: its own error is its answer
        assert set(queue.finished_job_registry.get_job_ids()) == {r.id for r in good} | {invalid.id}
    else:  # served (its own error is its answer): the answer is its record
        assert queue.fetch_job(invalid.id) is None and queue.finished_job_registry.get_job_ids() == []

    assert queue.fetch_job(cancelled.id).get_status() == JobStatus.CANCELED
    assert queue.canceled_job_registry.get_job_ids() == [cancelled.id]
    assert Result.decode(redis_client.get(result_key(cancelled.id))).error_code == "cancelled"
    assert redis_client.llen(queue.intermediate_queue_key) == 0
    assert not redis_client.exists(reply)

    counts = Worker.find_by_key(worker.key, redis_client)  # rq keeps the dead worker's hash for 60 s
    assert (counts.successful_job_count, counts.failed_job_count) == (4 if records == "full" else 0, 4)


def test_reply_stream_gets_the_id(engine, redis_client):
    request = EmbedRequest(model=engine.caps.name, inputs=["hi"], reply_to="embedfleet:replies:test")
    enqueue(redis_client, request)
    burst(engine, redis_client)
    [(_, fields)] = redis_client.xrange("embedfleet:replies:test")
    assert fields == {b"id": request.id.encode()}


@pytest.mark.parametrize("records", RQ_RECORDS)
def test_worker_in_thread_is_registered_honestly_and_advertises(engine, redis_client, records):
    name = engine.caps.name
    requests = [EmbedRequest(model=name, inputs=[text]) for text in texts(3)]
    for request in requests:  # queued before the start, so that they land in one batch
        enqueue(redis_client, request)
    gated = GatedEngine(engine)
    worker = harness.worker(gated, redis_client, heartbeat_interval=0.2, rq_records=records)
    with serve(worker, stop_seconds=10):  # its exit: stop(), then the thread must end within 10 s
        try:
            assert gated.entered.wait(10)
            assert 0 < redis_client.ttl(model_key(name)) <= 30
            assert redis_client.sismember(MODELS_KEY, name)
            [seen] = Worker.all(connection=redis_client)
            assert seen.name == worker.name
            # busy, as `rq info` shows it: written by the take (full), by the next beat (lean)
            wait_for(lambda: Worker.all(connection=redis_client)[0].get_state() == "busy")
            current = seen.get_current_job()  # read from Redis, as rq's Worker API does (its executions)
            assert current.id in {r.id for r in requests} if records == "full" else current is None
            queue = rq_queue(redis_client, name)
            assert set(queue.started_job_registry.get_job_ids()) == {r.id for r in requests}
            assert {queue.fetch_job(r.id).get_status() for r in requests} == {JobStatus.STARTED}
            beat = redis_client.zscore(model_workers_key(name), worker.name)
            wait_for(lambda: redis_client.zscore(model_workers_key(name), worker.name) > beat)  # beats while busy

            gated.release.set()
            wait_for(lambda: all(redis_client.exists(result_key(r.id)) for r in requests))
            wait_for(lambda: Worker.all(connection=redis_client)[0].get_state() == "idle")
            assert Worker.all(connection=redis_client)[0].get_current_job() is None
            assert queue.started_job_registry.get_job_ids() == []
        finally:
            gated.release.set()
    assert Worker.all(connection=redis_client) == []
    assert not redis_client.exists(model_key(name))
    assert redis_client.zscore(model_workers_key(name), worker.name) is None


def test_plain_rq_worker_refuses_embedding_jobs(engine, redis_client):
    request = EmbedRequest(model=engine.caps.name, inputs=["hi"])
    job = enqueue(redis_client, request)
    PromptSimpleWorker([rq_queue(redis_client, request.model)], connection=redis_client,
                       serializer=MsgpackSerializer).work(burst=True)
    assert job.get_status() == JobStatus.FAILED
    assert "run `embedfleet worker`" in job.latest_result().exc_string


def started_score(conn, request: EmbedRequest) -> float:
    """The started-registry score of a request's job (members are `<job id>:<execution id>`)."""
    registry = rq_queue(conn, request.model).started_job_registry
    [score] = [score for member, score in conn.zrange(registry.key, 0, -1, withscores=True)
               if member.decode().startswith(request.id + ":")]
    return score


def test_the_started_registry_stays_a_skiplist_whatever_the_ids(redis_client):
    """Every claim's member `<id>:<execution>` is over 64 bytes, for a producer's own id and a caller's short one,
    so Redis keeps rq:wip:<q> a skiplist (a listpack's every ZADD scans and shifts the whole list: take.lua), and
    rq's tools still read each member as a job id and an execution id."""
    requests = [EmbedRequest(model="null", inputs=["one"]), EmbedRequest(id="a", model="null", inputs=["two"]),
                EmbedRequest(id="b" * 60, model="null", inputs=["three"])]
    enqueueing.enqueue(redis_client, enqueueing.enqueue_args(queue_name("null"), requests))
    worker = harness.worker(null_engine(), redis_client)
    _, taken = worker.levels.take(8, None)
    assert sorted(t.id for t in taken) == sorted(r.id for r in requests)
    registry = rq_queue(redis_client, "null").started_job_registry
    assert redis_client.object("encoding", registry.key) == b"skiplist"
    members = [m.decode() for m in redis_client.zrange(registry.key, 0, -1)]
    assert all(len(m) > 64 for m in members), members
    assert sorted(m.rsplit(":", 1)[0] for m in members) == sorted(r.id for r in requests)
    assert all(re.fullmatch(r"[0-9a-f]{32,}", t.execution) for t in taken)
    assert sorted(registry.get_job_ids()) == sorted(r.id for r in requests)


def test_leases_are_renewed_by_beats_and_only_until_the_job_timeout(engine, redis_client):
    patient, hasty = (EmbedRequest(model=engine.caps.name, inputs=[text]) for text in ("patient", "hasty"))
    enqueue(redis_client, patient)  # JOB_TIMEOUT
    enqueue(redis_client, hasty, job_timeout=1)
    gated, lease = GatedEngine(engine), 0.9  # renewed every 0.3 s
    worker = harness.worker(gated, redis_client, lease_seconds=lease)
    with serve(worker, stop_seconds=10):
        try:
            assert gated.entered.wait(10)
            first = started_score(redis_client, patient)
            assert first < time.time() + lease + LEASE_GRACE + 1  # the lease, seen by rq LEASE_GRACE later
            wait_for(lambda: started_score(redis_client, patient) > first)  # a beat renewed it ...
            assert started_score(redis_client, patient) < time.time() + lease + LEASE_GRACE + 1  # ... by a lease

            # hasty's 1 s timeout passes: its lease is no longer renewed, lapses, and a recover requeues it
            wait_for(lambda: redis_client.hget(f"rq:job:{hasty.id}", "lapses") == b"1")
            wait_for(lambda: worker.upkeep.recovered >= 1)  # counted once the recover script has returned
            assert redis_client.lrange(rq_queue(redis_client, engine.caps.name).key, 0, -1) == [hasty.id.encode()] \
                or worker.held_count() == 3  # requeued at the head, or already taken again (a second claim)
            seen = started_score(redis_client, patient)
            wait_for(lambda: started_score(redis_client, patient) > seen)  # patient's lease lives on
        finally:
            gated.release.set()


def test_a_result_ttl_under_one_second_is_refused(engine, redis_client):
    """(A job's own result_ttl is a TTL of its rq records, which only --rq-records full keeps.)"""
    for ttl in (0, -1):
        with pytest.raises(ValueError, match=r"result_ttl must be at least 1 second, got -?\d"):
            build_worker(harness.settings(), engine, redis_client, result_ttl=ttl)  # past the settings' own check
        with pytest.raises(ValidationError, match="result_ttl"):
            WorkerSettings(result_ttl=ttl)

    request = EmbedRequest(model=engine.caps.name, inputs=["kept"])  # a job's own -1 gives way to the worker's
    job = enqueue(redis_client, request, result_ttl=-1)
    burst(engine, redis_client, result_ttl=100, rq_records="full")
    assert Result.decode(redis_client.get(result_key(request.id))).ok
    assert 0 < redis_client.ttl(result_key(request.id)) <= 100
    assert job.get_status() == JobStatus.FINISHED and 0 < redis_client.ttl(job.key) <= 100


@pytest.mark.parametrize("records", RQ_RECORDS)
def test_a_poisoned_request_fails_alone_retryably_and_its_neighbours_are_served(bert_cls, redis_client, records):
    engine = Engine(PoisonedModel.of(load_model(bert_cls, served_name="poisoned")))
    model = engine.caps.name
    healthy = [EmbedRequest(model=model, inputs=[[2, 10 + i, 3], [2, 20 + i, 30, 3]]) for i in range(6)]
    poisoned = EmbedRequest(model=model, inputs=[[2, 11, 3], [2, PoisonedModel.POISON, 3]])
    for request in healthy[:3]:
        enqueue(redis_client, request)
    enqueue(redis_client, poisoned, retry=Retry(max=1))
    for request in healthy[3:]:
        enqueue(redis_client, request)

    worker = harness.worker(engine, redis_client, rq_records=records)
    burst(worker)
    assert worker.finishing.batches == 2  # the poisoned job was requeued once by its Retry, and failed again

    queue = rq_queue(redis_client, model)
    clean = engine_for(bert_cls)
    for request in healthy:
        result = Result.decode(redis_client.get(result_key(request.id)))
        np.testing.assert_allclose(result.embeddings, clean.run([request])[0].embeddings, rtol=1e-4, atol=1e-5)
        served = queue.fetch_job(request.id)  # lean: the answer is a served job's record
        assert served.get_status() == JobStatus.FINISHED if records == "full" else served is None
    job = queue.fetch_job(poisoned.id)
    assert job.get_status() == JobStatus.FAILED and job.retries_left == 0
    assert queue.failed_job_registry.get_job_ids() == [poisoned.id]
    assert "forward pass failed" in job.latest_result().exc_string
    answer = Result.decode(redis_client.get(result_key(poisoned.id)))
    assert answer.error_code == "internal_error" and "crashes the kernel" in answer.error_message
    assert redis_client.llen(notify_key(poisoned.id)) == 1  # answered once, when it finally failed


def test_advertise_is_one_transaction_with_the_worker_beat_before_the_capabilities(engine, redis_client):
    """_WITHDRAW must never see another worker's capabilities without its beat (it would delete them)."""
    advertiser = Advertiser(redis_client, engine.caps, "w1")
    with redis_client.monitor() as monitor:
        advertiser.advertise()
        redis_client.echo("advertised")
        commands = []
        while not (command := monitor.next_command()["command"]).startswith("ECHO"):
            commands.append(command.split()[0])
    commands = commands[commands.index("MULTI"):] if "MULTI" in commands else commands
    assert commands[:3] == ["MULTI", "ZADD", "SET"] and commands[-1] == "EXEC"


def beat_after_store(worker: BatchWorker) -> BatchWorker:
    """The background heartbeat landing right after the store's EXEC, as the thread may at any time."""
    finish_round = worker.finishing.finish_round

    def finish_then_beat(round_):
        finish_round(round_)
        worker.upkeep.beat()

    worker.finishing.finish_round = finish_then_beat
    return worker


def test_a_beat_right_after_the_store_recreates_no_execution(engine, redis_client):
    requests = [EmbedRequest(model=engine.caps.name, inputs=[text]) for text in texts(2)]
    for request in requests:
        enqueue(redis_client, request)
    # full: lean writes no execution records at all
    burst(beat_after_store(harness.worker(engine, redis_client, rq_records="full")))
    assert all(Result.decode(redis_client.get(result_key(r.id))).ok for r in requests)
    assert not redis_client.keys("rq:execution*")
    assert rq_queue(redis_client, engine.caps.name).started_job_registry.get_job_ids() == []
