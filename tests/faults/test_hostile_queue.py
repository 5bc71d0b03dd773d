"""The queue is input, not instructions: hostile messages on a model's queue fail alone, at once, touch no
key outside their own, leave every key they create with a TTL, and never stall rq's maintenance."""

from __future__ import annotations

import zlib

from rq.job import Job

from embedfleet.common.codec import packb
from embedfleet.common.policy import FAILURE_TTL, RESULT_TTL
from embedfleet.common.protocol.jobdata import JOB_FUNC, job_reply_to
from embedfleet.common.protocol.keys import notify_key, result_key
from embedfleet.common.request import EmbedRequest
from embedfleet.common.result import Result
from embedfleet.common.serializer import MsgpackSerializer
from tests import harness
from tests.harness import burst
from tests.rqjobs import enqueue, rq_queue, texts


def good_requests(conn, model: str, count: int = 20) -> list[EmbedRequest]:
    requests = [EmbedRequest(model=model, inputs=[text]) for text in texts(count)]
    for request in requests:
        enqueue(conn, request)
    return requests


def assert_served(conn, requests) -> None:
    for request in requests:
        result = Result.decode(conn.get(result_key(request.id)))
        assert result.ok and result.embeddings.shape == (1, 384)


def assert_maintenance_runs(conn, model: str, engine) -> None:
    """rq's maintenance completes over whatever the hostile run left, and releases its lock."""
    rescuer = harness.worker(engine, conn)
    rescuer.run_maintenance_tasks()
    assert not conn.exists(f"rq:clean_registries:{rq_queue(conn, model).name}")


def test_a_non_utf8_id_is_dropped_and_its_batch_is_served(engine, redis_client):
    model = engine.caps.name
    queue = rq_queue(redis_client, model)
    first = good_requests(redis_client, model, 10)
    redis_client.rpush(queue.key, b"\xff\xfe", b"has space", b"x" * 300)  # ids no rq job can have
    rest = good_requests(redis_client, model, 10)

    worker = harness.worker(engine, redis_client, max_jobs=64)
    burst(worker)

    assert worker.finishing.batches == 1  # the bad ids were taken with the good ones, and dropped
    assert_served(redis_client, first + rest)
    assert len(queue) == 0 and redis_client.llen(queue.intermediate_queue_key) == 0
    assert queue.started_job_registry.get_job_ids() == []
    assert_maintenance_runs(redis_client, model, engine)


def test_job_data_of_the_wrong_shape_fails_alone(engine, redis_client):
    model = engine.caps.name
    good = good_requests(redis_client, model, 10)
    shapes = {"int args": [JOB_FUNC, None, 5, {}], "not a list": {"a": 1}, "kwargs": [JOB_FUNC, None, [b"x"], {"k": 1}]}
    hostile = {}
    for label, data in shapes.items():
        request = EmbedRequest(model=model, inputs=["?"])
        job = enqueue(redis_client, request)
        redis_client.hset(job.key, "data", zlib.compress(packb(data)))
        hostile[request.id] = label
    mismatched = EmbedRequest(model=model, inputs=["mine"])
    enqueue(redis_client, mismatched, EmbedRequest(model=model, inputs=["yours"]).encode())
    hostile[mismatched.id] = "id mismatch"
    good += good_requests(redis_client, model, 10)

    worker = harness.worker(engine, redis_client, max_jobs=64)
    burst(worker)

    assert worker.finishing.batches == 1
    assert_served(redis_client, good)
    queue = rq_queue(redis_client, model)
    assert set(queue.failed_job_registry.get_job_ids()) == set(hostile)
    for job_id, label in hostile.items():
        answer = Result.decode(redis_client.get(result_key(job_id)))
        assert answer.error_code == "decode_error", label
        job = Job.fetch(job_id, connection=redis_client, serializer=MsgpackSerializer)
        assert job_reply_to(job) is None  # the maintenance path reads such jobs without crashing
    assert_maintenance_runs(redis_client, model, engine)


def test_a_stranded_int_args_job_is_recovered_by_maintenance(engine, redis_client):
    model = engine.caps.name
    request = EmbedRequest(model=model, inputs=["?"])
    job = enqueue(redis_client, request)
    redis_client.hset(job.key, "data", zlib.compress(packb([JOB_FUNC, None, 5, {}])))
    dead = harness.worker(engine, redis_client)
    dead.take_round(None)  # started, then its worker "dies"
    queue = rq_queue(redis_client, model)
    for member in redis_client.zrange(queue.started_job_registry.key, 0, -1):
        redis_client.zadd(queue.started_job_registry.key, {member: 1})
    assert_maintenance_runs(redis_client, model, engine)
    assert queue.started_job_registry.get_job_ids() == []
    assert Result.decode(redis_client.get(result_key(request.id))).error_code == "internal_error"


