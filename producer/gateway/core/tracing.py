"""The gateway's span per HTTP request (kind server, named `METHOD /route/template`), child of the caller's
W3C `traceparent` header: the producer's spans (producer/client/traced.py) and through them the worker's are
under it. Installed by create_app only when tracing is on (docs/tracing.md)."""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from embedfleet.common.tracing import spans
from embedfleet.producer.gateway.core.metrics import route_of

_CONTEXT_HEADERS = (b"traceparent", b"tracestate")


class TraceRequests:
    """ASGI middleware: one server span around each HTTP request, current while the app answers it."""

    def __init__(self, app: ASGIApp, tracer: trace.Tracer, routes) -> None:
        self.app = app
        self.tracer = tracer
        self.routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        # a malformed traceparent is ignored (a new trace), as W3C Trace Context says: never a refused request
        parent = spans.from_headers({name.decode("latin-1"): value.decode("latin-1")
                                     for name, value in scope["headers"] if name in _CONTEXT_HEADERS})
        method = scope["method"]
        span = self.tracer.start_span(method, context=parent, kind=SpanKind.SERVER, attributes={
            "http.request.method": method, "url.path": scope["path"], "url.scheme": scope.get("scheme", "http"),
            "network.protocol.version": scope.get("http_version", "1.1")})
        status = 500

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        with trace.use_span(span, end_on_exit=False, record_exception=False, set_status_on_exception=False):
            try:
                await self.app(scope, receive, send_status)
            except BaseException as exc:
                spans.failed(span, exc)
                raise
            finally:
                route = route_of(scope, self.routes)
                if route != "unmatched":
                    span.update_name(f"{method} {route}")
                    span.set_attribute("http.route", route)
                span.set_attribute("http.response.status_code", status)
                if status >= 500:  # a server's span fails on 5xx only (HTTP semantic conventions)
                    span.set_attribute("error.type", str(status))
                    span.set_status(Status(StatusCode.ERROR))
                span.end()
