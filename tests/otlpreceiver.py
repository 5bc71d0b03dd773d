"""A real OTLP/HTTP trace receiver on loopback, as a collector is to the exporters: POST /v1/traces with an
ExportTraceServiceRequest (protobuf, maybe gzip), decoded with opentelemetry-proto into plain span records the
tests read. `hang=True`: it takes each export's bytes and never answers (a collector that is stuck)."""

from __future__ import annotations

import gzip
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (ExportTraceServiceRequest,
                                                                      ExportTraceServiceResponse)

KINDS = {0: "unspecified", 1: "internal", 2: "server", 3: "client", 4: "producer", 5: "consumer"}


@dataclass
class Span:
    service: str
    name: str
    kind: str
    trace_id: str
    span_id: str
    parent_id: str  # "" for a root
    start_ns: int
    end_ns: int
    attributes: dict = field(default_factory=dict)
    links: list[tuple[str, str]] = field(default_factory=list)  # (trace id, span id)
    error: bool = False


def _value(any_value):
    kind = any_value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in any_value.array_value.values]
    return getattr(any_value, kind) if kind else None


def decode(body: bytes) -> list[Span]:
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    found = []
    for resource_spans in request.resource_spans:
        resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                found.append(Span(
                    service=resource.get("service.name", ""), name=span.name, kind=KINDS[span.kind],
                    trace_id=span.trace_id.hex(), span_id=span.span_id.hex(), parent_id=span.parent_span_id.hex(),
                    start_ns=span.start_time_unix_nano, end_ns=span.end_time_unix_nano,
                    attributes={a.key: _value(a.value) for a in span.attributes},
                    links=[(link.trace_id.hex(), link.span_id.hex()) for link in span.links],
                    error=span.status.code == 2))
    return found


class Receiver:
    """`url`: the base URL for OTEL_EXPORTER_OTLP_ENDPOINT / --otlp-endpoint; `spans`: what arrived. `port`: a
    loopback port of the test's choosing (one an exporter already sends to), else a free one."""

    def __init__(self, hang: bool = False, port: int = 0):
        self.spans: list[Span] = []
        self.posts = 0
        self.hang = hang
        self._changed = threading.Condition()
        self._release = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with receiver._changed:
                    receiver.posts += 1
                    receiver._changed.notify_all()
                if receiver.hang:  # hold the exporter's connection until the test ends
                    receiver._release.wait(120)
                    return
                if self.path != "/v1/traces":
                    self.send_error(404)
                    return
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                spans = decode(body)
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)
                with receiver._changed:
                    receiver.spans.extend(spans)
                    receiver._changed.notify_all()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def wait_for(self, done, timeout: float = 60.0) -> list[Span]:
        """The spans received once `done(spans)` holds; AssertionError with what came, after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while not done(self.spans):
                left = deadline - time.monotonic()
                assert left > 0, f"the spans awaited did not arrive; got {[(s.service, s.name) for s in self.spans]}"
                self._changed.wait(left)
            return list(self.spans)

    def wait_posts(self, count: int, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        with self._changed:
            while self.posts < count:
                left = deadline - time.monotonic()
                assert left > 0, f"{self.posts} exports arrived, {count} awaited"
                self._changed.wait(left)

    def close(self) -> None:
        self._release.set()
        self.server.shutdown()
        self.server.server_close()


def tree(spans: list[Span]) -> str:
    """The spans as an indented tree (by parent), roots first, for a failing assertion's message and reports."""
    by_parent: dict[str, list[Span]] = {}
    ids = {s.span_id for s in spans}
    for span in sorted(spans, key=lambda s: s.start_ns):
        by_parent.setdefault(span.parent_id if span.parent_id in ids else "", []).append(span)
    lines: list[str] = []

    def walk(parent: str, depth: int) -> None:
        for span in by_parent.get(parent, []):
            ms = (span.end_ns - span.start_ns) / 1e6
            lines.append(f"{'  ' * depth}{span.name} [{span.service}, {span.kind}] {ms:.1f} ms"
                         f"{' (parent ' + span.parent_id + ', not received)' if depth == 0 and span.parent_id else ''}")
            walk(span.span_id, depth + 1)

    walk("", 0)
    return "\n".join(lines)
