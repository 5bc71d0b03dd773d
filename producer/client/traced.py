"""The producer clients' spans (docs/tracing.md): `submits` makes a client's submit a span (kind producer) that
is current while it builds its requests, so that each carries it to the worker (`current`, read by
core.build_request); `waits` makes a wait a span; `linked` starts a trace of its own linked to another (the
gateway's Batch API lines, to their batch). Decorators, so that the clients' own code stays as it is.

They exist where the application has OpenTelemetry set up (common.tracing.client_on), with its tracer
provider and under its current span; elsewhere they are no-ops and nothing of OpenTelemetry is imported.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Iterator

from embedfleet.common import tracing

QUEUE_SYSTEM = "rq"  # messaging.system: the jobs are rq jobs on Redis


def _carriable(traceparent: str | None, tracestate: str | None) -> tuple[str | None, str | None]:
    """What of a context a request can carry: a tracestate our wire format refuses (OpenTelemetry accepts some)
    is left out, never a reason to refuse the request."""
    if traceparent is None or tracing.traceparent_problem(traceparent):
        return None, None
    return traceparent, tracestate if tracestate and not tracing.tracestate_problem(tracestate) else None


def current() -> tuple[str | None, str | None]:
    """(traceparent, tracestate) of the current span, as a request carries it (or a batch keeps its creator's);
    Nones where there is none, or where the application does not trace."""
    if not tracing.client_on():
        return None, None
    from embedfleet.common.tracing import spans  # noqa: PLC0415 - only where the application traces

    return _carriable(*spans.carried())


@contextlib.contextmanager
def _span(name: str, kind: str, attributes: dict, link: tuple | None = None) -> Iterator:
    """A client span, current while the block runs (None where the application does not trace)."""
    if not tracing.client_on():
        yield None
        return
    from embedfleet.common.tracing import spans  # noqa: PLC0415 - only where the application traces

    if link is None:
        with spans.client_span(name, kind, attributes) as span:
            yield span
    else:
        with spans.linked_root(name, _carriable(*link), attributes) as span:
            yield span


def _submit_span(batches, model: str | None, kwargs: dict):
    attributes = {"messaging.system": QUEUE_SYSTEM, "messaging.operation.type": "send",
                  "messaging.operation.name": "submit", "messaging.batch.message_count": len(batches),
                  "embedfleet.priority": str(kwargs.get("priority") or "interactive")}
    if model is not None:
        attributes["embedfleet.model"] = model
    return _span(f"submit {model}" if model is not None else "submit", "producer", attributes)


def _name_requests(span, request_ids: list[str]) -> None:
    if span is not None:
        if len(request_ids) == 1:
            span.set_attribute("messaging.message.id", request_ids[0])
        span.set_attribute("embedfleet.request_ids", list(request_ids[:64]))


def submits(method):
    """A client's `submit_many(self, batches, model=None, ...) -> ids` (sync or async) as a span."""
    if inspect.iscoroutinefunction(method):
        @functools.wraps(method)
        async def traced_async(self, batches, model=None, *args, **kwargs):
            with _submit_span(batches, model, kwargs) as span:
                ids = await method(self, batches, model, *args, **kwargs)
                _name_requests(span, ids)
                return ids
        return traced_async

    @functools.wraps(method)
    def traced(self, batches, model=None, *args, **kwargs):
        with _submit_span(batches, model, kwargs) as span:
            ids = method(self, batches, model, *args, **kwargs)
            _name_requests(span, ids)
            return ids
    return traced


def waits(method):
    """A client's `wait(self, request_id, ...)` (sync or async) as a span: from the wait to the result read, the
    worker's queue wait, work and publish, and the wake-up."""
    if inspect.iscoroutinefunction(method):
        @functools.wraps(method)
        async def traced_async(self, request_id, *args, **kwargs):
            with _span("wait", "internal", {"messaging.message.id": str(request_id)}):
                return await method(self, request_id, *args, **kwargs)
        return traced_async

    @functools.wraps(method)
    def traced(self, request_id, *args, **kwargs):
        with _span("wait", "internal", {"messaging.message.id": str(request_id)}):
            return method(self, request_id, *args, **kwargs)
    return traced


@contextlib.contextmanager
def linked(name: str, link: tuple[str | None, str | None], attributes: dict) -> Iterator[None]:
    """A span that starts a trace of its own, linked to the span `link` names, current while the block runs."""
    with _span(name, "internal", attributes, link=link):
        yield
