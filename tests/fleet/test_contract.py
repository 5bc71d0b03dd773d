"""The protocol's contract: every way a request can end - served, failed, cancelled, expired, poison, spread
and joined - has the same effects, written by the same scripts (common/protocol): the result blob, one wake-up
on the path the request waits on (its reply stream, else its notify list), the gateway job options' TTL, rq's
registries and job status. With --rq-records full, what they leave for rq matches what rq 3.0's own
SimpleWorker (and Job.cancel) leaves for the same job, but for the differences listed here on purpose; with
lean (the default), what they leave is full's less the records listed in LEAN_DROPS, and rq's own tools still
show the queue, the claims and the failures. A change in rq's layout (a renamed registry, a new required
field) fails here, loudly, before it misleads `rq info`."""

from __future__ import annotations

import asyncio
import re
import time
import zlib

import pytest
import redis
from rq import Queue, Worker
from rq.job import Job, JobStatus
from rq.results import Result as RqResult

from embedfleet.common.errors import CancelledError
from embedfleet.common.policy import MAX_DELIVERIES, RESULT_TTL
from embedfleet.common.protocol import answering, enqueueing, jobdata, keys, rqjobs, rqkeys
from embedfleet.common.protocol.jobdata import JOB_FUNC
from embedfleet.common.request import EmbedRequest, PartOf
from embedfleet.common.result import Result
from embedfleet.common.serializer import MsgpackSerializer
from embedfleet import Producer
from tests import harness
from tests.harness import burst, idle_worker
from tests.rqjobs import enqueue, rq_queue
from embedfleet.worker.serving.rqpubsub import PromptSimpleWorker


def succeed(payload: bytes) -> dict:
    return {"status": "ok"}


def fail(payload: bytes) -> None:
    raise RuntimeError("a failing job")


def shapes(conn, job_id: str, queue: str, worker_name: str) -> dict[str, tuple]:
    """Every key that mentions the job, its queue or the worker, as (pattern, type, fields): ids, queue
    and worker names replaced so that two runs compare."""
    out = {}
    for raw in conn.keys("rq:*"):
        key = raw.decode()
        if job_id not in key and queue not in key and worker_name not in key:
            continue
        kind = conn.type(raw).decode()
        if kind == "hash":
            fields = tuple(sorted(f.decode() for f in conn.hkeys(raw)))
        elif kind == "stream":
            fields = tuple(sorted(f.decode() for f in conn.xrange(raw)[-1][1]))
        elif kind == "zset":
            fields = tuple(sorted(re.sub(r":.*", ":<execution>", m.decode().replace(job_id, "<job>"))
                                  for m in conn.zrange(raw, 0, -1)))
        else:
            fields = ()
        pattern = key.replace(job_id, "<job>").replace(queue, "<queue>").replace(worker_name, "<worker>")
        out[pattern] = (kind, fields, conn.ttl(raw) > 0)
    return out


def run_rq(conn, func) -> tuple[dict, Job]:
    queue = Queue("embedfleet.contract", connection=conn, serializer=MsgpackSerializer)
    job = queue.enqueue(func, b"x", job_id="contractjob", result_ttl=600, failure_ttl=900, job_timeout=60)
    # rq's SimpleWorker whose teardown returns at once: a plain one's may wait 60 s, past the EXPIRE 60 rq sets
    # on its hash, before the test reads that hash (it writes nothing of its own)
    worker = PromptSimpleWorker([queue], connection=conn, serializer=MsgpackSerializer, name="contractworker")
    worker.work(burst=True)
    return shapes(conn, job.id, queue.name, worker.name), job


def run_ours(conn, engine, data: bytes | None, records: str = "full") -> tuple[dict, Job]:
    request = EmbedRequest(id="contractjob", model=engine.caps.name, inputs=["served"])
    job = enqueue(conn, request, *([data] if data else []), result_ttl=600, failure_ttl=900, job_timeout=60)
    ours = harness.worker(engine, conn, name="contractworker", rq_records=records)
    burst(ours)
    return shapes(conn, job.id, rq_queue(conn, engine.caps.name).name, ours.name), job


# Written by rq's SimpleWorker but not by ours, on purpose: callbacks and dependents (embedding jobs have
# none), the worker's pub/sub and per-run registration fields; none is read by `rq info` or Job's API.
RQ_ONLY_FIELDS = {"success_callback_name", "failure_callback_name", "stopped_callback_name", "group_id",
                  "description", "redis_server_version", "meta", "repeats_left", "repeat_intervals"}


