"""The worker's spans of each request (docs/tracing.md), made after the fact from the timestamps its round
took at each step (worker/serving/rounds.py `Stamps`): nothing on the device's path, a few clock reads per
round, and the spans built in the finish stage once the round is published. Loaded only when tracing is on.

    caller's span (the request's traceparent: the producer's submit)
    └── process <model>  consumer  enqueued (the request's created_at) -> its answer published
        ├── queue wait             enqueued -> its take began
        ├── take                   the take script (Redis)
        ├── prepare                decode and triage, then:
        │   └── tokenise           verify, tokenise, cache lookup (the engine's prepare)
        ├── forward                the round's forward passes: its rows, tokens, passes; this request's share
        ├── finish                 cut, normalise, cast, answers
        └── publish                the store-and-acknowledge script

One span per request for its share of a forward pass (as TEI and vLLM trace), the pass's size as attributes:
a trace viewer shows each request's whole tree without following links, which a span per pass, linked from
each request, would need (and it would sit in one trace only). A request without a traceparent starts a trace
of its own; the sampler (OTEL_TRACES_SAMPLER, parent-based by default) honours a caller's sampled flag.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from opentelemetry.trace import Span, Status, StatusCode

from embedfleet.common.protocol.records import Answer
from embedfleet.common.request import EmbedRequest
from embedfleet.common.tracing import spans

log = logging.getLogger("embedfleet.worker")


@dataclass
class _Traced:
    """One request's process span, open from the finish stage's start until its answer is published."""

    span: Span
    request: EmbedRequest
    index: int  # its place in the round's work
    queue: str
    enqueued: int  # ns since the epoch, as its producer stamped it
    began: int  # its take began (ns), as seen from this request: never before it was enqueued
    taken: int  # the take returned (ns)


class RoundTraces:
    """Builds the spans of a worker's rounds. `tracer`: common.tracing.sdk.Tracing's tracer for the worker."""

    def __init__(self, tracer, worker: str, model: str):
        self.tracer = tracer
        self.worker = worker
        self.model = model
        self._failed_once = False

    def open(self, round_) -> dict[str, _Traced]:
        """Each runnable request's process span, begun (by job id): its context is what a spread request's
        parts carry. Never raises: a tracing fault costs the round its spans, not its answers."""
        try:
            return self._open(round_)
        except Exception:  # noqa: BLE001 - a bug in tracing must not fail a round; logged once
            self._fault("opening")
            return {}

    def carried(self, opened: dict[str, _Traced], job_id: str) -> tuple[str | None, str | None]:
        traced = opened.get(job_id)
        return spans.carried(traced.span) if traced is not None else (None, None)

    def close(self, round_, opened: dict[str, _Traced], written: list[Answer]) -> None:
        """The steps' spans under each process span, which ends at the publish. Never raises."""
        try:
            codes = {answer.taken.id: answer.code for answer in written}
            for job_id, traced in opened.items():
                self._close(round_, traced, codes.get(job_id, ""))
        except Exception:  # noqa: BLE001 - as in open
            self._fault("closing")

    def _open(self, round_) -> dict[str, _Traced]:
        stamps, opened = round_.stamps, {}
        if round_.work is None:
            return opened
        # a round of parked followers only, made when the worker stops, took nothing itself: its prepare
        taken = stamps.taken or stamps.tokenise or stamps.finish
        for index, (job, request) in enumerate(zip(round_.runnable, round_.work.requests)):
            enqueued = min(int(request.created_at * 1e9), taken)  # another host's clock may run ahead
            began = min(max(stamps.take, enqueued), taken)  # a blocking take that waited for it began with it
            parent = spans.remote(request.traceparent, request.tracestate)
            span = spans.start(self.tracer, f"process {self.model}", parent, enqueued, kind="consumer", attributes={
                "messaging.system": "rq", "messaging.operation.type": "process", "messaging.destination.name":
                job.queue, "messaging.message.id": job.id, "embedfleet.model": self.model,
                "embedfleet.worker": self.worker, "embedfleet.deliveries": job.deliveries})
            opened[job.id] = _Traced(span, request, index, job.queue, enqueued, began, taken)
        return opened

    def _close(self, round_, traced: _Traced, code: str) -> None:
        span, stamps = traced.span, round_.stamps
        if span.is_recording():
            record = spans.record
            record(self.tracer, "queue wait", span, traced.enqueued, traced.began)
            record(self.tracer, "take", span, traced.began, traced.taken, {"embedfleet.round.requests": round_.size})
            prepare = spans.start(self.tracer, "prepare", span, traced.taken)
            record(self.tracer, "tokenise", prepare, stamps.tokenise, stamps.prepared, self._tokens(round_, traced))
            prepare.end(end_time=stamps.prepared)
            if stamps.forwarded:  # a round given back before the device has no forward pass
                record(self.tracer, "forward", span, stamps.forward, stamps.forwarded, self._forward(round_, traced))
            record(self.tracer, "finish", span, stamps.finish, stamps.answered)
            record(self.tracer, "publish", span, stamps.answered, stamps.published)
            if code:
                span.set_attribute("error.type", code)
                span.set_status(Status(StatusCode.ERROR, code))
        span.end(end_time=max(traced.began, stamps.published))

    @staticmethod
    def _tokens(round_, traced: _Traced) -> dict:
        prepared = round_.work.prepared_of(traced.index)
        if prepared is None:  # answered at prepare (its own error, tokenize) or spread over the fleet
            return {"embedfleet.request.inputs": len(traced.request.inputs)}
        return {"embedfleet.request.inputs": prepared.texts, "embedfleet.request.tokens": prepared.prompt_tokens}

    def _forward(self, round_, traced: _Traced) -> dict:
        work = round_.work
        return {**self._tokens(round_, traced), "embedfleet.round.requests": len(round_.runnable),
                "embedfleet.round.rows": work.texts, "embedfleet.round.passes": work.passes,
                "embedfleet.round.tokens": work.tokens, "embedfleet.round.padded_tokens": work.padded_tokens}

    def _fault(self, what: str) -> None:
        if not self._failed_once:
            self._failed_once = True
            log.exception("worker %s: %s a round's spans failed; its requests go untraced (logged once)",
                          self.worker, what)
