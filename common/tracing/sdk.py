"""The OpenTelemetry SDK as an entry point sets it up (common.tracing.start): a tracer provider with a batch
processor for each exporter (OTLP, the console), bounded so that a dead or slow collector costs a request nothing.

OpenTelemetry's own variables are honoured: OTEL_SERVICE_NAME (else `service`), OTEL_RESOURCE_ATTRIBUTES,
OTEL_TRACES_SAMPLER / _ARG (default: parentbased_always_on, so a caller's sampled flag decides),
OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL (http/protobuf, the default; grpc with the opentelemetry-exporter-otlp-
proto-grpc package), _ENDPOINT, _HEADERS, _TIMEOUT, _COMPRESSION, _CERTIFICATE, and OTEL_BSP_* for the batch
processor. --otlp-endpoint (TEI's flag) is a collector's base URL, as OTEL_EXPORTER_OTLP_ENDPOINT is.

Bounded: spans wait in the batch processor's queue (OTEL_BSP_MAX_QUEUE_SIZE, 2048) and a thread of its own
exports them; a full queue drops spans, never blocks. An export gives up after its timeout (10 s). At exit the
processor gets SHUTDOWN_SECONDS to send what it holds, then the process goes on without it.

Quiet: a collector that stops answering is one warning (the endpoint, the first reason the exporter gave), not the
exporter's three warnings and an error per batch; nothing more while it stays down, then one line when an export
succeeds again with how many spans were dropped meanwhile (_Watched).
"""

from __future__ import annotations

import atexit
import logging
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter, SpanExportResult

from embedfleet.common.errors import StartupError

log = logging.getLogger("embedfleet.tracing")

SHUTDOWN_SECONDS = 2.0  # what the exit waits for the last spans to be sent (a dead collector: no longer)
DROP_LOG_EVERY = 60.0  # seconds between two warnings that the span queue is full (spans are being dropped)
PROTOCOLS = ("http/protobuf", "grpc")
TRACER_NAME = "embedfleet"


@dataclass
class Tracing:
    """A traced process: its provider (also the global one), where its spans go, and how it ends."""

    provider: TracerProvider
    destinations: str
    _closing: threading.Thread | None = None

    def tracer(self, component: str) -> trace.Tracer:
        return self.provider.get_tracer(f"{TRACER_NAME}.{component}")

    def shutdown(self, timeout: float = SHUTDOWN_SECONDS) -> None:
        """Send what is queued, for at most `timeout` seconds: the SDK's own shutdown waits up to 30 s for a
        collector, so it runs on a daemon thread that the exit does not wait for past `timeout`."""
        if self._closing is None:
            self._closing = threading.Thread(target=self.provider.shutdown, name="tracing-shutdown", daemon=True)
            self._closing.start()
        self._closing.join(timeout)


def setup(service: str, endpoint: str | None, environ: Mapping[str, str],
          exporters: tuple[str, ...] = ("otlp",)) -> Tracing:
    """`exporters`: "console" and/or "otlp" (common.tracing.exporters)."""
    protocol = (environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
                or "http/protobuf").strip()
    if "otlp" in exporters and protocol not in PROTOCOLS:
        raise StartupError(f"OTEL_EXPORTER_OTLP_PROTOCOL {protocol!r} is not supported: use one of "
                           f"{list(PROTOCOLS)}")
    attributes = {} if environ.get("OTEL_SERVICE_NAME", "").strip() else {"service.name": service}
    # shutdown_on_exit=False: the SDK's own exit hook waits up to 30 s for a collector; ours, SHUTDOWN_SECONDS
    provider = TracerProvider(resource=Resource.create(attributes), shutdown_on_exit=False)
    destinations, watched = [], None
    if "console" in exporters:  # first: the provider shuts its processors down in order, a dead collector last
        # a batch processor, as for OTLP, not the SimpleSpanProcessor: formatting and writing the spans runs on the
        # processor's thread, off the request path (the gateway's event loop, the worker's finish stage), and a
        # stderr that blocks (a pipe nobody reads) drops spans instead of stalling requests; the price is up to
        # OTEL_BSP_SCHEDULE_DELAY (5 s) before they print
        provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter(out=sys.stderr, formatter=_one_line)))
        destinations.append("stderr (console)")
    if "otlp" in exporters:
        exporter = _exporter(protocol, endpoint)
        watched = _Watched(exporter, _target(exporter, endpoint))
        provider.add_span_processor(BatchSpanProcessor(watched))
        destinations.append(f"{watched.target} ({protocol})")
    trace.set_tracer_provider(provider)
    logging.getLogger("opentelemetry.sdk._shared_internal").addFilter(_QueueFull(watched))
    tracing = Tracing(provider, " and ".join(destinations))
    atexit.register(tracing.shutdown)
    log.info("tracing: spans of service %s go to %s", provider.resource.attributes.get("service.name"),
             tracing.destinations)
    return tracing