# Written by rq's SimpleWorker but not by ours, on purpose: a served job's result stream (its answer is the
# result blob; a one-entry stream costs ~4.7 KB of Redis per request, more than a 384-dim answer).
RQ_ONLY_KEYS = {"finished": {"rq:results:<job>"}, "failed": set()}


def api_view(conn, job_id: str) -> tuple:
    """What rq's own API reads for a job and its worker."""
    job = Job.fetch(job_id, connection=conn, serializer=MsgpackSerializer)
    worker = Worker.find_by_key("rq:worker:contractworker", conn)  # rq keeps a stopped worker's hash 60 s
    latest = job.latest_result()
    return (job.get_status(), latest.type if latest else None, bool(job.started_at and job.ended_at),
            job.worker_name, worker.successful_job_count, worker.failed_job_count)


@pytest.mark.parametrize("served", [True, False], ids=["finished", "failed"])
def test_our_scripts_leave_what_rq_leaves(engine, redis_client, served):
    theirs, their_job = run_rq(redis_client, succeed if served else fail)
    their_view = api_view(redis_client, their_job.id)
    redis_client.flushall()
    ours, our_job = run_ours(redis_client, engine, None if served else b"not a request")

    our_view = api_view(redis_client, our_job.id)
    assert their_view == (JobStatus.FINISHED if served else JobStatus.FAILED,
                          RqResult.Type.SUCCESSFUL if served else RqResult.Type.FAILED, True, "contractworker",
                          1 if served else 0, 0 if served else 1)
    assert our_view == their_view[:1] + (None if served else RqResult.Type.FAILED,) + their_view[2:]
    assert set(theirs) - set(ours) == RQ_ONLY_KEYS["finished" if served else "failed"]
    assert set(ours) <= set(theirs), "no key of ours that rq's worker would not write"
    for pattern in ours:
        kind, fields, expires = theirs[pattern]
        our_kind, our_fields, our_expiry = ours[pattern]
        assert our_kind == kind, pattern
        assert expires == our_expiry, f"{pattern}: TTL set by one side only"
        if pattern == "rq:job:<job>":
            assert set(fields) - set(our_fields) <= RQ_ONLY_FIELDS, pattern
        elif pattern == "rq:worker:<worker>":
            assert {"successful_job_count", "failed_job_count", "total_working_time"} & set(fields) <= \
                set(our_fields), pattern
        else:
            assert fields == our_fields, pattern


# What --rq-records lean leaves out of full's records (docs/capacity.md says who read each, and why none is
# needed): a served job's hash (its answer is the result blob) and its finished-registry entry.
LEAN_DROPS = {"finished": {"rq:job:<job>", "rq:finished:<queue>"}, "failed": set()}
LEAN_FIELDS = {"successful_job_count", "total_working_time"}  # the worker's: full counts served jobs, lean not


@pytest.mark.parametrize("served", [True, False], ids=["finished", "failed"])
def test_lean_records_are_full_less_what_nothing_reads(engine, redis_client, served):
    """Lean's contract: every key it leaves is one full leaves, alike; it drops only LEAN_DROPS; rq's API
    still reads a failed job whole, and `rq info`'s queue and registry counts (its queues, claims, failures)."""
    full, _ = run_ours(redis_client, engine, None if served else b"not a request", records="full")
    redis_client.flushall()
    lean, job = run_ours(redis_client, engine, None if served else b"not a request", records="lean")
    ending = "finished" if served else "failed"
    assert set(full) - set(lean) == LEAN_DROPS[ending] and set(lean) <= set(full)
    for pattern in lean:
        kind, fields, expires = full[pattern]
        assert lean[pattern][0] == kind and lean[pattern][2] == expires, pattern
        if pattern == "rq:worker:<worker>":
            assert set(fields) - set(lean[pattern][1]) <= LEAN_FIELDS | {"failed_job_count"}, pattern
        else:
            assert lean[pattern][1] == fields, pattern
    queue = rq_queue(redis_client, engine.caps.name)
    assert queue.name in [q.name for q in Queue.all(connection=redis_client)]  # `rq info` lists the queue
    assert (queue.count, queue.started_job_registry.count, queue.finished_job_registry.count,
            queue.failed_job_registry.count) == (0, 0, 0, 0 if served else 1)
    if served:
        assert Result.decode(redis_client.get(keys.result_key(job.id))).ok  # its record is its answer
    else:
        failed = Job.fetch(job.id, connection=redis_client, serializer=MsgpackSerializer)
        assert failed.get_status() == JobStatus.FAILED and failed.latest_result().type == RqResult.Type.FAILED
        assert Worker.find_by_key("rq:worker:contractworker", redis_client).failed_job_count == 1