def test_reply_to_outside_the_reply_streams_is_never_written(engine, redis_client):
    model = engine.caps.name
    redis_client.rpush("victim:list", "precious")
    other_queue = rq_queue(redis_client, "other-model").key
    redis_client.rpush(other_queue, "someone-elses-job")
    redis_client.set("embedfleet:replies:typed", "a string, not a stream")
    requests = [EmbedRequest(model=model, inputs=["a"], reply_to=target)
                for target in ("victim:list", other_queue, "embedfleet:replies:typed", "embedfleet:replies:../x")]
    for request in requests:
        enqueue(redis_client, request)
    good = good_requests(redis_client, model, 5)

    burst(engine, redis_client)

    assert redis_client.lrange("victim:list", 0, -1) == [b"precious"] and redis_client.ttl("victim:list") == -1
    assert redis_client.get("embedfleet:replies:typed") == b"a string, not a stream"
    assert redis_client.ttl("embedfleet:replies:typed") == -1
    assert redis_client.lrange(other_queue, 0, -1) == [b"someone-elses-job"] and redis_client.ttl(other_queue) == -1
    assert_served(redis_client, good + requests)  # each still answered on its own result key


def test_a_request_for_another_model_is_refused(engine, redis_client):
    model = engine.caps.name
    stray = EmbedRequest(model="someone-else", inputs=["x"])
    enqueue(redis_client, stray, queue=model)
    burst(engine, redis_client)
    answer = Result.decode(redis_client.get(result_key(stray.id)))
    assert answer.error_code == "invalid_request" and answer.error_param == "model"
    assert "someone-else" in answer.error_message and answer.model == model


def test_every_key_a_hostile_message_creates_expires(engine, redis_client):
    model = engine.caps.name
    queue = rq_queue(redis_client, model)
    ids = []
    for fields in ({"timeout": "abc", "failure_ttl": "zzz", "data": b"junk"},
                   {"result_ttl": "-5", "failure_ttl": "99999999999", "data": b"junk"},
                   {"timeout": "1e400"}):
        request = EmbedRequest(model=model, inputs=["x"])
        job = enqueue(redis_client, request)
        redis_client.hset(job.key, mapping=fields)
        ids.append(request.id)
    redis_client.rpush(queue.key, "no-such-job")
    ids.append("no-such-job")

    burst(engine, redis_client)

    created = [key for key in redis_client.keys("*") if any(i.encode() in key for i in ids)]
    assert created
    for key in created:
        ttl = redis_client.ttl(key)
        assert 0 < ttl <= max(FAILURE_TTL, RESULT_TTL), (key, ttl)
    assert all(redis_client.exists(notify_key(i)) for i in ids[:3])


def test_a_job_hash_changed_by_hand_fails_alone_with_its_reason(engine, redis_client):
    """Fields a producer's rights can write, planted in three jobs of one round (tests/faults/test_protocol_hostile.py
    covers every field under hypothesis): the worker fails those three with the reason, serves the rest."""
    model = engine.caps.name
    good = good_requests(redis_client, model, 10)
    bad = good_requests(redis_client, model, 3)
    for request, (field, value) in zip(bad, [("deliveries", "x"), ("lapses", "-3"), ("timeout", "nan")]):
        redis_client.hset(f"rq:job:{request.id}", field, value)
    burst(engine, redis_client, max_jobs=64)
    assert_served(redis_client, good)
    for request, field in zip(bad, ["deliveries", "lapses", "timeout"]):
        result = Result.decode(redis_client.get(result_key(request.id)))
        assert result.error_code == "decode_error" and field in result.error_message
        assert redis_client.hget(f"rq:job:{request.id}", "status") == b"failed"  # (rq itself cannot read a nan)
        assert redis_client.zscore(f"rq:failed:{rq_queue(redis_client, model).name}", request.id) is not None
    assert_maintenance_runs(redis_client, model, engine)


def test_a_job_hash_without_data_fails_with_its_reason_and_its_waiter_hears_at_once(engine, redis_client,
                                                                                    caplog):
    """A hand-written job hash without `data` (issue 49, item 8): taken, failed with its reason, its waiter woken
    by the failure; before, it was dropped from the queue and kept status `queued`, its waiter waiting out its
    timeout. A 10,000-character queue entry is logged quoted to 64 characters."""
    model = engine.caps.name
    good = good_requests(redis_client, model, 5)
    empty = EmbedRequest(model=model, inputs=["no data"])
    job = enqueue(redis_client, empty)
    redis_client.hdel(job.key, "data")
    queue = rq_queue(redis_client, model)
    redis_client.rpush(queue.key, "y" * 10_000)

    worker = harness.worker(engine, redis_client, max_jobs=64)
    burst(worker)

    assert_served(redis_client, good)
    answer = Result.decode(redis_client.get(result_key(empty.id)))
    assert not answer.ok and "has no data field" in answer.error_message
    assert redis_client.hget(job.key, "status") == b"failed"
    assert redis_client.lrange(notify_key(empty.id), 0, -1)  # its waiter is woken, not left to its timeout
    dropped = [r.getMessage() for r in caplog.records if "dropped queue entry" in r.getMessage()]
    assert dropped and all(len(line) < 200 for line in dropped), dropped
