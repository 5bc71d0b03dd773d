"""Prometheus metrics, one CollectorRegistry per app (so that several apps in one process never clash)."""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("embedfleet_gateway_requests", "HTTP requests answered",
                                ["route", "method", "status"], registry=self.registry)
        self.errors = Counter("embedfleet_gateway_errors", "error answers by embedfleet error code",
                              ["code"], registry=self.registry)
        self.latency = Histogram("embedfleet_gateway_request_seconds", "time to answer, by route",
                                 ["route"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.queue_depth = Gauge("embedfleet_queue_depth", "requests waiting in a model's queues (all priority "
                                 "levels), at scrape",
                                 ["model"], registry=self.registry)
        self.live_workers = Gauge("embedfleet_live_workers", "workers serving a model, at scrape",
                                  ["model"], registry=self.registry)
        self.key_requests = Counter("embedfleet_gateway_key_requests", "submits per API key name (never the "
                                    "key): admitted, or refused over its rate or share", ["key", "outcome"],
                                    registry=self.registry)
        # per model and priority level (producer/client/fleet.py): what an autoscaler reads (deploy/autoscaling.md)
        levels = ["model", "priority"]
        self.level_depth = Gauge("embedfleet_level_queue_depth", "requests waiting at one priority level of a "
                                 "model, at scrape", levels, registry=self.registry)
        self.level_tokens = Gauge("embedfleet_level_queued_tokens", "estimated tokens waiting at one priority "
                                  "level of a model, at scrape", levels, registry=self.registry)
        self.level_age = Gauge("embedfleet_level_oldest_age_seconds", "age of the oldest request waiting at "
                               "one priority level of a model (0 when none), at scrape", levels,
                               registry=self.registry)
        # Sums over the live workers' own counters (since each started): gauges, as workers come and go.
        self.cache = Gauge("embedfleet_cache_inputs", "inputs the live workers of a model found in the vector "
                           "cache (hit) or computed (miss), at scrape", ["model", "outcome"], registry=self.registry)

    def error(self, code: str) -> None:
        self.errors.labels(code=code).inc()

    def set_fleet(self, depths: dict[str, int], workers: dict[str, int]) -> None:
        """Replace the per-model gauges, so that a model that went away stops being reported."""
        self.queue_depth.clear()
        self.live_workers.clear()
        for model, depth in depths.items():
            self.queue_depth.labels(model=model).set(depth)
        for model, count in workers.items():
            self.live_workers.labels(model=model).set(count)

    def keyed(self, name: str | None, outcome: str) -> None:
        self.key_requests.labels(key=name or "none", outcome=outcome).inc()

    def set_levels(self, levels) -> None:
        """Replace the per-level gauges with producer.client.fleet.LevelStats read at this scrape."""
        for gauge in (self.level_depth, self.level_tokens, self.level_age):
            gauge.clear()
        for level in levels:
            self.level_depth.labels(level.model, level.priority).set(level.depth)
            self.level_tokens.labels(level.model, level.priority).set(level.queued_tokens)
            self.level_age.labels(level.model, level.priority).set(level.oldest_age or 0.0)
    def set_cache(self, counts: dict[str, tuple[int, int]]) -> None:
        """Replace the cache gauges: model -> (hits, misses) summed over its live workers."""
        self.cache.clear()
        for model, (hits, misses) in counts.items():
            self.cache.labels(model=model, outcome="hit").set(hits)
            self.cache.labels(model=model, outcome="miss").set(misses)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class MetricsMiddleware:
    """Counts and times every HTTP answer, labelled by route template (never by raw path: ids would
    make the label set unbounded). Outermost, so that answers given by other middleware count too."""

    def __init__(self, app: ASGIApp, metrics: Metrics, routes) -> None:
        self.app = app
        self.metrics = metrics
        self.routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            route = self._route(scope)
            self.metrics.requests.labels(route=route, method=scope["method"], status=str(status)).inc()
            self.metrics.latency.labels(route=route).observe(time.perf_counter() - start)

    def _route(self, scope: Scope) -> str:
        route = scope.get("route")
        if route is None:  # answered before routing (413 from the body limit, 405): match it ourselves
            matches = [(r.matches(scope)[0], r) for r in self.routes]
            route = next((r for m, r in matches if m == Match.FULL), None) or \
                next((r for m, r in matches if m == Match.PARTIAL), None)
        return getattr(route, "path", None) or "unmatched"