@pytest.mark.parametrize("retry", [True, False], ids=["retry", "no retry"])
def test_the_job_hash_a_producer_writes_is_rqs_own_field_by_field(retry):
    """common/protocol/rqjobs.py builds rq's job hash without rq (rq builds one per queue, the template): the same
    fields in the same order, the same values, but for the timestamps (now, in rq's format) - for requests of
    each shape (a reply stream, token ids, a spread request's part)."""
    queue = keys.queue_name("contract")
    requests = [EmbedRequest(model="contract", inputs=["a text", "two"], reply_to=keys.reply_stream_key("r")),
                EmbedRequest(model="contract", inputs=[[101, 7, 102]], params={"dimensions": 8}),
                EmbedRequest(id="parent-p2", model="contract", inputs=["part"],
                             part_of=PartOf(parent="parent", index=2, parts=4))]
    for request, ours, theirs in zip(requests, rqjobs.rq_fields(queue, requests, retry),
                                     rqjobs.built_by_rq(queue, requests, retry)):
        assert list(ours) == list(theirs)
        stamps = ("created_at", "enqueued_at")
        assert {k: v for k, v in ours.items() if k not in (*stamps, "data")} == \
            {k: v for k, v in theirs.items() if k not in (*stamps, "data")}
        # rq compresses every job's data; ours goes as it is while small (common/protocol/jobdata.py), and reads
        # back, as rq's Job.restore reads either, to the same bytes
        assert len(ours["data"]) <= jobdata.COMPRESS_ABOVE and not ours["data"].startswith(b"x\x9c")
        assert zlib.decompress(theirs["data"]) == ours["data"] == jobdata.inflate(ours["data"])
        job = Job(request.id, connection=redis.Redis(host="embedfleet-contract.invalid"),
                  serializer=MsgpackSerializer)
        job.restore({b"data": ours["data"], b"created_at": ours["created_at"].encode(), b"status": b"queued"})
        assert (job.func_name, job.args) == (JOB_FUNC, [request.encode()])
        for stamp in stamps:
            assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", ours[stamp]), ours[stamp]


def test_a_cancel_leaves_what_rqs_job_cancel_leaves(redis_client):
    """rq's own Job.cancel() and ours (a producer's cancel) on the same queued job: the same status and
    registry; ours also takes the id out of its queue atomically against the workers and answers it."""
    queue = Queue("embedfleet.contract", connection=redis_client, serializer=MsgpackSerializer)
    theirs = queue.enqueue(succeed, b"x", job_id="theirs")
    theirs.cancel()
    request = EmbedRequest(id="ours", model="contract", inputs=["x"])
    enqueueing.enqueue(redis_client, enqueueing.enqueue_args("embedfleet.contract", [request]))
    answer = Result.failure("ours", "contract", CancelledError("cancelled"))
    assert answering.cancel(redis_client, "embedfleet.contract", answer, None)
    for job_id in ("theirs", "ours"):
        job = Job.fetch(job_id, connection=redis_client, serializer=MsgpackSerializer)
        assert job.get_status() == JobStatus.CANCELED
        assert job_id in queue.canceled_job_registry.get_job_ids()
    assert queue.job_ids == []
    assert Result.decode(redis_client.get(keys.result_key("ours"))).error_code == "cancelled"


# -- every way a request ends --------------------------------------------------------------------------

MAX_LEN = 32


@pytest.fixture(scope="module")
def long_model(tmp_path_factory):
    """Tiny BERT, max length 32, inputs up to 8x that embedded in chunks (spread over the fleet past 2)."""
    from tests.tinymodels import save_tiny_bert, wrap_sentence_transformers
    from embedfleet.worker.engine.models.loader import load_model

    folder = wrap_sentence_transformers(save_tiny_bert(str(tmp_path_factory.mktemp("contract"))), "mean",
                                        normalize=True, max_seq_length=MAX_LEN)
    return load_model(folder, served_name="contract", max_embed_len=8 * MAX_LEN)


ENDINGS = {  # ending -> (answer's error code or None for rows, rq status, the registry it ends in)
    "served": (None, JobStatus.FINISHED, "finished"),
    "failed": ("decode_error", JobStatus.FAILED, "failed"),
    "cancelled": ("cancelled", JobStatus.CANCELED, "canceled"),
    "expired": ("expired", JobStatus.FAILED, "failed"),
    "poison": ("poison", JobStatus.FAILED, "failed"),
    "joined": (None, JobStatus.FINISHED, "finished"),  # spread over the fleet, answered by its last part's join
}


