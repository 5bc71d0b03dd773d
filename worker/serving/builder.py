"""build_worker: the one way a BatchWorker is built from WorkerSettings, by `embedfleet worker`
(worker/__main__.py) and by the tests' harness (tests/harness.py), so that what the settings say (the vector
cache, the watchdog, long requests spread over the fleet) is what every worker does unless a caller overrides it."""

from __future__ import annotations

import logging

from redis import Redis

from embedfleet.common.errors import StartupError
from embedfleet.worker.engine.identity import folder_digest, model_identity
from embedfleet.worker.serving.cache import VectorCache, cache_store, check_placement
from embedfleet.worker.serving.config import WorkerSettings
from embedfleet.worker.serving.pipeline import BatchWorker

log = logging.getLogger("embedfleet.worker")

PER_TOKEN = 0.01  # the watchdog's seconds per padded token without a probe (flags, the null model): generous on a CPU


def build_worker(settings: WorkerSettings, engine, connection: Redis, *, path: str = "", budget=None,
                 **overrides) -> BatchWorker:
    """The worker `settings` describe, serving `engine` on `connection`; built, not yet working.

    Args:
        settings: the worker's settings; every policy default lives there.
        engine: a worker.engine.engine.Engine or another ServingEngine; its `model` keys the vector cache.
        connection: the queue's Redis client.
        path: the folder or hub id the model was loaded from (digested for the cache where the model names no
            folder of its own; a null:DIM spec serves no cache).
        budget: the start-up probe's Budget (worker/engine/probe.py): the watchdog allows 10x its slowest measured
            seconds per padded token unless --watchdog-per-token says; None: PER_TOKEN.
        overrides: BatchWorker keyword arguments that replace what the settings make: production's `info` and
            `traces`; a test's own `cache`, `watchdog`, `metrics`, `heartbeat_interval`, `queue`, ...
    """
    made = {"max_jobs": settings.max_jobs, "result_ttl": settings.result_ttl, "poll_timeout": settings.poll_timeout,
            "lease": settings.lease_seconds, "max_deliveries": settings.max_deliveries,
            "drain_timeout": settings.drain_timeout, "name": settings.name, "bulk_share": settings.bulk_share,
            "chunks_per_job": settings.chunks_per_job, "rq_records": settings.rq_records}
    if "watchdog" not in overrides:
        made["watchdog"] = (settings.watchdog_seconds, per_token(settings.watchdog_per_token, budget))
    if "cache" not in overrides:
        made["cache"] = vector_cache(settings, connection, engine.model, path)
    if "metrics" not in overrides:
        made["metrics"] = serve_metrics(settings, engine.caps.name)
    return BatchWorker(engine, connection, **{**made, **overrides})


def served_as(model) -> tuple[str, str, str]:
    """(device, dtype, engine label) a model computes with: its advert, its log line and its cache identity;
    the null model's are "none"."""
    if _is_null(model):
        return "none", "none", "none"
    dtype = str(next(model.module.parameters()).dtype).removeprefix("torch.")
    return str(model.device), dtype, getattr(model, "engine", "torch")


def vector_cache(settings: WorkerSettings, queue: Redis, model, path: str = "") -> VectorCache | None:
    """The vector cache (worker/serving/cache.py), or None: off by flag, or the null model (it computes nothing).
    A cache on the queue's Redis is refused when that Redis may evict queue or result keys."""
    if not settings.cache or _is_null(model):
        return None
    store = cache_store(settings.cache_url)
    warning = check_placement(queue, store)
    if warning:
        log.warning("%s", warning)
    device, dtype, engine = served_as(model)
    files = folder_digest(getattr(model, "folder", "") or path)
    # --raw-text tokenises plain strings otherwise on a chat-template folder: other vectors, another identity
    identity = model_identity(model.caps.name, files, dtype, device,
                              engine + ("+raw-text" if settings.raw_text else ""))
    return VectorCache(store or queue, identity, model.caps.embedding_size, ttl=settings.cache_ttl,
                       max_memory=settings.cache_max_memory)


def per_token(flag: float | None, budget) -> float:
    """The watchdog's seconds per padded token: the flag, else 10x the probe's slowest measured rate, else
    (no probe: flags or the null model) PER_TOKEN."""
    if flag is not None:
        return flag
    rates = [length * texts for length, texts in budget.texts_per_s.items() if texts > 0] if budget else []
    return 10.0 / min(rates) if rates else PER_TOKEN


def serve_metrics(settings: WorkerSettings, model: str):
    """The worker's Prometheus metrics, served on --metrics-port, or None."""
    if settings.metrics_port is None:
        return None
    from embedfleet.worker.serving.metrics import WorkerMetrics  # noqa: PLC0415 - only with a metrics port

    port = settings.metrics_port
    metrics = WorkerMetrics(model)
    try:
        metrics.serve(port, settings.metrics_host)
    except OSError as exc:
        raise StartupError(f"cannot serve metrics on {settings.metrics_host}:{port}: {exc}; pick a free "
                           "--metrics-port") from exc
    log.info("metrics on http://%s:%d/metrics", settings.metrics_host, port)
    return metrics


def _is_null(model) -> bool:
    from embedfleet.worker.engine.models.nullmodel import NullModel  # noqa: PLC0415 - its module loads the tokenizer side

    return isinstance(model, NullModel)
