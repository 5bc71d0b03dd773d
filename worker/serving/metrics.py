"""The worker's Prometheus metrics (`--metrics-port`): what its device does (passes, rows, real vs padded
tokens, seconds) and what its requests met (time queued per priority level, errors by code).

One registry per worker, so that several workers in one process (tests) never clash. Every metric carries
the served model's name, so that a fleet's scrapes sum per model. The queue wait is measured from the
request's `created_at` (the producer's clock) to the take (this worker's clock), at each take: a request
that went back to its queue untouched (a drain, a bulk round yielding to interactive work, a retry) is
observed again when it is taken again.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, start_http_server
from prometheus_client.core import CounterMetricFamily

from embedfleet.common.names import PRIORITIES, untagged
from embedfleet.common.protocol.keys import queue_name

SECONDS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                   300.0, 1800.0)


class WorkerMetrics:
    def __init__(self, model: str) -> None:
        self.registry = CollectorRegistry()
        self.model = model
        self._levels = {queue_name(model, level): level for level in PRIORITIES}
        self._waits: dict = {}  # rq queue -> its labelled queue_wait histogram
        r, m = self.registry, ["model"]
        self.batches = Counter("embedfleet_worker_batches", "forward passes (batches cut by the token budget)",
                               m, registry=r).labels(model)
        self.rounds = Counter("embedfleet_worker_rounds", "rounds of requests taken together", m,
                              registry=r).labels(model)
        self.rows = Counter("embedfleet_worker_rows", "inputs (rows) through the forward passes", m,
                            registry=r).labels(model)
        tokens = Counter("embedfleet_worker_tokens", "tokens through the forward passes: real, and padded "
                         "(rows x longest row: what the device computed)", ["model", "kind"], registry=r)
        self.real_tokens, self.padded_tokens = tokens.labels(model, "real"), tokens.labels(model, "padded")
        self.forward_seconds = Histogram("embedfleet_worker_forward_seconds", "device time of one round's "
                                         "forward passes", m, buckets=SECONDS_BUCKETS, registry=r).labels(model)
        self.queue_wait = Histogram("embedfleet_worker_queue_wait_seconds", "seconds from a request's submit "
                                    "to its take, by priority level", ["model", "priority"],
                                    buckets=SECONDS_BUCKETS, registry=r)
        self.errors = Counter("embedfleet_worker_errors", "requests answered with an error, by code",
                              ["model", "code"], registry=r)
        shape = Gauge("embedfleet_worker_batch_shape", "the forward-pass shape in use (learned: "
                      "worker/engine/shaper.py): padded tokens and rows per pass", ["model", "dimension"], registry=r)
        self.shape_tokens, self.shape_rows = shape.labels(model, "tokens"), shape.labels(model, "rows")
        self.pass_rate = Gauge("embedfleet_worker_pass_tokens_per_second",
                               "the texts' own tokens (not the padding) per second of the shape in use (median "
                               "of its recent full passes)", m, registry=r).labels(model)

    def watch_stages(self, stages) -> None:
        """Export a worker.engine.stageclock.Stages: seconds per thread and stage, read at each scrape."""
        self.registry.register(_StageCollector(self.model, stages))

    def waited(self, queue: str, seconds: float) -> None:
        """A request taken from rq queue `queue` after `seconds` queued (called per request: the labelled
        histogram is looked up once per queue, not per request)."""
        child = self._waits.get(queue)
        if child is None:
            level = self._levels.get(untagged(queue), "other")  # (a Redis Cluster's queues carry a tag)
            child = self._waits[queue] = self.queue_wait.labels(self.model, level)
        child.observe(max(0.0, seconds))

    def shaped(self, tokens: int, rows: int, rate: float | None) -> None:
        """The shape the engine runs at now, and its measured rate when known."""
        self.shape_tokens.set(tokens)
        self.shape_rows.set(rows)
        if rate is not None:
            self.pass_rate.set(rate)

    def forwarded(self, work, seconds: float) -> None:
        """One round through the engine (a worker/engine/seam.py Work, after forward)."""
        self.rounds.inc()
        self.batches.inc(work.passes)
        self.rows.inc(work.texts)
        self.real_tokens.inc(work.tokens)
        self.padded_tokens.inc(work.padded_tokens)
        self.forward_seconds.observe(seconds)

    def answered(self, codes: list[str]) -> None:
        """The error codes of a round's answers ("" for a served request)."""
        for code in codes:
            if code:
                self.errors.labels(self.model, code).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def serve(self, port: int, host: str = "0.0.0.0") -> None:
        """Serve /metrics on `port` from a daemon thread (prometheus_client's own server)."""
        start_http_server(port, addr=host, registry=self.registry)


class _StageCollector:
    """`embedfleet_worker_stage_seconds_total{thread, stage}`: where each stage thread's time went (its stages,
    waits included, add up to its wall time); read from the clocks when scraped, nothing on the hot path."""

    def __init__(self, model: str, stages) -> None:
        self.model, self.stages = model, stages

    def collect(self):
        family = CounterMetricFamily("embedfleet_worker_stage_seconds", "seconds each stage thread spent per "
                                     "stage (take, decode, verify, tokenise, collate, h2d, forward, pooling, d2h, "
                                     "cast, publish, wait: ...)", labels=["model", "thread", "stage"])
        for thread, totals in self.stages.snapshot().items():
            for stage, seconds in totals.items():
                family.add_metric([self.model, thread, stage], seconds)
        yield family
