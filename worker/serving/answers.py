"""What the finish step writes for each taken job: the Answer (outcome, result blob, reason) decided from
the engine's result or from why the job could not run. Pure: no Redis, no model."""

from __future__ import annotations

from embedfleet.common.errors import (CancelledError, DecodeError, EmbedfleetError, ExpiredError, InternalError,
                                      PoisonError, ResultTooLargeError)
from embedfleet.common.protocol.jobdata import JOB_FUNC
from embedfleet.common.request import EmbedRequest
from embedfleet.common.result import Result, inputs_answered
from embedfleet.worker.serving.jobdata import decode_job
from embedfleet.common.protocol.records import Answer, Outcome, Taken


def served(job: Taken, result: Result | None, reply_to: str | None, model: str) -> Answer:
    """FINISHED with the request's answer (embeddings or its own error); an engine fault is retried."""
    if result is None or result.id != job.id:
        return failed(job, InternalError(f"engine returned no result for request {job.id}"), Outcome.RETRY,
                      reply_to, model)
    if result.error_code == InternalError.code:  # not the request's fault: rq's Retry may help
        return Answer(job, Outcome.RETRY, result.encode(), reply_to,
                      reason=f"{result.error_code}: {result.error_message}", code=result.error_code)
    return Answer(job, Outcome.FINISHED, result.encode(), reply_to,
                  code="" if result.ok else result.error_code or "internal_error")


def failed(job: Taken, error: EmbedfleetError, outcome: Outcome, reply_to: str | None, model: str) -> Answer:
    """FAILED (or RETRY while retries last) with `error` as the answer and rq's reason; `reply_to` None: the
    reply stream the job names (its request may be unreadable)."""
    prefix = f"{JOB_FUNC}: job {job.id}: " if isinstance(error, DecodeError) else ""
    return Answer(job, outcome, Result.failure(job.id, model, error).encode(), reply_to or job.reply_to,
                  reason=f"{prefix}{error.message}", code=error.code)


def reply_stream_of(job: Taken, model: str) -> str | None:
    """The reply stream a job names: its `reply_to` field, else its request's (when its data reads as a
    request for `model`; bad data names none that is trusted)."""
    if job.reply_to:
        return job.reply_to
    try:
        return decode_job(job.id, job.data, model).reply_to
    except EmbedfleetError:
        return None


def corrupt(job: Taken, model: str) -> Answer:
    """FAILED, never run: take found a field or key of its job that no producer writes (Taken.reason)."""
    error = DecodeError(f"{job.reason}; the request was not run", b"")
    return failed(job, error, Outcome.FAILED, reply_stream_of(job, model), model)


def cancelled(job: Taken, model: str) -> Answer:
    error = CancelledError("the request was cancelled before a worker took it")
    return Answer(job, Outcome.CANCELED, Result.failure(job.id, model, error).encode(), reply_stream_of(job, model),
                  code=error.code)


def poisoned(job: Taken, model: str, max_deliveries: int) -> Answer:
    error = PoisonError(f"request {job.id} was taken {job.lapses} times and each worker that took it died or hung "
                        f"before answering; it is not run again (the limit is --max-deliveries {max_deliveries}). "
                        f"Inspect it with `embedfleet failed show {job.id}`")
    return failed(job, error, Outcome.FAILED, reply_stream_of(job, model), model)


def expired(job: Taken, request: EmbedRequest, now: float) -> Answer:
    """FAILED `expired`: the request's deadline passed while it was queued, so it is not computed."""
    error = ExpiredError(f"request {job.id} was still queued {now - request.deadline:.3f} s after its deadline "
                         f"({request.deadline:.3f}); it was not computed. Send a later `deadline` or a longer "
                         "`timeout`, or a higher `priority`")
    return failed(job, error, Outcome.FAILED, request.reply_to, request.model)


def too_large_error(request_id: str, blob: bytes, limit: int, read: bool) -> ResultTooLargeError:
    """`blob`, the request's answer, is over Redis's proto-max-bulk-len `limit` (`read`: from CONFIG GET; else
    the largest size Redis has not refused, CONFIG being refused): what it is, and what fits."""
    size, inputs = len(blob), inputs_answered(blob)
    if read:
        what = (f"its result is {size:,} bytes, more than one Redis value may hold: Redis's proto-max-bulk-len is "
                f"{limit:,}")
    else:
        what = (f"its result is {size:,} bytes, and Redis refuses values of that size (its proto-max-bulk-len, which "
                "this worker may not read with CONFIG GET, is smaller)")
    fits = max(inputs * limit // size, 1) if inputs and read else None  # a refusal tells no limit to fit
    fewer = f"fewer inputs per request (this one had {inputs:,}; about {fits:,} fit)" if fits else \
        f"fewer inputs per request (this one had {inputs:,})" if inputs else "fewer inputs per request"
    return ResultTooLargeError(
        f"request {request_id} cannot be answered: {what}. It was computed once and is not run again. Send "
        f"{fewer}, a smaller `embed_dtype` (float16 or bfloat16 halve it, int8 "
        "quarters it, binary stores 1 bit per dimension) or fewer `dimensions` where the model allows, or ask "
        "the operator to raise Redis's proto-max-bulk-len")


def too_large(answer: Answer, limit: int, read: bool, model: str) -> Answer:
    """FAILED `result_too_large` in place of an answer whose blob Redis cannot take; never retried (the same
    result would be refused again)."""
    error = too_large_error(answer.taken.id, answer.blob, limit, read)
    return failed(answer.taken, error, Outcome.FAILED, answer.reply_to, model)
