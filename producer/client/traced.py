"""The producer clients' spans (docs/tracing.md): `submit` (kind producer) around building and enqueueing
requests, whose context each request carries to the worker, and `wait` around waiting for a result; `linked`
starts a trace of its own linked to another (the gateway's Batch API lines, to their batch).

They exist where the application has OpenTelemetry set up (common.tracing.client_on), with its tracer
provider and under its current span; elsewhere they are no-ops and nothing of OpenTelemetry is imported.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from common import tracing

QUEUE_SYSTEM = "rq"  # messaging.system: the jobs are rq jobs on Redis


class Traced:
    """A client span as the code around it sees it: the context requests carry, and what to add to it."""

    context: tuple[str | None, str | None] = (None, None)  # (traceparent, tracestate) for the requests

    def requests(self, request_ids: list[str]) -> None:
        """Name the requests the span submitted or waited for."""


class _Spanned(Traced):
    def __init__(self, span, carried):
        self.span = span
        self.context = _carriable(*carried(span))

    def requests(self, request_ids: list[str]) -> None:
        if len(request_ids) == 1:
            self.span.set_attribute("messaging.message.id", request_ids[0])
        self.span.set_attribute("embedfleet.request_ids", list(request_ids[:64]))


_OFF = Traced()


def _carriable(traceparent: str | None, tracestate: str | None) -> tuple[str | None, str | None]:
    """What of a context a request can carry: a tracestate our wire format refuses (OpenTelemetry accepts some)
    is left out, never a reason to refuse the request."""
    if traceparent is None or tracing.traceparent_problem(traceparent):
        return None, None
    return traceparent, tracestate if tracestate and not tracing.tracestate_problem(tracestate) else None


@contextlib.contextmanager
def submit(model: str, queue: str, count: int) -> Iterator[Traced]:
    """The span of one submit of `count` requests to `queue`."""
    if not tracing.client_on():
        yield _OFF
        return
    from common.tracing import spans  # noqa: PLC0415 - only where the application traces

    attributes = {"messaging.system": QUEUE_SYSTEM, "messaging.operation.type": "send",
                  "messaging.operation.name": "submit", "messaging.destination.name": queue,
                  "messaging.batch.message_count": count, "embedfleet.model": model}
    with spans.client_span(f"submit {model}", "producer", attributes) as span:
        yield _Spanned(span, spans.carried)


@contextlib.contextmanager
def wait(request_id: str) -> Iterator[Traced]:
    """The span of waiting for one request's result (from its wait to its result read: the worker's queue
    wait, work and publish, and the wake-up)."""
    if not tracing.client_on():
        yield _OFF
        return
    from common.tracing import spans  # noqa: PLC0415 - only where the application traces

    with spans.client_span("wait", "internal", {"messaging.message.id": request_id}) as span:
        yield _Spanned(span, spans.carried)


def current() -> tuple[str | None, str | None]:
    """(traceparent, tracestate) of the current span, to be linked to later (a batch keeps its creator's); Nones
    where there is none."""
    if not tracing.client_on():
        return None, None
    from common.tracing import spans  # noqa: PLC0415 - only where the application traces

    return _carriable(*spans.carried())


@contextlib.contextmanager
def linked(name: str, link: tuple[str | None, str | None], attributes: dict) -> Iterator[Traced]:
    """A span that starts a trace of its own, linked to the span `link` names, current while the block runs."""
    if not tracing.client_on():
        yield _OFF
        return
    from common.tracing import spans  # noqa: PLC0415 - only where the application traces

    with spans.linked_root(name, _carriable(*link), attributes) as span:
        yield _Spanned(span, spans.carried)