@pytest.mark.parametrize("records", ["full", "lean"])
def test_every_way_a_request_ends_has_the_same_effects(long_model, redis_url, redis_client, records):
    from tests.tinymodels import WORDS
    from embedfleet.worker.engine.engine import Engine

    held = idle_worker(Engine(long_model), redis_client, max_jobs=64, name="contractworker", chunks_per_job=2,
                       rq_records=records)  # every ending is queued before it serves
    reply = keys.reply_stream_key("contract")
    queue = keys.queue_name("contract")
    long_text = " ".join(WORDS[i % len(WORDS)] for i in range(7 * MAX_LEN))  # 7 chunks: 4 parts of <= 2
    with Producer(redis_url) as producer:
        ids = {ending: producer.submit([long_text if ending == "joined" else f"a text that is {ending}"],
                                       "contract", reply_to=reply, timeout=0.05 if ending == "expired" else None)
               for ending in ENDINGS}
        for request_id in ids.values():  # what the gateway keeps for an async job, until its result expires
            asyncio.run(_save_options(redis_url, request_id))
        redis_client.hset(rqkeys.rq_job_key(ids["failed"]), "data", b"not rq job data")
        redis_client.hset(rqkeys.rq_job_key(ids["poison"]), "lapses", MAX_DELIVERIES)
        assert producer.cancel(ids["cancelled"])
        while time.time() < EmbedRequest.decode(_request_bytes(redis_client, ids["expired"])).deadline:
            time.sleep(0.01)  # the expired one's deadline passes before any worker takes it
        burst(held)  # serves the round, then the spread request's parts at the queue's head

    stream = [entry[1][b"id"].decode() for entry in redis_client.xrange(reply)]
    for ending, (code, status, registry) in ENDINGS.items():
        request_id = ids[ending]
        result = Result.decode(redis_client.get(result_key := keys.result_key(request_id)))
        assert result.id == request_id and result.error_code == code, (ending, result.error_message)
        if code is None:
            assert result.embeddings.shape == (1, 32)
        assert stream.count(request_id) == 1, ending  # one wake-up, on the reply stream it was submitted with
        assert not redis_client.exists(keys.notify_key(request_id)), ending  # and no other
        assert 0 < redis_client.ttl(keys.job_options_key(request_id)) <= redis_client.ttl(result_key), ending
        if records == "lean" and ending == "served":  # its answer is its record
            assert not redis_client.exists(rqkeys.rq_job_key(request_id))
            assert redis_client.zscore(f"rq:{registry}:{queue}", request_id) is None
            continue
        job = Job.fetch(request_id, connection=redis_client, serializer=MsgpackSerializer)
        assert job.get_status() == status, ending
        if records == "full" or registry != "finished":  # lean keeps no finished registry
            assert redis_client.zscore(f"rq:{registry}:{queue}", request_id) is not None, ending
        assert 0 < redis_client.ttl(rqkeys.rq_job_key(request_id)), ending
    assert 0 < redis_client.ttl(reply) <= RESULT_TTL
    assert redis_client.zcard(rqkeys.rq_wip_key(queue)) == 0 and redis_client.llen(rqkeys.rq_queue_key(queue)) == 0
    assert not redis_client.exists(keys.chunks_key(ids["joined"]))  # the join state went with the answer
    parts = [k.decode().removeprefix("rq:job:") for k in redis_client.keys(f"rq:job:{ids['joined']}-p*")]
    assert len(parts) == 4 and not any(redis_client.exists(keys.result_key(p)) for p in parts)  # never answered alone
    if records == "full":
        assert {m.decode() for m in redis_client.zrange(rqkeys.rq_finished_key(queue), 0, -1)} >= set(parts)
    assert redis_client.get(keys.queued_tokens_key(queue)) is None  # the parts were counted, and taken off


async def _save_options(redis_url: str, request_id: str) -> None:
    import redis.asyncio as aioredis

    connection = aioredis.Redis.from_url(redis_url)
    try:
        await answering.save_job_options(connection, request_id, '{"encoding_format": "float"}')
    finally:
        await connection.aclose()


def _request_bytes(conn, request_id: str) -> bytes:
    job = Job.fetch(request_id, connection=conn, serializer=MsgpackSerializer)
    return job.args[0]
