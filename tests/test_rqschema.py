"""The contract with rq 3.0: what common/protocol/rqschema.py's Lua scripts leave in Redis for a served and for a
failed job matches what rq's own SimpleWorker leaves for the same kinds of job. A change in rq's layout
(a renamed registry, a new required field) fails here, loudly, before it misleads `rq info`."""

from __future__ import annotations

import re

import pytest
from rq import Queue, SimpleWorker, Worker
from rq.job import Job, JobStatus
from rq.results import Result as RqResult

from common.request import EmbedRequest
from common.serializer import MsgpackSerializer
from tests.test_queue import engine, enqueue, rq_queue  # noqa: F401 - `engine` is a fixture
from worker.serving.pipeline import BatchWorker


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
    worker = SimpleWorker([queue], connection=conn, serializer=MsgpackSerializer, name="contractworker")
    worker.work(burst=True)
    return shapes(conn, job.id, queue.name, worker.name), job


def run_ours(conn, engine, data: bytes | None) -> tuple[dict, Job]:  # noqa: F811
    request = EmbedRequest(id="contractjob", model=engine.caps.name, inputs=["served"])
    job = enqueue(conn, request, *([data] if data else []), result_ttl=600, failure_ttl=900, job_timeout=60)
    worker = BatchWorker(engine, conn, name="contractworker")
    worker.work(burst=True)
    return shapes(conn, job.id, rq_queue(conn, engine.caps.name).name, worker.name), job


# Written by rq's SimpleWorker but not by ours, on purpose: callbacks and dependents (embedding jobs have
# none), the worker's pub/sub and per-run registration fields; none is read by `rq info` or Job's API.
RQ_ONLY_FIELDS = {"success_callback_name", "failure_callback_name", "stopped_callback_name", "group_id",
                  "description", "redis_server_version", "meta", "repeats_left", "repeat_intervals"}


def api_view(conn, job_id: str) -> tuple:
    """What rq's own API reads for a job and its worker."""
    job = Job.fetch(job_id, connection=conn, serializer=MsgpackSerializer)
    worker = Worker.find_by_key("rq:worker:contractworker", conn)  # rq keeps a stopped worker's hash 60 s
    return (job.get_status(), job.latest_result().type, bool(job.started_at and job.ended_at), job.worker_name,
            worker.successful_job_count, worker.failed_job_count)


@pytest.mark.parametrize("served", [True, False], ids=["finished", "failed"])
def test_our_scripts_leave_what_rq_leaves(engine, redis_client, served):  # noqa: F811
    theirs, their_job = run_rq(redis_client, succeed if served else fail)
    their_view = api_view(redis_client, their_job.id)
    redis_client.flushall()
    ours, our_job = run_ours(redis_client, engine, None if served else b"not a request")

    assert their_view == api_view(redis_client, our_job.id) == (
        JobStatus.FINISHED if served else JobStatus.FAILED,
        RqResult.Type.SUCCESSFUL if served else RqResult.Type.FAILED, True, "contractworker",
        1 if served else 0, 0 if served else 1)
    assert set(theirs) == set(ours), "the same keys, by pattern"
    for pattern, (kind, fields, expires) in theirs.items():
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
