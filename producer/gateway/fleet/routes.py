"""The fleet's routes: /health, /v1/models (OpenAI's list, with each model's live workers and capabilities),
/metrics."""

from __future__ import annotations

import time

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from embedfleet.common.errors import EmbedfleetError, NoWorkerError
from embedfleet.producer.gateway.core.auth import require_key
from embedfleet.producer.gateway.core.errors import error_body, status_of
from embedfleet.producer.gateway.core.service import Gateway, gateway

public = APIRouter()
protected = APIRouter(dependencies=[Depends(require_key)])


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
