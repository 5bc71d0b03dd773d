"""rq's job hash of an embedfleet request, as rq 3.0 writes it, built fast.

rq builds one job per queue (and Retry or not) on a pipeline of a client that never connects; the fields it would
write are read off that pipeline once and kept as the queue's template. Each request then gets the fields rq
computes per job - its data (the serializer's [func, instance, args, kwargs], zlib-compressed above
common/protocol/jobdata.py's COMPRESS_ABOVE bytes, where rq compresses all), description and timestamps - the
way rq computes them; the rest are the template's. (Building each job through rq cost ~80 us a
request, most of a producer's submit.) tests/fleet/test_contract.py holds the result to rq's own, field by field.
rq's empty fields are left out: rq reads a missing field as it reads '', and each value costs the enqueue
script's Redis twice (as it comes in and as it is written).
"""

from __future__ import annotations

from datetime import datetime, timezone

import redis
from rq import Queue, Retry

from embedfleet.common.policy import FAILURE_TTL, JOB_RETRIES, JOB_TIMEOUT, JOB_TTL, RESULT_TTL
from embedfleet.common.protocol import rqkeys
from embedfleet.common.protocol.jobdata import JOB_FUNC, deflate
from embedfleet.common.protocol.records import rq_time
from embedfleet.common.request import EmbedRequest
from embedfleet.common.serializer import MsgpackSerializer

_RECORDER = redis.Redis(host="embedfleet-recorder.invalid")
_RQ_VERSION = (7, 0, 0)  # what rq would read with INFO; it only picks commands, never fields
PER_JOB = ("data", "created_at", "enqueued_at", "description")  # what rq computes for each job
MAX_TEMPLATES = 1024  # (queue, retry) templates kept: a model has a queue per priority level
_templates: dict[tuple[str, bool], dict] = {}


def rq_fields(queue: str, requests: list[EmbedRequest], retry: bool) -> list[dict]:
    """Per request, the non-empty fields rq writes for its job on `queue` (with rq's Retry(max=JOB_RETRIES)
    when `retry`). Raises whatever a request cannot be encoded with."""
    template = _templates.get((queue, retry))
    if template is None:
        if len(_templates) >= MAX_TEMPLATES:
            _templates.clear()
        template = _templates[queue, retry] = built_by_rq(queue, [_PROTOTYPE], retry)[0]
    stamp = rq_time(datetime.now(timezone.utc))
    return [{**template, "data": deflate(MsgpackSerializer.dumps([JOB_FUNC, None, [r.encode()], {}])),
             "created_at": stamp, "enqueued_at": stamp, "description": description(r)} for r in requests]


def built_by_rq(queue: str, requests: list[EmbedRequest], retry: bool) -> list[dict]:
    """The same, built by rq itself (the templates' source, and the reference tests compare with)."""
    rq = Queue(queue, connection=_RECORDER, serializer=MsgpackSerializer)
    rq.redis_server_version = _RQ_VERSION
    pipe = _RECORDER.pipeline()
    rq.enqueue_many([_job_data(r, retry) for r in requests], pipeline=pipe)
    fields: dict[str, dict] = {r.id: {} for r in requests}
    for args, _ in pipe.command_stack:
        if args[0] == "HSET" and args[1].startswith(rqkeys.RQ_JOB_PREFIX):
            fields[args[1][len(rqkeys.RQ_JOB_PREFIX):]].update(
                (name, _text(value)) for name, value in zip(args[2::2], args[3::2]) if value != "")
    return [fields[r.id] for r in requests]


def description(request: EmbedRequest) -> str:
    """rq's `description` of the job (what rq's tools show for it)."""
    part = request.part_of
    return f"embed part {part.index + 1} of {part.parts} of {part.parent}" if part else \
        f"embed {len(request.inputs)} input(s) with {request.model}"


def _job_data(request: EmbedRequest, retry: bool):
    return Queue.prepare_data(
        JOB_FUNC, args=[request.encode()], job_id=request.id, timeout=JOB_TIMEOUT,
        result_ttl=RESULT_TTL, ttl=JOB_TTL, failure_ttl=FAILURE_TTL,
        retry=Retry(max=JOB_RETRIES) if retry else None, description=description(request))


def _text(value):
    """A field value as rq sends it (enums by value, numbers as they are)."""
    return getattr(value, "value", value)


_PROTOTYPE = EmbedRequest(id="prototype", model="prototype", inputs=["prototype"])
