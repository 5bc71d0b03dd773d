# One image for both roles: `embedfleet worker` (GPU when the host gives one) and `embedfleet gateway`.
FROM python:3.11-slim
WORKDIR /app
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
# torch before the project so its wheel (CUDA on Linux x86-64) is chosen explicitly and cached as a layer.
ARG TORCH_VERSION=2.13.0
RUN pip install "torch==${TORCH_VERSION}"
COPY pyproject.toml README.md ./
COPY common ./common
COPY producer ./producer
COPY worker ./worker
RUN pip install ".[worker,gateway]"
CMD ["embedfleet", "--help"]
