"""The synchronous routes: /v1/embeddings (OpenAI), /pooling (vLLM), /v1/models, /health, /metrics."""

from __future__ import annotations

import time

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from common.capabilities import ModelCapabilities
from common.errors import EmbedfleetError, NoWorkerError, ValidationError
from producer.gateway.core import encoding
from producer.gateway.core.auth import admit, require_key
from producer.gateway.core.errors import error_body, status_of
from producer.gateway.core.schemas import EmbedBody, PoolingBody
from producer.gateway.core.service import Gateway, gateway

public = APIRouter()
protected = APIRouter(dependencies=[Depends(require_key)])


@protected.post("/v1/embeddings", dependencies=[Depends(admit)])
async def create_embeddings(body: EmbedBody, gw: Gateway = Depends(gateway)) -> Response:
    body.dense_only("/v1/embeddings")
    result = await gw.run(body)
    return encoding.embeddings_response(result, body.encoding_format, body.explicit_layout)


@protected.post("/pooling", dependencies=[Depends(admit)])
async def create_pooling(body: PoolingBody, gw: Gateway = Depends(gateway)) -> Response:
    if body.task == "plugin":  # vLLM's IO-processor plugins: none can be installed here
        raise ValidationError("No IOProcessor plugin installed. Please refer to the documentation and install a "
                              "plugin. This gateway serves no plugins: send `task` embed, token_embed, classify "
                              "or token_classify, as the model allows", param="task")
    if body.task is None:
        try:
            body = body.model_copy(update={"task": default_task(await gw.capabilities(body.model))})
        except NoWorkerError:  # no live worker to say what the model does: submit decides (bulk work waits)
            pass
    if (body.outputs is not None or body.task == "sparse_embed") and body.encoding_format in ("bytes", "bytes_only"):
        raise ValidationError("`encoding_format` bytes frames one array per input; sparse and multi-output answers "
                              "are JSON: send float or base64", param="encoding_format")
    result = await gw.run(body)
    return encoding.pooling_response(result, body.encoding_format)


def default_task(caps: ModelCapabilities) -> str:
    """vLLM's /pooling task when none is sent: `embed` for an embedding model, per-token class scores
    (`token_classify`) for a cross-encoder or classifier."""
    return next((task for task in ("embed", "token_classify", "token_embed") if task in caps.tasks), "embed")


@protected.get("/v1/models")
async def list_models(gw: Gateway = Depends(gateway)) -> dict:
    served = await gw.producer.models()
    now = int(time.time())
    return {"object": "list", "data": [
        {"id": name, "object": "model", "created": now, "owned_by": "embedfleet",
         "live_workers": await gw.producer.live_workers(name), "capabilities": caps.model_dump(mode="json"),
         "workers": await gw.producer.workers(name)}
        for name, caps in sorted(served.items())]}


@public.get("/health")
async def health(gw: Gateway = Depends(gateway)) -> JSONResponse:
    """200 when Redis answers and at least one worker is alive; 503 (with the reason) otherwise."""
    workers: dict[str, int] = {}
    try:
        workers = {name: await gw.producer.live_workers(name) for name in await gw.producer.models()}
        if not any(workers.values()):
            raise NoWorkerError("no worker is alive: start one with `embedfleet worker`")
    except EmbedfleetError as err:
        gw.metrics.error(err.code)
        redis_ok = err.code != "redis_unavailable"
        body = {"status": "unavailable", "redis": "ok" if redis_ok else "unreachable",
                "models": workers if redis_ok else {}, **error_body(err)}
        return JSONResponse(body, status_code=status_of(err.code),
                            headers={"Retry-After": str(gw.settings.retry_after)})
    return JSONResponse({"status": "ok", "redis": "ok", "models": workers})


def cache_counts(workers: list[dict]) -> tuple[int, int]:
    """(hits, misses) of the vector cache over these workers' adverts (a worker without a cache adds 0)."""
    return (sum(w.get("cache_hits", 0) for w in workers), sum(w.get("cache_misses", 0) for w in workers))


@protected.get("/metrics")
async def metrics(gw: Gateway = Depends(gateway)) -> Response:
    """Prometheus text; the per-model gauges are read from Redis now, at scrape time, for every model ever
    advertised (one scaled to zero still shows its queues: what an autoscaler starts it on)."""
    try:
        await gw.producer.models()
        models = sorted(gw.producer.known_models())
        levels = {name: await gw.producer.level_stats(name) for name in models}
        depths = {name: sum(level.depth for level in stats) for name, stats in levels.items()}
        workers = {name: await gw.producer.live_workers(name) for name in models}
        gw.metrics.set_fleet(depths, workers)
        gw.metrics.set_levels([level for stats in levels.values() for level in stats])
        gw.metrics.set_cache({name: cache_counts(await gw.producer.workers(name)) for name in models})
    except EmbedfleetError as err:  # Redis down: still expose the gateway's own counters
        gw.metrics.error(err.code)
        gw.metrics.set_fleet({}, {})
        gw.metrics.set_levels([])
        gw.metrics.set_cache({})
    return Response(gw.metrics.render(), media_type=CONTENT_TYPE_LATEST)
