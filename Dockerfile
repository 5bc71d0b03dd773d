# syntax=docker/dockerfile:1
# One Dockerfile, two targets (docker-compose.yml builds both):
#   gateway  the HTTP gateway and the client CLI: no torch (a few hundred MB)
#   worker   the model side: torch from TORCH_INDEX, transformers, the bundled all-MiniLM-L6-v2
# The torch build is chosen by a build arg (a pip --index-url):
#   CUDA (default): --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu128
#   CPU only:       --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cpu   (~10x smaller image)
# e.g. docker build --target worker --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cpu -t embedfleet-worker:cpu .
# The worker's extras are a build arg too: the compose `cpu` profile adds [onnx] (ONNX Runtime, for
# `embedfleet worker --engine onnx`); exports are cached under XDG_CACHE_HOME=/cache, the volume below.
# Both run as the unprivileged user `embedfleet` (uid 10001). Other models than the bundled one are downloaded
# into HF_HOME=/cache/huggingface: mount a volume there (compose: model-cache) so each is fetched once.
# Healthchecks, per role (compose sets them): `embedfleet health --worker`, `embedfleet health --gateway`.
# Both images have the [tracing] extra (OpenTelemetry, a few MB): traces are on once EMBEDFLEET_OTLP_ENDPOINT or
# OTEL_EXPORTER_OTLP_ENDPOINT is set (docs/tracing.md).

FROM python:3.11-slim AS base
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HF_HOME=/cache/huggingface XDG_CACHE_HOME=/cache
RUN useradd --create-home --uid 10001 --user-group embedfleet \
    && mkdir -p /cache/huggingface && chown -R embedfleet:embedfleet /cache
WORKDIR /app

FROM base AS gateway
COPY pyproject.toml README.md ./
COPY common ./common
COPY producer ./producer
COPY worker ./worker
RUN pip install ".[gateway,cli,tracing]"
USER embedfleet
EXPOSE 8000
CMD ["embedfleet", "gateway", "--host", "0.0.0.0", "--port", "8000"]

FROM base AS worker
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX=https://download.pytorch.org/whl/cu128
ARG WORKER_EXTRAS=worker,tracing
# torch first, from the chosen index, as a layer of its own; the project's own install then keeps it.
RUN pip install "torch==${TORCH_VERSION}" --index-url "${TORCH_INDEX}"
COPY pyproject.toml README.md ./
COPY common ./common
COPY producer ./producer
COPY worker ./worker
RUN pip install ".[${WORKER_EXTRAS}]"
USER embedfleet
VOLUME ["/cache"]
CMD ["embedfleet", "worker"]
