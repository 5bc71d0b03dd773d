"""The OpenTelemetry SDK as an entry point sets it up (common.tracing.start): a tracer provider with a batch
processor and the OTLP exporter, bounded so that a dead or slow collector costs a request nothing.

OpenTelemetry's own variables are honoured: OTEL_SERVICE_NAME (else `service`), OTEL_RESOURCE_ATTRIBUTES,
OTEL_TRACES_SAMPLER / _ARG (default: parentbased_always_on, so a caller's sampled flag decides),
OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL (http/protobuf, the default; grpc with the opentelemetry-exporter-otlp-
proto-grpc package), _ENDPOINT, _HEADERS, _TIMEOUT, _COMPRESSION, _CERTIFICATE, and OTEL_BSP_* for the batch
processor. --otlp-endpoint (TEI's flag) is a collector's base URL, as OTEL_EXPORTER_OTLP_ENDPOINT is.

Bounded: spans wait in the batch processor's queue (OTEL_BSP_MAX_QUEUE_SIZE, 2048) and a thread of its own
exports them; a full queue drops spans, never blocks. An export gives up after its timeout (10 s). At exit the
processor gets SHUTDOWN_SECONDS to send what it holds, then the process goes on without it.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter

from common.errors import StartupError

log = logging.getLogger("embedfleet.tracing")

SHUTDOWN_SECONDS = 2.0  # what the exit waits for the last spans to be sent (a dead collector: no longer)
DROP_LOG_EVERY = 60.0  # seconds between two warnings that the span queue is full (spans are being dropped)
PROTOCOLS = ("http/protobuf", "grpc")
TRACER_NAME = "embedfleet"


@dataclass
class Tracing:
    """A traced process: its provider (also the global one), and how it ends."""

    provider: TracerProvider
    processor: BatchSpanProcessor
    endpoint: str
    protocol: str
    _closing: threading.Thread | None = None

    def tracer(self, component: str) -> trace.Tracer:
        return self.provider.get_tracer(f"{TRACER_NAME}.{component}")

    def shutdown(self, timeout: float = SHUTDOWN_SECONDS) -> None:
        """Send what is queued, for at most `timeout` seconds: the SDK's own shutdown waits up to 30 s for a
        collector, so it runs on a daemon thread that the exit does not wait for past `timeout`."""
        if self._closing is None:
            self._closing = threading.Thread(target=self.processor.shutdown, name="tracing-shutdown", daemon=True)
            self._closing.start()
        self._closing.join(timeout)


def setup(service: str, endpoint: str | None, environ: Mapping[str, str]) -> Tracing:
    protocol = (environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
                or "http/protobuf").strip()
    if protocol not in PROTOCOLS:
        raise StartupError(f"OTEL_EXPORTER_OTLP_PROTOCOL {protocol!r} is not supported: use one of "
                           f"{list(PROTOCOLS)}")
    exporter = _exporter(protocol, endpoint)
    attributes = {} if environ.get("OTEL_SERVICE_NAME", "").strip() else {"service.name": service}
    # shutdown_on_exit=False: the SDK's own exit hook waits up to 30 s for a collector; ours, SHUTDOWN_SECONDS
    provider = TracerProvider(resource=Resource.create(attributes), shutdown_on_exit=False)
    processor = BatchSpanProcessor(exporter)
    provider.add_span_processor(processor)
    trace.set_tracer_provider(provider)
    logging.getLogger("opentelemetry.sdk._shared_internal").addFilter(_EveryMinute())
    tracing = Tracing(provider, processor, _target(exporter, endpoint), protocol)
    atexit.register(tracing.shutdown)
    log.info("tracing: spans of service %s go to %s (%s)", provider.resource.attributes.get("service.name"),
             tracing.endpoint, protocol)
    return tracing


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


class _EveryMinute(logging.Filter):
    """The SDK warns once per dropped span when its queue is full (a collector that is down or slow): let one
    such line through a minute, with how many were dropped since the last."""

    def __init__(self):
        super().__init__()
        self._last = float("-inf")
        self._dropped = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith("Queue full"):
            return True
        self._dropped += 1
        now = time.monotonic()
        if now - self._last < DROP_LOG_EVERY:
            return False
        record.msg = (f"tracing: the span queue is full (the collector is down or slow): {self._dropped} spans "
                      "dropped since the last warning")
        record.args = ()
        self._last, self._dropped = now, 0
        return True
