"""Traces of requests (OpenTelemetry, the `[tracing]` extra): the switch, and the W3C trace context a request
carries through Redis. Nothing here imports OpenTelemetry: it loads only where tracing is on.

    on        an entry point (gateway, worker) with --otlp-endpoint, or OTEL_EXPORTER_OTLP_ENDPOINT /
              OTEL_EXPORTER_OTLP_TRACES_ENDPOINT set, or OTEL_TRACES_EXPORTER=console (spans on stderr, no collector);
              OTEL_SDK_DISABLED=true or OTEL_TRACES_EXPORTER=none: off. `start` then sets up the SDK
              (common/tracing/sdk.py) and returns it, else None
    context   a request's `traceparent` / `tracestate` (common/request.py), W3C Trace Context level 1: the
              caller's span as the producer saw it, so the worker's spans are its children
    client    the producer clients (Python) trace where the application has OpenTelemetry set up: they use
              its tracer provider and its current span (common/tracing/spans.py, producer/client/traced.py)
"""

from __future__ import annotations

import logging
import os
import re
import sys
from collections.abc import Mapping

from embedfleet.common.errors import StartupError

# W3C Trace Context: version 00, lowercase hex; an all-zero trace id or span id is invalid.
_TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
# a tracestate list member: key=value (keys: lowercase, digits, _-*/ and one @ for a tenant; values: printable
# ASCII but ',' and '=', not ending in a space); at most 32 members, 512 characters in all
_TRACESTATE_MEMBER = re.compile(r"[a-z0-9][_0-9a-z\-*/]{0,240}(@[a-z][_0-9a-z\-*/]{0,13})?="
                                r"[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]")
MAX_TRACESTATE = 512
MAX_TRACESTATE_MEMBERS = 32
TRACEPARENT_FORMAT = "00-<32 lowercase hex: trace id, not all 0>-<16 lowercase hex: span id, not all 0>-<2 hex: flags>"
EXPORTERS = ("otlp", "console", "none")  # the values of OTEL_TRACES_EXPORTER served here, alone or in a comma list

log = logging.getLogger("embedfleet.tracing")

OTLP_ENDPOINT_HELP = ("send traces to this OTLP/HTTP collector, e.g. http://localhost:4318 (TEI's flag; also: "
                      "OTEL_EXPORTER_OTLP_ENDPOINT)")


def traceparent_problem(value: str) -> str | None:
    """What is wrong with a `traceparent` (W3C Trace Context, version 00), or None."""
    found = _TRACEPARENT.fullmatch(value)
    if found is None:
        return f"`traceparent` must be {TRACEPARENT_FORMAT} (W3C Trace Context), got {value[:80]!r}"
    if found[1] == "0" * 32 or found[2] == "0" * 16:
        return f"`traceparent` has an all-zero trace id or span id, which W3C Trace Context forbids: {value!r}"
    return None


def tracestate_problem(value: str) -> str | None:
    """What is wrong with a `tracestate` (W3C: key=value list members, comma-separated), or None."""
    if len(value) > MAX_TRACESTATE:
        return f"`tracestate` is {len(value)} characters; at most {MAX_TRACESTATE} are carried"
    members = [m.strip(" \t") for m in value.split(",")]
    members = [m for m in members if m]
    if len(members) > MAX_TRACESTATE_MEMBERS:
        return (f"`tracestate` has {len(members)} list members; W3C Trace Context allows at most "
                f"{MAX_TRACESTATE_MEMBERS}")
    bad = next((m for m in members if not _TRACESTATE_MEMBER.fullmatch(m)), None)
    if bad is not None:
        return f"`tracestate` member {bad[:80]!r} is not key=value as W3C Trace Context defines it"
    return None


def sampled(traceparent: str) -> bool:
    """Whether the caller recorded its span (the flags' sampled bit); the worker's sampler honours it."""
    return bool(int(traceparent[-2:], 16) & 1)


def exporters(endpoint: str | None, environ: Mapping[str, str]) -> tuple[str, ...]:
    """Where an entry point's spans go: "otlp" and/or "console" (stderr), none when tracing is off. As in
    OpenTelemetry's SDKs, OTEL_TRACES_EXPORTER (a comma list) names them, otlp when unset; OTLP needs an endpoint
    (--otlp-endpoint or OpenTelemetry's endpoint variables), the console none. OTEL_SDK_DISABLED=true, or none
    in the list, turns tracing off whatever else is set."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return ()
    listed = _listed(environ) or ["otlp"]
    if "none" in listed:
        return ()
    endpoint_given = bool(endpoint or environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
                          or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip())
    return tuple(name for name in ("otlp", "console") if name in listed and (name == "console" or endpoint_given))


def requested(endpoint: str | None, environ: Mapping[str, str]) -> bool:
    """Whether an entry point traces (`exporters` names somewhere for its spans)."""
    return bool(exporters(endpoint, environ))


def _listed(environ: Mapping[str, str]) -> list[str]:
    return [name.strip().lower() for name in environ.get("OTEL_TRACES_EXPORTER", "").split(",") if name.strip()]


def start(service: str, endpoint: str | None, environ: Mapping[str, str] | None = None):
    """The process's tracing (a common.tracing.sdk.Tracing: its tracer provider is made the global one), or None
    when tracing is off. Called once, by an entry point. `service`: the service name unless OTEL_SERVICE_NAME
    says another. Raises StartupError when tracing is asked for but cannot be set up (the extra is missing, an
    unknown OTEL_EXPORTER_OTLP_PROTOCOL)."""
    environ = os.environ if environ is None else environ
    unknown = [name for name in _listed(environ) if name not in EXPORTERS]
    if unknown:
        log.warning("tracing: OTEL_TRACES_EXPORTER names %s, which embedfleet does not export to (ignored); it "
                    "accepts %s, or a comma list of them", ", ".join(unknown), ", ".join(EXPORTERS))
    chosen = exporters(endpoint, environ)
    if not chosen:
        return None
    try:
        from embedfleet.common.tracing import sdk  # noqa: PLC0415 - OpenTelemetry is loaded only when tracing is on
    except ImportError as exc:
        raise StartupError(f"tracing is on (--otlp-endpoint, OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_TRACES_EXPORTER) "
                           f"but OpenTelemetry is not installed ({exc}): pip install 'embedfleet[tracing]', or unset "
                           "them") from exc
    return sdk.setup(service, endpoint, environ, chosen)


def client_on() -> bool:
    """Whether the producer clients trace here: the process has OpenTelemetry's API loaded (never imported for
    this) and a tracer provider set up (an application that traces, or a traced entry point), or a current
    span to carry. Elsewhere they make no span and import nothing (Redis's client may load the API itself)."""
    api = sys.modules.get("opentelemetry.trace")
    if api is None:
        return False
    if not isinstance(api.get_tracer_provider(), (api.ProxyTracerProvider, api.NoOpTracerProvider)):
        return True
    return api.get_current_span().get_span_context().is_valid
