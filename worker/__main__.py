"""`embedfleet worker`: load one model and serve its queue until stopped."""

from __future__ import annotations

# First, before anything is imported by name: the working directory leaves sys.path (-P would do it only on
# Python 3.11+, and only where our own CLI starts the worker, not for `python -m embedfleet.worker` run by hand).
import embedfleet.worker.safepath  # noqa: F401

import functools
import logging
import os
import socket
import sys
import time

import redis

from embedfleet.common import console, tracing
from embedfleet.common.errors import StartupError
from embedfleet.common.ports import looks_like_path
from embedfleet.common.processes import exit_now
from embedfleet.common.redisclient import check_access, connect, redact
from embedfleet.worker.engine import cpus, heap
from embedfleet.worker.serving.config import BUNDLED_MODEL_NAME, WorkerSettings, bundled_model_path


def main(argv: list[str] | None = None) -> int:
    return console.run(serve, sys.argv[1:] if argv is None else argv)


def serve(argv: list[str]) -> int:
    settings = WorkerSettings.from_args(argv, "embedfleet worker", __doc__)
    partitions = len(settings.shards.partitions(_served_name(settings)))  # >1: each engine reaches its own
    # Before torch loads: libgomp reads OMP_WAIT_POLICY once, at `import torch` (--gpus children inherit it). The
    # engines of a partitioned model's partitions share the CPUs (each gets its part; docs/performance.md).
    threads = cpus.plan(settings.threads, os.environ, engines=partitions if settings.partition else 1)
    heap.keep_freed_memory(os.environ)  # a round's large arrays reuse the heap (worker/engine/heap.py)
    connection = None if partitions > 1 else connect(settings.redis_url)
    if partitions > 1 and settings.partition is None:  # the supervisor of the engines, before it starts them
        _check_partitions(settings.shards.partitions(_served_name(settings)))
    if connection is not None:
        # A Redis that is down, a wrong password, a missing ACL permission or a certificate that does not
        # verify fails now, in one line, not after the model has loaded.
        check_access(connection, settings.redis_url)
    if connection is not None and settings.cache and not settings.shards.shards and \
            not (settings.model or "").startswith("null:"):
        from embedfleet.worker.serving.cache import cache_store, check_placement  # noqa: PLC0415

        check_placement(connection, cache_store(settings.cache_url))  # a refusal comes now, not after the model loads
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("rq.worker").addFilter(_maintenance_at_debug)
    if not settings.log_rounds:
        logging.getLogger("embedfleet.worker.rounds").setLevel(logging.WARNING)
    from embedfleet.worker.serving import gpus  # noqa: PLC0415 - the per-GPU supervisor loads no model itself

    ids = gpus.visible_gpus(settings.gpus, dict(os.environ)) if settings.gpus else [None]
    cores = cpus.decide(None, cpus.affinity(), cpus.cgroup_quota()).count  # the CPUs it may use, quota included
    replicas = settings.replicas or gpus.default_replicas(_gpu_count(settings, ids), cores)
    partitions = 1 if settings.partition else partitions
    if settings.gpus or replicas > 1 or partitions > 1:  # a child per GPU, replica and partition of the model
        return gpus.run(ids, argv, settings.name, dict(os.environ), settings.metrics_port, replicas,
                        settings.max_restarts, partitions)
    from embedfleet.worker.engine.engine import Engine  # noqa: PLC0415 - the model side loads after the flags (no torch)
    from embedfleet.worker.engine.models.nullmodel import NullModel, is_null  # noqa: PLC0415 - the null model needs no transformers
    from embedfleet.worker.engine.probe import Budget, device_floor, device_limits, probe_budget  # noqa: PLC0415
    from embedfleet.worker.engine.shaper import Shape, Shaper  # noqa: PLC0415
    from embedfleet.worker.serving.builder import build_worker, served_as  # noqa: PLC0415

    # Empty values (docker compose passes unset variables as "") count as unset.
    path, name = settings.model, settings.served_model_name or None
    if is_null(path):
        model = NullModel(path, name, settings.max_inputs)
        budget = Budget(settings.max_batch_tokens or 1 << 20, settings.max_batch_size or 4096, "null model")
    else:
        if not path:
            path, name = bundled_model_path(), name or BUNDLED_MODEL_NAME
        model = _load(path, name, settings, threads)
        floor = device_floor(model, device_limits(model))  # the probe may raise the shape above it, not under
        budget = probe_budget(model, seconds=settings.probe_seconds, max_tokens=settings.max_batch_tokens,
                              max_rows=settings.max_batch_size, floor=floor)
    device, dtype, engine_label = served_as(model)
    url = _queue_url(settings, model.caps.name)  # a model mapped to a shard of its own is served there
    if connection is None or url != settings.redis_url:
        connection = _reach(url, settings.partition)
    shaper = None
    if not is_null(path) and settings.learn_shape:  # flags pin what they name; the rest is learned while serving
        most_tokens, most_rows = device_limits(model)
        shaper = Shaper(Shape(budget.max_batch_tokens, budget.max_batch_size),
                        min_tokens=floor[0], min_rows=floor[1],
                        max_tokens=max(most_tokens, budget.max_batch_tokens),
                        max_rows=max(most_rows, budget.max_batch_size),
                        pin_tokens=settings.max_batch_tokens is not None, pin_rows=settings.max_batch_size is not None,
                        source=budget.source)
    engine = Engine(model, max_batch_tokens=budget.max_batch_tokens, max_batch_size=budget.max_batch_size,
                    shaper=shaper)
    info = {"device": device, "dtype": dtype, "engine": engine_label, "fidelity": round(model.fidelity, 6),
            "forward": getattr(model, "forward_layout", "padded"), "replica": settings.replica or "1/1",
            "max_batch_tokens": budget.max_batch_tokens,
            "max_batch_size": budget.max_batch_size, "budget_source": budget.source, "max_jobs": settings.max_jobs,
            "host": socket.gethostname(), "pid": os.getpid(),  # `embedfleet health --worker` looks for its host
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"), **threads.facts()}
    traced = tracing.start("embedfleet-worker", settings.otlp_endpoint)
    try:
        worker = build_worker(settings, engine, connection, path=path, budget=budget, info=info,
                              traces=_traces(traced, settings))
        _announce(worker, settings, model, path, threads, budget, info, url)
        worker.work(burst=settings.burst)
    finally:
        if traced is not None:
            traced.shutdown()  # the last spans, for at most 2 s (a dead collector does not hold the exit)
    return worker.lifecycle.exit_code  # 130 after Ctrl-C, as a supervisor of several engines exits


def _announce(worker, settings: WorkerSettings, model, path: str, threads: cpus.Threads, budget, info: dict,
              url: str) -> None:
    """The log line that says what is served, where and how."""
    cache = worker.steps.cache
    logging.getLogger("embedfleet.worker").info(
        "serving model %s (%s, dim %d, max length %d, %s on %s, engine %s, %s, probe cosine vs float32 %.6f, "
        "batches of %s) "
        "from queue %s on %s as %s; %s", model.caps.name, path, model.caps.embedding_size, model.caps.max_model_len,
        info["dtype"], info["device"], info["engine"], threads.describe(), model.fidelity,
        budget.describe(info["forward"] == "packed"),
        worker.queue.name,
        redact(url), worker.name,
        "cache off" if cache is None else f"cache on {redact(settings.cache_url or url)}, model identity "
                                          f"{cache.identity}, entries live {settings.cache_ttl} s")


def _served_name(settings: WorkerSettings) -> str:
    """The name the model will be served as, before it loads (what the shard map is looked up by)."""
    return settings.served_model_name or settings.model or BUNDLED_MODEL_NAME


def _queue_url(settings: WorkerSettings, name: str) -> str:
    """The Redis this engine takes from: its model's shard, or the partition its supervisor gave it."""
    urls = settings.shards.partitions(name)
    if len(urls) == 1:
        return urls[0]
    if settings.partition is None or settings.partition > len(urls):
        raise StartupError(f"model '{name}' is partitioned over {len(urls)} Redis in the shard map, but this "
                           "worker was started as another name: pass --served-model-name " + name)
    return urls[settings.partition - 1]


def _reach(url: str, partition: int | None) -> redis.Redis:
    """A client of `url`, its access checked. The engine of one partition waits for a Redis that is down (the
    other partitions' engines serve meanwhile; a death would count against the supervisor's restarts)."""
    connection, pause = connect(url), 0.5
    while True:
        try:
            check_access(connection, url)
            return connection
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            if partition is None:
                raise
            logging.getLogger("embedfleet.worker").warning(
                "partition %d's Redis %s is unreachable (%s); retrying in %g s", partition, redact(url), exc, pause)
            time.sleep(pause)
            pause = min(pause * 2, 5.0)


def _check_partitions(urls: list[str]) -> None:
    """Fail now, before any engine starts, on a partition whose Redis refuses us (a wrong password, ACL or
    certificate, a DB it lacks, a redis+cluster:// URL at a plain Redis or redis:// at a Cluster node: AccessError),
    rather than crash-loop its engine and then stop the others; one whose Redis is down is left to its engine,
    which waits for it (_reach)."""
    unreachable = (redis.ConnectionError, redis.TimeoutError, redis.exceptions.RedisClusterException)
    for url in urls:
        try:
            connection = connect(url)
        except unreachable:  # a Cluster none of whose seeds answers (an AccessError is no RedisClusterException)
            continue
        try:
            check_access(connection, url)
        except unreachable:
            continue  # down now: its engine waits for it (_reach)
        finally:
            connection.close()


def _maintenance_at_debug(record: logging.LogRecord) -> bool:
    """rq logs its registry clean-up at INFO, a line per queue at each maintenance run (every minute here:
    MAINTENANCE_INTERVAL in worker/serving/pipeline.py): routine, so it is logged at DEBUG."""
    if record.levelno == logging.INFO and str(record.msg).startswith("Worker %s: cleaning"):
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)
    return True


