"""rq jobs as the producer enqueues them, without a Producer (the job's args, options and queue overridable, so
that a test can enqueue what no producer would), the rq Queue to read them back through, and texts to embed."""

from __future__ import annotations

from rq import Queue

from embedfleet.common.policy import FAILURE_TTL, JOB_TIMEOUT, JOB_TTL, RESULT_TTL
from embedfleet.common.protocol.jobdata import JOB_FUNC
from embedfleet.common.protocol.keys import queue_name
from embedfleet.common.request import EmbedRequest
from embedfleet.common.serializer import MsgpackSerializer


def rq_queue(conn, model: str) -> Queue:
    return Queue(queue_name(model), connection=conn, serializer=MsgpackSerializer)


def enqueue(conn, request: EmbedRequest, *args, queue: str | None = None, **job_kwargs):
    """Enqueue as the producer does: one rq job per request, job id = request id, on the queue of the
    request's model (args, options and the queue's model overridable)."""
    options = {"ttl": JOB_TTL, "result_ttl": RESULT_TTL, "failure_ttl": FAILURE_TTL, "job_timeout": JOB_TIMEOUT,
               **job_kwargs}
    return rq_queue(conn, queue or request.model).enqueue(
        JOB_FUNC, *(args or (request.encode(),)), job_id=request.id, description=f"embed {len(request.inputs)}",
        **options)


def texts(count: int) -> list[str]:
    words = "red green blue fast slow cat dog river mountain quantum cloud paper".split()
    return [" ".join(words[(i * 7 + j) % len(words)] for j in range(3 + i % 9)) for i in range(count)]
