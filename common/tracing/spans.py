"""Spans through OpenTelemetry's API (no SDK needed): the producer clients', the gateway's, and the worker's
made after the fact from a round's timestamps. Imported only where OpenTelemetry is loaded (common.tracing).

A request carries its caller's span as W3C `traceparent` / `tracestate` strings (common/request.py): `carried`
writes them from a span, `remote` reads them back into a parent context on the worker.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

TRACER_NAME = "embedfleet"
_W3C = TraceContextTextMapPropagator()
KINDS = {"producer": SpanKind.PRODUCER, "consumer": SpanKind.CONSUMER, "server": SpanKind.SERVER,
         "client": SpanKind.CLIENT, "internal": SpanKind.INTERNAL}


def tracer(component: str, provider: trace.TracerProvider | None = None) -> trace.Tracer:
    """`component`'s tracer from `provider`, else from the global one (an application's, or an entry point's)."""
    return trace.get_tracer(f"{TRACER_NAME}.{component}", tracer_provider=provider)


def carried(span: Span | None = None) -> tuple[str | None, str | None]:
    """(traceparent, tracestate) of `span` (default: the current one) as a request carries them; (None, None)
    where there is no valid span to carry."""
    carrier: dict[str, str] = {}
    context = trace.set_span_in_context(span) if span is not None else None
    _W3C.inject(carrier, context=context)
    return carrier.get("traceparent"), carrier.get("tracestate") or None


def remote(traceparent: str | None, tracestate: str | None = None) -> otel_context.Context:
    """A context whose span is the caller's (a remote parent), or an empty one (a new trace) without one."""
    if not traceparent:
        return otel_context.Context()
    carrier = {"traceparent": traceparent, **({"tracestate": tracestate} if tracestate else {})}
    return _W3C.extract(carrier, context=otel_context.Context())


def from_headers(headers: Mapping[str, str]) -> otel_context.Context:
    """The caller's context from HTTP headers (a malformed traceparent is ignored, as W3C says: a new trace)."""
    return _W3C.extract(headers, context=otel_context.Context())


def link_to(traceparent: str | None, tracestate: str | None = None) -> list[Link]:
    """A link to the span `traceparent` names (none when it names none)."""
    context = trace.get_current_span(remote(traceparent, tracestate)).get_span_context()
    return [Link(context)] if context.is_valid else []


@contextlib.contextmanager
def client_span(name: str, kind: str, attributes: dict, provider=None) -> Iterator[Span]:
    """A span of the producer clients, the current one while the block runs; an exception marks it failed
    (its type as `error.type`) and goes on."""
    with tracer("producer", provider).start_as_current_span(name, kind=KINDS[kind], attributes=attributes,
                                                            record_exception=False,
                                                            set_status_on_exception=False) as span:
        try:
            yield span
        except BaseException as exc:
            failed(span, exc)
            raise


@contextlib.contextmanager
def linked_root(name: str, link: tuple[str | None, str | None], attributes: dict, provider=None) -> Iterator[Span]:
    """A span that starts a trace of its own, linked to the span `link` names (a Batch API line to its batch:
    one trace per line, not one of a whole batch's thousands); current while the block runs."""
    with tracer("producer", provider).start_as_current_span(
            name, context=otel_context.Context(), kind=SpanKind.INTERNAL, attributes=attributes,
            links=link_to(*link), record_exception=False, set_status_on_exception=False) as span:
        try:
            yield span
        except BaseException as exc:
            failed(span, exc)
            raise


def failed(span: Span, exc: BaseException) -> None:
    code = getattr(exc, "code", None)
    span.set_attribute("error.type", code if isinstance(code, str) else type(exc).__qualname__)
    span.set_status(Status(StatusCode.ERROR, str(exc)[:200]))


def start(tracer_: trace.Tracer, name: str, parent: otel_context.Context | Span, start_ns: int, *,
          kind: str = "internal", attributes: dict | None = None, links: list[Link] | None = None) -> Span:
    """A span begun at `start_ns` (nanoseconds since the epoch), child of `parent` (a context, or a span)."""
    context = trace.set_span_in_context(parent) if isinstance(parent, Span) else parent
    return tracer_.start_span(name, context=context, kind=KINDS[kind], attributes=attributes, links=links,
                              start_time=start_ns)


def record(tracer_: trace.Tracer, name: str, parent: Span, start_ns: int, end_ns: int,
           attributes: dict | None = None) -> Span:
    """A span that took place between two timestamps, child of `parent`."""
    span = start(tracer_, name, parent, start_ns, attributes=attributes)
    span.end(end_time=max(start_ns, end_ns))
    return span
