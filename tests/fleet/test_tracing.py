"""Traces (docs/tracing.md) against a real OTLP/HTTP receiver (tests/otlpreceiver.py), with real gateway and
worker processes on a real Redis: one request gives one trace, the worker's spans under the caller's; the
request carries its W3C context through Redis; a collector that never answers costs a request nothing; with
tracing off our code imports nothing of OpenTelemetry."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import secrets
import subprocess
import sys
import tempfile
import time

import httpx
import pytest
import yaml

from embedfleet.common import tracing
from embedfleet.common.errors import DecodeError, StartupError, ValidationError
from embedfleet.common.redisserver import free_port
from embedfleet.common.request import WIRE_VERSION, EmbedRequest
from embedfleet.common.codec import packb
from tests.commands import ROOT
from tests.otlpreceiver import Receiver, tree
from tests.systemtools import need

MODEL = "traced"
WORKER_SPANS = {f"process {MODEL}", "queue wait", "take", "prepare", "tokenise", "forward", "finish", "publish"}
FAST_EXPORT = {"OTEL_BSP_SCHEDULE_DELAY": "50"}  # ms: spans leave within a moment (the default is 5 s)


def _caller() -> tuple[str, str, str]:
    """A caller's span of its own: (trace id, span id, traceparent header)."""
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return trace_id, span_id, f"00-{trace_id}-{span_id}-01"


# -- the context a request carries -----------------------------------------------------------------------

def test_a_request_carries_its_callers_context_through_its_wire_bytes():
    _, _, traceparent = _caller()
    request = EmbedRequest(model="m", inputs=["a"], traceparent=traceparent, tracestate="vendor=opaque,t@sys=1")
    again = EmbedRequest.decode(request.encode())
    assert (again.traceparent, again.tracestate) == (traceparent, "vendor=opaque,t@sys=1")
    untraced = EmbedRequest(model="m", inputs=["a"]).encode()
    assert b"traceparent" not in untraced and b"tracestate" not in untraced  # older workers refuse new fields


@pytest.mark.parametrize("traceparent, words", [
    ("00-" + "0" * 32 + "-" + "b" * 16 + "-01", "all-zero"),
    ("00-" + "a" * 32 + "-" + "0" * 16 + "-01", "all-zero"),
    ("00-" + "A" * 32 + "-" + "b" * 16 + "-01", "lowercase hex"),
    ("01-" + "a" * 32 + "-" + "b" * 16 + "-01", "W3C Trace Context"),
    ("00-" + "a" * 32 + "-" + "b" * 16 + "-01-extra", "W3C Trace Context"),
    ("not a traceparent", "W3C Trace Context"),
])
def test_a_malformed_traceparent_is_refused_with_what_is_allowed(traceparent, words):
    with pytest.raises(ValueError, match=words):
        EmbedRequest(model="m", inputs=["a"], traceparent=traceparent)
    # from Redis, it is input like any field: the request fails alone, decoding says why
    raw = packb({"v": WIRE_VERSION, "id": "r1", "model": "m", "inputs": ["a"], "traceparent": traceparent})
    with pytest.raises(DecodeError, match="traceparent"):
        EmbedRequest.decode(raw)


@pytest.mark.parametrize("tracestate, words", [
    ("no-equals-sign", "key=value"), ("UPPER=1", "key=value"), ("k=" + "v" * 600, "512"),
    (",".join(f"k{i}=v" for i in range(33)), "32"), ("k=a=b", "key=value"), ("k=tab\there", "key=value"),
])
def test_a_malformed_tracestate_is_refused(tracestate, words):
    _, _, traceparent = _caller()
    with pytest.raises(ValueError, match=words):
        EmbedRequest(model="m", inputs=["a"], traceparent=traceparent, tracestate=tracestate)


def test_a_tracestate_travels_only_with_a_traceparent():
    with pytest.raises(ValueError, match="with a `traceparent` only"):
        EmbedRequest(model="m", inputs=["a"], tracestate="k=v")