def _one_line(span: ReadableSpan) -> str:
    """A span as one JSON line (the SDK's default spreads each over some 40 lines): grep and jq read it."""
    return span.to_json(indent=None) + "\n"


def _exporter(protocol: str, endpoint: str | None) -> SpanExporter:
    """The OTLP exporter of `protocol`; `endpoint` (a base URL) overrides the variables'."""
    if protocol == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (  # noqa: PLC0415 - grpc only
                OTLPSpanExporter as GrpcExporter)
        except ImportError as exc:
            raise StartupError("OTEL_EXPORTER_OTLP_PROTOCOL=grpc needs the gRPC exporter, which the [tracing] "
                               "extra leaves out (grpcio is large): pip install opentelemetry-exporter-otlp-proto-"
                               f"grpc, or use http/protobuf ({exc})") from exc
        return GrpcExporter(endpoint=endpoint) if endpoint else GrpcExporter()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # noqa: PLC0415 - the protocol's own
        OTLPSpanExporter as HttpExporter)

    if endpoint:  # a base URL, as OTEL_EXPORTER_OTLP_ENDPOINT: the traces path is appended
        base = endpoint.rstrip("/")
        return HttpExporter(endpoint=base if base.endswith("/v1/traces") else f"{base}/v1/traces")
    return HttpExporter()


def _target(exporter: SpanExporter, endpoint: str | None) -> str:
    return getattr(exporter, "_endpoint", None) or endpoint or "the OTLP default endpoint"


class _Watched(SpanExporter):
    """The OTLP exporter, watched: the first failing export is one warning, with the endpoint and the first line
    the exporter logged as the reason; the exporter's own lines during an export are held back (it logs three
    warnings and an error per batch while a collector is down); the first export that succeeds again is one
    line, with how many spans were dropped meanwhile. Exports run one at a time (the processor's lock)."""

    def __init__(self, exporter: SpanExporter, target: str):
        self.exporter, self.target = exporter, target
        self.failing = False
        self.dropped = 0  # spans lost since the exports began failing: failed batches and a full queue's drops
        self._failed_exports = 0
        self._exporting: int | None = None  # the thread inside export(): what its exporter logs is ours to tell
        self._reason: str | None = None
        self._lock = threading.Lock()
        # every exporter module's logger (filters are per logger, not inherited; the names differ by version and
        # protocol): all are loaded by now, the exporter being built
        for name, logger in list(logging.Logger.manager.loggerDict.items()):
            if name.startswith("opentelemetry.exporter") and isinstance(logger, logging.Logger):
                logger.addFilter(self._hold)

    def export(self, spans) -> SpanExportResult:
        self._reason, self._exporting = None, threading.get_ident()
        try:
            result = self.exporter.export(spans)
        finally:
            self._exporting = None
        if result is SpanExportResult.SUCCESS:
            if self.failing:
                with self._lock:
                    dropped, self.dropped, self.failing = self.dropped, 0, False
                log.info("tracing: exporting spans to %s works again; %d spans dropped while it failed (%d failed "
                         "exports)", self.target, dropped, self._failed_exports)
                self._failed_exports = 0
            return result
        self.drop(len(spans))
        self._failed_exports += 1
        if not self.failing:
            self.failing = True
            log.warning("tracing: exporting spans to %s fails, spans are being dropped (said once, until it "
                        "recovers): %s", self.target, self._reason or "the exporter gave no reason")
        return result

    def drop(self, count: int) -> None:
        with self._lock:
            self.dropped += count

    def shutdown(self) -> None:
        self.exporter.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.exporter.force_flush(timeout_millis)

    def _hold(self, record: logging.LogRecord) -> bool:
        """A filter on the exporter's loggers: a line logged by the exporting thread during an export is held
        back, the first kept as the reason; other lines pass."""
        if threading.get_ident() != self._exporting:
            return True
        if self._reason is None:  # a transient error's own line ends "retrying in 1.04s": its error alone
            transient = str(record.msg).startswith("Transient error") and record.args
            self._reason = str(record.args[0]) if transient else record.getMessage()
        return False


class _QueueFull(logging.Filter):
    """The SDK warns once per dropped span when its queue is full (a collector that is down or slow). While the
    exports fail, the drops are counted into the line that says the collector is back; else one such line a
    minute goes through, with how many were dropped since the last."""

    def __init__(self, watched: _Watched | None):
        super().__init__()
        self._watched = watched
        self._last = float("-inf")
        self._dropped = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith("Queue full"):
            return True
        if self._watched is not None and self._watched.failing:
            self._watched.drop(1)
            return False
        self._dropped += 1
        now = time.monotonic()
        if now - self._last < DROP_LOG_EVERY:
            return False
        record.msg = (f"tracing: the span queue is full (the collector is down or slow): {self._dropped} spans "
                      "dropped since the last warning")
        record.args = ()
        self._last, self._dropped = now, 0
        return True
