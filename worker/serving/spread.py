"""Spreading a long request's chunks over the fleet: sub-jobs ("parts") on the same queue, joined when the
last one lands, answered once under the request's own id.

    spread  (the worker that took the request, which set it aside before the forward pass: `set_aside`): the plan
            goes under
            keys.chunks_key(id), the parts (<id>-p<k>, token-id requests of at most chunks_per_job chunks,
            unnormalised float32) are enqueued at the head of the queue, and the request is acknowledged
            without an answer: its answer comes from the join
    join    (any worker that served a part, before it acknowledges the part): one Lua script stores the
            part's rows; the worker of the part that completes the set combines them all and publishes the
            request's result; a failed part publishes the request's error instead (SET NX: either lands once,
            however often a part runs). A part is never retried on its own: its failure fails the request.

Every part is answered before its acknowledgement, so a worker dying between the two only makes its part
run again (its lease lapses) and the join, idempotent, answers then. Nothing waits on a part that cannot
come: each ends in the join as served, failed, poisoned or cancelled.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Callable

import numpy as np
import redis
from redis import Redis

from embedfleet.common.codec import packb, unpackb
from embedfleet.common.errors import EmbedfleetError, InternalError
from embedfleet.common.names import valid_request_id
from embedfleet.common.params import PoolingParams
from embedfleet.common.policy import RESULT_TTL_BOUND
from embedfleet.common.protocol import answering, enqueueing, keys, rqkeys
from embedfleet.common.request import EmbedRequest, PartOf
from embedfleet.common.result import Result
from embedfleet.worker.serving import answers
from embedfleet.worker.serving.jobdata import decode_job
from embedfleet.worker.engine.seam import Prepared, Work
from embedfleet.common.protocol.records import Answer, Outcome, Taken

log = logging.getLogger(__name__)

_PART_ID = re.compile(r"(.+)-p(\d{1,9})")


def set_aside(work: Work, chunks_per_job: int) -> dict[int, Prepared]:
    """Take the requests to spread out of `work` (an engine Work, prepared, before its passes): embed requests
    with more chunks than one job should hold (`chunks_per_job`; 0: none). A part never spreads again; a
    prompt left out of pooling stays in one worker, whose first chunk knows it; an id whose parts' ids would
    be invalid stays too."""
    if not chunks_per_job:
        return {}

    def spreads(request: EmbedRequest, prepared: Prepared) -> bool:
        return request.params.task == "embed" and request.params.outputs is None and prepared.owners is not None \
            and request.part_of is None and prepared.texts > chunks_per_job and not prepared.prompt_length \
            and keys.part_id(request.id, prepared.texts) is not None

    return work.set_aside(spreads)


class ChunkJobs:
    """Spreads and joins for one worker: `settle` rewrites a round's answers before they are written.
    `combine(request, rows, owners, weights, prompt_tokens) -> Result`: the engine's result from a spread
    request's chunk rows (ServingEngine.combine_parts, worker/engine/seam.py)."""

    def __init__(self, connection: Redis, queues: list[str], model: str, *, result_ttl: int,
                 chunks_per_job: int, combine: Callable[..., Result], limit=None):
        self.connection = connection
        self.limit = limit  # Redis's value limit (worker/serving/storing.py's BulkLimit), or None: not checked
        self.queues = queues  # a request's parts go on its own level's queue
        self.model = model
        self.result_ttl = result_ttl
        self.chunks_per_job = chunks_per_job
        self.combine = combine
        self.spread_requests = 0
        self.joined_parts = 0

    def settle(self, round_, written: list[Answer], context_of=None) -> list[Answer]:
        """The round's answers with spread requests acknowledged (their parts enqueued) and parts joined.
        `round_`: the pipeline's Round (its `spreads()` and `requests()`); `context_of(job id)`: the trace context
        (traceparent, tracestate) its parts carry (worker/serving/traces.py), None: they carry the request's."""
        where = {answer.taken.id: k for k, answer in enumerate(written)}
        for job, request, prepared in round_.spreads():
            context = context_of(job.id) if context_of is not None else (request.traceparent, request.tracestate)
            try:
                written[where[job.id]] = self._spread(job, request, prepared, context)
            except (redis.ConnectionError, redis.TimeoutError):
                raise  # the round is stored later or recovered, as any
            except Exception as exc:  # this request fails (retried by rq), the round goes on
                log.exception("request %s: spreading its chunks failed", job.id)
                written[where[job.id]] = answers.failed(job, InternalError(
                    f"spreading the chunks failed: {type(exc).__name__}: {exc}"), Outcome.RETRY,
                    round_.reply_to.get(job.id), self.model)
        requests = round_.requests()
        for k, answer in enumerate(written):
            request = requests.get(answer.taken.id)
            part = request.part_of if request is not None else self._part_of(answer.taken)
            if part is not None:
                written[k] = self._join_part(answer, part)
        return written

    # -- spread -----------------------------------------------------------------------------------------

    def _spread(self, job: Taken, request: EmbedRequest, prepared: Prepared,
                context: tuple[str | None, str | None] = (None, None)) -> Answer:
        size = self.chunks_per_job
        groups = [prepared.token_lists[i:i + size] for i in range(0, len(prepared.token_lists), size)]
        parts = [EmbedRequest(id=keys.part_id(request.id, k), model=request.model, inputs=group,
                              params=PoolingParams(use_activation=False),  # raw rows: the join normalises
                              part_of=PartOf(parent=request.id, index=k, parts=len(groups)),
                              traceparent=context[0], tracestate=context[1] if context[0] else None)
                 for k, group in enumerate(groups)]
        plan = packb({"request": request.encode(), "owners": prepared.owners,
                      "weights": [len(ids) for ids in prepared.token_lists],
                      "result_ttl": job.result_ttl or self.result_ttl})
        key = keys.chunks_key(request.id)
        # The plan first, then the parts: a request run again (its worker died in between) finds its plan
        # and enqueues only the parts that are not there yet.
        with self.connection.pipeline() as pipe:
            pipe.hsetnx(key, "plan", plan)
            pipe.hsetnx(key, "parts", len(parts))
            pipe.expire(key, keys.CHUNKS_TTL)
            for part in parts:
                pipe.exists(rqkeys.rq_job_key(part.id))
            exists = pipe.execute()[3:]
        queue = job.queue if job.queue in self.queues else self.queues[0]
        missing = [part for part, there in zip(parts, exists) if not there]
        if missing:
            parts_on_queue = enqueueing.enqueue_args(queue, missing, at_front=True, retry=False)
            enqueueing.enqueue(self.connection, parts_on_queue)
        self.spread_requests += 1
        log.info("request %s: %d chunks spread over the fleet as %d parts", request.id,
                 len(prepared.token_lists), len(parts))
        return Answer(job, Outcome.FINISHED, b"", None)

    # -- join -------------------------------------------------------------------------------------------

    def _part_of(self, taken: Taken) -> PartOf | None:
        """A job answered without running (poisoned, cancelled, undecodable): which part of which request
        it is, from its request or, where its data is unreadable, from its id (`parts` then unknown: 0)."""
        found = _PART_ID.fullmatch(taken.id)
        if found is None or not valid_request_id(found[1]):
            return None
        try:
            return decode_job(taken.id, taken.data, self.model).part_of
        except EmbedfleetError:
            return PartOf.model_construct(parent=found[1], index=int(found[2]), parts=0)

    def _join_part(self, answer: Answer, part: PartOf) -> Answer:
        result = _decoded(answer.blob)
        ok = answer.outcome is Outcome.FINISHED and result is not None and result.ok
        if ok:
            blob = answer.blob
        else:
            error = result.error if result is not None and not result.ok else \
                InternalError(answer.reason or f"part ended {answer.outcome.value}")
            blob = Result.failure(part.parent, self.model, type(error)(
                f"chunk part {part.index + 1}{f' of {part.parts}' if part.parts else ''} failed: {error.message}",
                param=error.param)).encode()
        joined = answering.join(self.connection, part.parent, part.index, blob, ok)
        if joined.code == 1:
            self._answer(part.parent, joined.fields)
        elif joined.code == 2:
            self._publish(_decoded(joined.error) or Result.failure(part.parent, self.model, InternalError(
                "a chunk part failed (its stored error is unreadable)")), _plan(joined.plan))
        elif joined.code == 3:  # its join state was changed by hand: the request fails with the reason
            self._publish(Result.failure(part.parent, self.model, InternalError(
                f"the spread request's join state is unreadable: {joined.what}")), _plan(joined.plan))
        elif joined.code == -1:  # no spread request of that id (expired, or an id that only looks like a part's)
            log.warning("job %s: no spread request %s to join; answered as a request of its own", answer.taken.id,
                        part.parent)
            return answer
        self.joined_parts += 1
        # Never published under the part's own id (no one waits there), never retried alone.
        outcome = Outcome.FAILED if answer.outcome is Outcome.RETRY else answer.outcome
        return dataclasses.replace(answer, outcome=outcome, blob=b"", reply_to=None)

    def _answer(self, parent: str, fields: dict[str, bytes]) -> None:
        """Every part is in: combine the chunk rows into the request's embeddings and publish them once."""
        plan = _plan(fields.get("plan"))
        try:
            result = self._combined(parent, plan, fields)
        except Exception as exc:  # the request gets this error rather than no answer
            log.exception("request %s: combining its parts failed", parent)
            result = Result.failure(parent, self.model, InternalError(
                f"combining the chunk parts failed: {type(exc).__name__}: {exc}"))
        self._publish(result, plan)

    def _combined(self, parent: str, plan: dict, fields: dict[str, bytes]) -> Result:
        request = EmbedRequest.decode(plan["request"])
        parts = [Result.decode(fields[f"part:{k}"]) for k in range(int(fields["parts"]))]  # the join checked it
        for part in parts:
            if not part.ok or part.embed_dtype != "float32" or len(part.shape) != 2:
                raise ValueError(f"part {part.id} holds no float32 rows")
        rows = [part.embeddings for part in parts]
        owners, weights = plan["owners"], plan["weights"]
        if sum(len(r) for r in rows) != len(owners) or len(weights) != len(owners):
            raise ValueError(f"the parts hold {sum(len(r) for r in rows)} rows for {len(owners)} chunks")
        if request.id != parent:  # answered under the id its parts joined, whatever the plan says
            request = request.model_copy(update={"id": parent})
        return self.combine(request, np.vstack(rows), owners, weights, sum(part.usage.prompt_tokens for part in parts))

    def _publish(self, result: Result, plan: dict) -> None:
        if result.ok and self.limit is not None:  # a combined answer Redis cannot take: its request fails alone
            limit = self.limit.current()
            if len(blob := result.encode()) > limit:
                error = answers.too_large_error(result.id, blob, limit, self.limit.read)
                log.warning("%s", error.message)
                result = Result.failure(result.id, self.model, error)
        reply_to = None
        try:
            reply_to = EmbedRequest.decode(plan["request"]).reply_to
        except (KeyError, EmbedfleetError):
            pass  # the answer still lands under its id; only the reply-stream wake-up is lost
        ttl = plan.get("result_ttl")
        ttl = ttl if isinstance(ttl, int) and 0 < ttl <= RESULT_TTL_BOUND else self.result_ttl
        answering.publish(self.connection, result, ttl, reply_to, only_if_absent=True,
                           done_with=keys.chunks_key(result.id))
        log.info("request %s: answered from its parts (%s)", result.id, result.status)


def _decoded(blob: bytes) -> Result | None:
    try:
        return Result.decode(blob) if blob else None
    except EmbedfleetError:
        return None


def _plan(raw) -> dict:
    """The stored plan, or {} where Redis holds something else (every use of it then fails cleanly)."""
    try:
        plan = unpackb(raw)
    except Exception:  # noqa: BLE001 - bytes from Redis: anything may be there
        return {}
    return plan if isinstance(plan, dict) else {}