def test_the_switch_is_the_flag_or_opentelemetrys_own_variables():
    assert not tracing.requested(None, {})
    assert tracing.requested("http://collector:4318", {})
    assert tracing.requested(None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"})
    assert tracing.requested(None, {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"})
    assert not tracing.requested("http://c:4318", {"OTEL_SDK_DISABLED": "true"})
    assert not tracing.requested(None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c", "OTEL_TRACES_EXPORTER": "none"})
    assert tracing.start("svc", None, {}) is None
    # OTEL_TRACES_EXPORTER names where spans go (a comma list): the console needs no collector, OTLP an endpoint
    assert tracing.exporters(None, {"OTEL_TRACES_EXPORTER": "console"}) == ("console",)
    assert tracing.exporters("http://c:4318", {"OTEL_TRACES_EXPORTER": " Console,otlp"}) == ("otlp", "console")
    assert tracing.exporters("http://c:4318", {"OTEL_TRACES_EXPORTER": "console"}) == ("console",)
    assert tracing.exporters(None, {"OTEL_TRACES_EXPORTER": "console,otlp"}) == ("console",)
    assert tracing.exporters("http://c:4318", {"OTEL_TRACES_EXPORTER": "none,console"}) == ()
    assert tracing.exporters(None, {"OTEL_TRACES_EXPORTER": "console", "OTEL_SDK_DISABLED": "true"}) == ()


def test_an_unknown_exporter_is_one_warning_naming_what_is_accepted(caplog):
    with caplog.at_level(logging.WARNING, logger="embedfleet.tracing"):
        assert tracing.start("svc", "http://c:4318", {"OTEL_TRACES_EXPORTER": "zipkin,jaeger"}) is None
    (said,) = [r.getMessage() for r in caplog.records]
    assert "zipkin, jaeger" in said and "otlp, console, none" in said, said


def test_a_protocol_that_cannot_be_served_stops_the_start_in_one_line():
    with pytest.raises(StartupError, match="http/json.*not supported"):
        tracing.start("svc", "http://c:4318", {"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"})
    with pytest.raises(StartupError, match="pip install opentelemetry-exporter-otlp-proto-grpc"):
        tracing.start("svc", "http://c:4317", {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc"})


def test_a_python_caller_with_a_bad_tracestate_still_submits():
    """What OpenTelemetry accepts but the wire refuses is left out, never a refused submit."""
    from embedfleet.producer.client.traced import _carriable

    _, _, traceparent = _caller()
    assert _carriable(traceparent, "Bad Member") == (traceparent, None)
    assert _carriable("junk", "k=v") == (None, None)
    with pytest.raises(ValidationError):  # the check it guards against
        from embedfleet.producer.client.core import build_request
        build_request(["a"], "m", None, {}, trace=(traceparent, "Bad Member"))


# -- processes --------------------------------------------------------------------------------------------

@contextlib.contextmanager
def fleet(redis_url: str, worker_env: dict, gateway_env: dict, gateway_flags: tuple = (),
          model: tuple = ("--model", "null:8")):
    """A worker process (`model`: the null model by default, served as MODEL) and a gateway process; yields the
    gateway's URL and both processes."""
    base = {**os.environ, "PYTHONPATH": str(ROOT)}
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_SDK_DISABLED",
                 "OTEL_TRACES_EXPORTER"):
        base.pop(name, None)
    logs = [tempfile.TemporaryFile(), tempfile.TemporaryFile()]  # files, not pipes: a full pipe would block them
    worker = subprocess.Popen([sys.executable, "-m", "embedfleet.worker", "--redis-url", redis_url, *model,
                               "--served-model-name", MODEL, "--poll-timeout", "1", "--no-log-rounds"],
                              env={**base, **worker_env}, stdout=subprocess.DEVNULL, stderr=logs[0])
    worker.log = logs[0]
    port = free_port()
    gateway = subprocess.Popen([sys.executable, "-m", "embedfleet.producer.gateway", "--redis-url", redis_url, "--port",
                                str(port), "--log-level", "warning", "--no-access-log", *gateway_flags],
                               env={**base, **gateway_env}, stdout=subprocess.DEVNULL, stderr=logs[1])
    gateway.log = logs[1]
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{url}/v1/models", timeout=5).json().get("data"):
                    break
            assert worker.poll() is None and gateway.poll() is None, \
                f"the worker or the gateway exited:\n{_tail(worker.log)}\n{_tail(gateway.log)}"
            assert time.monotonic() < deadline, "the fleet did not come up"
            time.sleep(0.2)
        yield url, worker, gateway
    finally:
        for process in (gateway, worker):
            if process.poll() is None:
                process.terminate()
        for process in (gateway, worker):
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(60)
            if process.poll() is None:
                process.kill()
                process.wait()
        for log in logs:
            log.close()


def _tail(log) -> str:
    log.seek(0)
    return log.read()[-3000:].decode(errors="replace")


def _stderr(process) -> str:
    """What a running process of `fleet` has logged so far (pread: the file's offset, which the process shares,
    stays where the process writes)."""
    fd = process.log.fileno()
    return os.pread(fd, os.fstat(fd).st_size, 0).decode(errors="replace")


def _until(done, what: str, process, timeout: float = 60.0):
    """`done()`'s value once it is true, polled; AssertionError with the process's log after `timeout` s."""
    deadline = time.monotonic() + timeout
    while not (found := done()):
        assert time.monotonic() < deadline, f"{what} did not come:\n{_stderr(process)[-3000:]}"
        time.sleep(0.1)
    return found


def _parent_chain(spans, span, root_id: str) -> list[str]:
    """The names from `span` up through its parents, ending at the caller's span id (AssertionError where the
    chain breaks: a parent that is not among the trace's spans and is not the caller's)."""
    by_id = {s.span_id: s for s in spans}
    chain = [span.name]
    while span.parent_id != root_id:
        assert span.parent_id in by_id, f"{chain} lost its parent ({span.parent_id!r}) on the way to the caller's " \
                                        f"span {root_id}:\n{tree(spans)}"
        span = by_id[span.parent_id]
        chain.append(span.name)
    return chain


def test_one_request_through_the_gateway_is_one_trace_with_the_workers_spans_under_the_callers(redis_url):
    """The caller sends a traceparent; the gateway's, producer's and worker's spans all land in the caller's
    trace, and every worker span's parent chain reaches the caller's span. The worker is switched on by
    OpenTelemetry's variable, the gateway by --otlp-endpoint."""
    receiver = Receiver()
    try:
        with fleet(redis_url, {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, **FAST_EXPORT}, FAST_EXPORT,
                   ("--otlp-endpoint", receiver.url)) as (url, _worker, _gateway):
            unsampled, _, not_recorded = _caller()  # first: a caller that did not sample its span
            answer = httpx.post(f"{url}/v1/embeddings", json={"model": MODEL, "input": ["not traced"]},
                                headers={"traceparent": not_recorded[:-2] + "00"}, timeout=60)
            assert answer.status_code == 200, answer.text
            answer = httpx.post(f"{url}/v1/embeddings", json={"model": MODEL, "input": ["malformed context"]},
                                headers={"traceparent": "00-not-a-trace-context-01"}, timeout=60)
            assert answer.status_code == 200, answer.text  # ignored, as W3C says: never a refused request
            trace_id, caller_span, traceparent = _caller()
            answer = httpx.post(f"{url}/v1/embeddings", json={"model": MODEL, "input": ["one", "two three"]},
                                headers={"traceparent": traceparent}, timeout=60)
            assert answer.status_code == 200, answer.text

            def complete(spans):  # the worker's spans of both traced requests, whichever trace each is in
                names = {s.name for s in spans if s.trace_id == trace_id}
                workers = [s.name for s in spans if s.service == "embedfleet-worker"]
                return all(workers.count(name) >= 2 for name in WORKER_SPANS) and \
                    {"POST /v1/embeddings", f"submit {MODEL}", "wait"} <= names

            received = receiver.wait_for(complete)
    finally:
        receiver.close()
    # the unsampled caller's spans would have left first (one queue, oldest first): none was recorded
    assert not [s for s in received if s.trace_id == unsampled], "a caller's sampled=0 was not honoured"
    # the malformed header's request: a trace of its own, the gateway's span its root
    (malformed,) = [s.trace_id for s in received if s.name == "POST /v1/embeddings" and s.trace_id != trace_id]
    assert [s.parent_id for s in received if s.name == "POST /v1/embeddings" and s.trace_id == malformed] == [""]
    lost = [s for s in received if s.service == "embedfleet-worker" and s.trace_id not in (trace_id, malformed)]
    assert not lost, f"worker spans outside their callers' traces:\n{tree(lost)}"
    assert sum(s.name == f"process {MODEL}" and s.trace_id == trace_id for s in received) == 1, tree(received)
    spans = [s for s in received if s.trace_id == trace_id]
    shown = tree(spans)
    services = {s.name: s.service for s in spans}
    assert services["POST /v1/embeddings"] == services[f"submit {MODEL}"] == "embedfleet-gateway", shown
    assert {services[name] for name in WORKER_SPANS} == {"embedfleet-worker"}, shown
    assert [s.kind for s in spans].count("server") == 1, shown  # ours only: FastAPI's own spans are off
    server = next(s for s in spans if s.name == "POST /v1/embeddings")
    assert server.parent_id == caller_span and server.kind == "server", shown
    assert server.attributes["http.response.status_code"] == 200
    submit = next(s for s in spans if s.name == f"submit {MODEL}")
    assert submit.kind == "producer" and submit.parent_id == server.span_id, shown
    for span in spans:
        if span.service == "embedfleet-worker":
            chain = _parent_chain(spans, span, caller_span)
            assert f"submit {MODEL}" in chain and "POST /v1/embeddings" in chain, (chain, shown)
    process = next(s for s in spans if s.name == f"process {MODEL}")
    assert process.kind == "consumer" and process.parent_id == submit.span_id, shown
    forward = next(s for s in spans if s.name == "forward")
    assert forward.attributes["embedfleet.request.inputs"] == 2 and forward.attributes["embedfleet.round.rows"] >= 2
    assert forward.attributes["embedfleet.request.tokens"] > 0 and forward.attributes["embedfleet.round.passes"] >= 1
    # each worker step lies within the process span, in pipeline order
    steps = [next(s for s in spans if s.name == name)
             for name in ("queue wait", "take", "prepare", "forward", "finish", "publish")]
    assert all(process.start_ns <= s.start_ns <= s.end_ns <= process.end_ns for s in steps), shown
    assert [s.start_ns for s in steps] == sorted(s.start_ns for s in steps), shown
    print(f"\nthe trace of one request:\n{shown}")


_PYTHON_CALLER = r"""
import json, sys
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from embedfleet import Producer

provider = TracerProvider(resource=Resource.create({"service.name": "app"}))
provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=sys.argv[2] + "/v1/traces")))
trace.set_tracer_provider(provider)
with trace.get_tracer("app").start_as_current_span("handle a page") as span:
    with Producer(sys.argv[1]) as producer:
        vectors = producer.embed(["a text"], sys.argv[3])
    context = span.get_span_context()
provider.shutdown()
print(json.dumps({"trace_id": format(context.trace_id, "032x"), "span_id": format(context.span_id, "016x"),
                  "rows": len(vectors)}))
"""


def test_a_python_callers_span_is_the_parent_of_its_producers_and_the_workers_spans(redis_url):
    """An application that traces (its own tracer provider) calls Producer.embed under a span of its own: the
    producer's submit and wait, and the worker's spans, are in its trace, under that span."""
    receiver = Receiver()
    try:
        with fleet(redis_url, {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, **FAST_EXPORT}, {}):
            done = subprocess.run([sys.executable, "-c", _PYTHON_CALLER, redis_url, receiver.url, MODEL],
                                  capture_output=True, text=True, timeout=120, cwd=ROOT,
                                  env={**os.environ, "PYTHONPATH": str(ROOT)})
            assert done.returncode == 0, done.stderr[-3000:]
            caller = json.loads(done.stdout.strip().splitlines()[-1])
            received = receiver.wait_for(lambda got: WORKER_SPANS <= {s.name for s in got})
    finally:
        receiver.close()
    lost = [s for s in received if s.trace_id != caller["trace_id"]]
    assert not lost, f"spans outside the caller's trace {caller['trace_id']}:\n{tree(lost)}"
    spans = received
    shown = tree(spans)
    names = {s.name: s for s in spans}
    assert names["handle a page"].service == "app" and names["handle a page"].span_id == caller["span_id"], shown
    assert names[f"submit {MODEL}"].parent_id == caller["span_id"] and names["wait"].parent_id == caller["span_id"]
    for span in spans:
        if span.service == "embedfleet-worker":
            assert f"submit {MODEL}" in _parent_chain(spans, span, caller["span_id"]), shown


_BLOCKING = 20  # requests sent while the collector hangs


def test_a_collector_that_never_answers_costs_a_request_nothing(redis_url):
    """The gateway and the worker export to a receiver that takes each export and never answers: requests
    still answer within a generous bound, the worker's heartbeat goes on (its advert's round count keeps up),
    and the worker still exits promptly on SIGTERM (its last spans get 2 s)."""
    receiver = Receiver(hang=True)
    try:
        variables = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, **FAST_EXPORT}
        with fleet(redis_url, variables, variables) as (url, worker, _gateway):
            receiver.wait_posts(1)  # the export thread is stuck on the collector from here on
            with httpx.Client(base_url=url, timeout=60) as client:
                for k in range(_BLOCKING):
                    began = time.monotonic()
                    _, _, traceparent = _caller()
                    answer = client.post("/v1/embeddings", json={"model": MODEL, "input": [f"text {k}"]},
                                         headers={"traceparent": traceparent})
                    assert answer.status_code == 200, answer.text
                    assert time.monotonic() - began < 10, f"request {k} waited on the collector"
            from embedfleet import Producer
            with Producer(redis_url) as producer:
                deadline = time.monotonic() + 30
                while (producer.workers(MODEL) or [{}])[0].get("rounds", 0) < _BLOCKING:
                    assert time.monotonic() < deadline, f"the heartbeat stopped: {producer.workers(MODEL)}"
                    time.sleep(0.2)
            worker.terminate()
            began = time.monotonic()
            worker.wait(60)
            assert time.monotonic() - began < 20 and worker.returncode == 0, _tail(worker.log)
    finally:
        receiver.close()


def _printed(process, trace_id: str) -> list[dict]:
    """The spans of trace `trace_id` that a process printed (OTEL_TRACES_EXPORTER=console: a JSON line each)."""
    spans = []
    for line in _stderr(process).splitlines():
        if line.startswith("{"):
            with contextlib.suppress(ValueError):  # the line being written now
                spans.append(json.loads(line))
    return [s for s in spans if s["context"]["trace_id"] == f"0x{trace_id}"]


def test_the_console_exporter_prints_the_spans_on_stderr_without_a_collector(redis_url):
    """OTEL_TRACES_EXPORTER=console and no endpoint: tracing is on, and the gateway and the worker print their
    spans of a request as JSON lines on stderr, in the caller's trace."""
    console = {"OTEL_TRACES_EXPORTER": "console", **FAST_EXPORT}
    with fleet(redis_url, console, console) as (url, worker, gateway):
        trace_id, caller_span, traceparent = _caller()
        answer = httpx.post(f"{url}/v1/embeddings", json={"model": MODEL, "input": ["one", "two"]},
                            headers={"traceparent": traceparent}, timeout=60)
        assert answer.status_code == 200, answer.text
        worker_spans = _until(lambda: (got := _printed(worker, trace_id)) and
                              WORKER_SPANS <= {s["name"] for s in got} and got, "the worker's spans", worker)
        gateway_spans = _until(lambda: (got := _printed(gateway, trace_id)) and
                               {"POST /v1/embeddings", f"submit {MODEL}", "wait"} <= {s["name"] for s in got} and got,
                               "the gateway's spans", gateway)
        assert "go to stderr (console)" in _stderr(worker)
    assert {s["resource"]["attributes"]["service.name"] for s in worker_spans} == {"embedfleet-worker"}
    server = next(s for s in gateway_spans if s["name"] == "POST /v1/embeddings")
    assert server["parent_id"] == f"0x{caller_span}" and server["kind"] == "SpanKind.SERVER", server
    submit = next(s for s in gateway_spans if s["name"] == f"submit {MODEL}")
    process = next(s for s in worker_spans if s["name"] == f"process {MODEL}")
    assert process["parent_id"] == submit["context"]["span_id"], (process, submit)


_BACK = re.compile(r"works again; (\d+) spans dropped while it failed \((\d+) failed exports\)")


def test_a_dead_collector_is_one_warning_and_one_line_when_it_is_back(redis_url):
    """An OTLP endpoint on a loopback port where nothing listens: the worker's exports fail one after another
    while requests go on, and its log says so once (the endpoint, spans dropped), not the exporter's three
    warnings and an error per batch; once a receiver listens on that port, one line says so and the spans arrive."""
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    # a 0.5 s export timeout leaves no time for a retry: a failed export ends at once, the next interval tries again
    variables = {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "0.5", **FAST_EXPORT}
    receiver = None
    try:
        with fleet(redis_url, variables, {}) as (url, worker, _gateway), \
                httpx.Client(base_url=url, timeout=60) as client:
            def embed(text: str) -> None:
                answer = client.post("/v1/embeddings", json={"model": MODEL, "input": [text]})
                assert answer.status_code == 200, answer.text

            embed("first")
            _until(lambda: "spans are being dropped" in _stderr(worker), "the dead collector's warning", worker)
            for k in range(8):  # spread over several export intervals (50 ms): the back line counts the failures
                embed(f"text {k}")
                time.sleep(0.15)
            receiver = Receiver(port=port)

            def back() -> bool:  # a request each time: its spans are an export that reaches the receiver
                embed("again")
                return "works again" in _stderr(worker)

            _until(back, "the line saying the collector is back", worker)
            receiver.wait_for(lambda spans: WORKER_SPANS <= {s.name for s in spans})
            lines = _stderr(worker).splitlines()
    finally:
        if receiver is not None:
            receiver.close()
    failures = [line for line in lines if "opentelemetry" in line or (endpoint in line and "fail" in line.lower()
                                                                        and "works again" not in line)]
    assert len(failures) == 1 and "spans are being dropped" in failures[0], "\n".join(failures)
    assert " WARNING " in failures[0] and endpoint in failures[0]
    back = [line for line in lines if "works again" in line]
    assert len(back) == 1 and " INFO " in back[0] and lines.index(back[0]) > lines.index(failures[0]), back
    dropped, failed_exports = map(int, _BACK.search(back[0]).groups())
    assert failed_exports >= 3 and dropped >= 8 * len(WORKER_SPANS), back[0]  # the first eight requests' at least
    print(f"\n{failures[0]}\n{back[0]}")


def test_spread_parts_are_under_their_request_and_batch_lines_link_to_their_batch(redis_url, tmp_path):
    """A long input spread over the fleet: each part's worker spans are children of its request's process
    span, in the caller's trace. A Batch API line: a trace of its own whose `batch line` span links to the span
    of the POST /v1/batches that created the batch, with the line's worker spans under it."""
    from tests.longinputs import MAX_LEN, words
    from tests.tinymodels import save_tiny_bert, wrap_sentence_transformers

    folder = wrap_sentence_transformers(save_tiny_bert(str(tmp_path / "bert")), "mean", normalize=True,
                                        max_seq_length=MAX_LEN)
    receiver = Receiver()
    variables = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, **FAST_EXPORT}
    try:
        with fleet(redis_url, variables, variables, model=("--model", folder, "--max-embed-len", str(8 * MAX_LEN),
                                                           "--chunks-per-job", "2", "--probe-seconds", "1")) \
                as (url, _worker, _gateway), httpx.Client(base_url=url, timeout=60) as client:
            trace_id, caller_span, traceparent = _caller()
            answer = client.post("/v1/embeddings", json={"model": MODEL, "input": words(7 * MAX_LEN, seed=3)},
                                 headers={"traceparent": traceparent})
            assert answer.status_code == 200, answer.text
            lines = "".join(json.dumps({"custom_id": f"line-{k}", "method": "POST", "url": "/v1/embeddings",
                                        "body": {"model": MODEL, "input": f"text {k}"}}) + "\n" for k in range(2))
            uploaded = client.post("/v1/files", data={"purpose": "batch"}, files={"file": ("in.jsonl", lines)})
            assert uploaded.status_code == 200, uploaded.text
            batch_trace, batch_caller, batch_parent = _caller()
            batch = client.post("/v1/batches", json={"input_file_id": uploaded.json()["id"], "endpoint":
                                                     "/v1/embeddings", "completion_window": "24h"},
                                headers={"traceparent": batch_parent})
            assert batch.status_code == 200, batch.text

            def complete(spans):
                line_traces = {s.trace_id for s in spans if s.name == "batch line"}
                return len(line_traces) == 2 and all(
                    sum(s.name == f"process {MODEL}" and s.trace_id == t for s in spans) == 1 for t in line_traces) \
                    and sum(s.name == f"process {MODEL}" and s.trace_id == trace_id for s in spans) >= 5

            received = receiver.wait_for(complete)
    finally:
        receiver.close()
    spans = [s for s in received if s.trace_id == trace_id]
    shown = tree(spans)
    processes = [s for s in spans if s.name == f"process {MODEL}"]
    request = next(s for s in processes if s.parent_id != "" and
                   next(p for p in spans if p.span_id == s.parent_id).name == f"submit {MODEL}")
    parts = [s for s in processes if s is not request]
    assert len(parts) == 4 and all(s.parent_id == request.span_id for s in parts), shown  # 8 chunks, 2 a part
    assert {s.attributes["messaging.message.id"] for s in parts} == {f"{request.attributes['messaging.message.id']}"
                                                                     f"-p{k}" for k in range(4)}, shown
    for part in parts:
        assert {s.name for s in spans if s.parent_id == part.span_id} >= {"queue wait", "forward", "publish"}, shown
        assert _parent_chain(spans, part, caller_span)[-1] == "POST /v1/embeddings"
    created = next(s for s in received if s.name == "POST /v1/batches")
    assert created.trace_id == batch_trace and created.parent_id == batch_caller
    for line in (s for s in received if s.name == "batch line"):
        assert line.parent_id == "" and line.links == [(batch_trace, created.span_id)], tree(received)
        assert line.attributes["embedfleet.batch.custom_id"] in ("line-0", "line-1")
        line_spans = [s for s in received if s.trace_id == line.trace_id]
        process = next(s for s in line_spans if s.name == f"process {MODEL}")
        assert _parent_chain(line_spans, process, line.span_id)[-1] == f"submit {MODEL}", tree(line_spans)


# -- tracing off ------------------------------------------------------------------------------------------

_NO_IMPORT = r"""
import importlib.abc, json, sys, threading
importers = {}
class Watch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] == "opentelemetry" and name not in importers:
            frame = sys._getframe(1)
            while frame is not None and frame.f_globals.get("__name__", "").startswith(("importlib", "_frozen")):
                frame = frame.f_back
            importers[name] = frame.f_globals.get("__name__") if frame is not None else None
        return None
sys.meta_path.insert(0, Watch())
from embedfleet import Producer
from tests.nullworker import NULL, null_worker
with null_worker(sys.argv[1]) as worker:
    worker.serve()
    with Producer(sys.argv[1]) as producer:
        vectors = producer.embed(["a text", "another"], NULL)
print(json.dumps({"rows": len(vectors), "importers": importers,
                  "ours": sorted(m for m in sys.modules if m.startswith(("embedfleet.common.tracing.",
                                                                         "embedfleet.producer.client.traced"))
                                 and m != "embedfleet.producer.client.traced")}))
"""


def test_with_tracing_off_our_code_imports_nothing_of_opentelemetry(redis_url):
    """A producer and a worker round, tracing off: no module of ours imports OpenTelemetry (Redis's client
    may: redis-py loads its metrics' SDK where installed) and none of our OpenTelemetry modules is loaded."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        env.pop(name, None)
    done = subprocess.run([sys.executable, "-c", _NO_IMPORT, redis_url], capture_output=True, text=True,
                          timeout=120, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["rows"] == 2
    ours = {module: by for module, by in found["importers"].items()
            if by is None or by.split(".")[0] in ("common", "producer", "worker")}
    assert not ours, f"imported by our code with tracing off: {ours}"
    assert found["ours"] == [], found["ours"]


# -- compose ----------------------------------------------------------------------------------------------

def test_compose_tracing_profile_runs_jaeger_and_points_the_fleet_at_it():
    need("docker-compose", untested="docker-compose.yml's tracing profile")
    done = subprocess.run(["docker-compose", "-f", str(ROOT / "docker-compose.yml"), "--profile", "cpu", "--profile",
                           "tracing", "config"], capture_output=True, text=True, timeout=60, cwd=ROOT,
                          env={**os.environ, "REDIS_PASSWORD": "0123abcd", "EMBEDFLEET_OTLP_ENDPOINT":
                               "http://jaeger:4318"})
    assert done.returncode == 0, done.stderr
    services = yaml.safe_load(done.stdout)["services"]
    assert services["jaeger"]["profiles"] == ["tracing"]
    assert {p["target"] for p in services["jaeger"]["ports"]} == {16686}
    for name in ("gateway", "worker"):
        assert services[name]["environment"]["EMBEDFLEET_OTLP_ENDPOINT"] == "http://jaeger:4318"
    assert "tracing" in services["worker"]["build"]["args"]["WORKER_EXTRAS"].split(",")
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert '".[gateway,cli,tracing]"' in dockerfile and "ARG WORKER_EXTRAS=worker,tracing" in dockerfile