def _gpu_count(settings: WorkerSettings, ids: list[str | None]) -> int:
    """GPUs the engines will share (for the default --replicas): --gpus', else the device's (0 on a CPU)."""
    if settings.gpus:
        return len(ids)
    if (settings.device or "cuda").startswith("cpu") or (settings.model or "").startswith("null:"):
        return 0
    import torch  # noqa: PLC0415 - only to learn whether `cuda` is there

    return 1 if torch.cuda.is_available() else 0


def _traces(traced, settings: WorkerSettings):
    """What makes the spans of each request (worker/serving/traces.py's RoundTraces, from a worker name and a
    model) when tracing is on (common.tracing.start), else None."""
    if traced is None:
        return None
    from embedfleet.worker.serving.traces import RoundTraces  # noqa: PLC0415 - OpenTelemetry loads only when tracing is on

    return functools.partial(RoundTraces, traced.tracer("worker"))


def _load(path: str, name: str | None, settings: WorkerSettings, threads: cpus.Threads):
    """The model, or one line that says why not."""
    import torch  # noqa: PLC0415 - torch loads after the flags and the wait policy
    from transformers.utils import logging as hf_logging  # noqa: PLC0415

    if threads.warning:  # once, by the process that runs the model (not by a --gpus/--replicas supervisor)
        logging.getLogger("embedfleet.worker").warning("%s", threads.warning)
    torch.set_num_threads(threads.count)  # worker/engine/cpus.py: the CPU this process has, not the host's

    from embedfleet.worker.engine.backends import EngineChoice  # noqa: PLC0415
    from embedfleet.worker.engine.models.loader import load_model  # noqa: PLC0415

    hf_logging.disable_progress_bar()  # a progress bar per start only clutters worker logs
    if looks_like_path(path) and not os.path.isdir(path):
        raise StartupError(f"no model folder at {path}; pass --model with a model folder or a hub id")
    try:
        return load_model(path, served_name=name, device=settings.device, dtype=settings.dtype,
                          matryoshka_dims=settings.matryoshka_dims, max_inputs=settings.max_inputs,
                          max_embed_len=settings.max_embed_len,
                          trust_request_chat_template=settings.trust_request_chat_template,
                          raw_text=settings.raw_text,
                          engine=EngineChoice(settings.engine, settings.quantize, settings.fidelity_gate,
                                              settings.engine_cache_dir, threads.count, threads.spinning),
                          packed=settings.packed)
    except (OSError, ValueError) as exc:  # transformers and the hub say "not found" with both
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise StartupError(f"cannot load model '{path}': {type(exc).__name__}: {first}; pass --model with a "
                           "model folder, or a hub id this machine can download") from exc


if __name__ == "__main__":
    # Served, drained, withdrawn and deregistered (or refused with its line): a normal exit would now unload torch
    # and transformers module by module, 3-8 s on a busy CPU, while a supervisor, `up` or `docker stop` waits.
    exit_now(main())
