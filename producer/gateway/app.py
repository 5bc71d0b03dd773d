"""The app factory: `create_app(settings)` wires the producer, routes, limits, auth, errors and metrics."""

from __future__ import annotations

from contextlib import asynccontextmanager

from fastapi import FastAPI

from producer import AsyncProducer
from producer.gateway import errors, jobs, routes
from producer.gateway.limits import BodyLimitMiddleware
from producer.gateway.metrics import Metrics, MetricsMiddleware
from producer.gateway.service import Gateway
from producer.gateway.settings import GatewaySettings


def create_app(settings: GatewaySettings) -> FastAPI:
    """One app per settings object; nothing here reads the environment (main() built `settings`)."""
    metrics = Metrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        # The producer is made here, inside the server's event loop, which its redis.asyncio pool binds to.
        producer = AsyncProducer(settings.redis_url, max_queue_depth=settings.max_queue_depth)
        app.state.gateway = Gateway(settings, producer, metrics)
        try:
            yield
        finally:
            await producer.close()

    # With an API key, FastAPI's own /docs and /openapi.json (which no key protects) are switched off.
    docs = {} if not settings.api_key else {"docs_url": None, "redoc_url": None, "openapi_url": None}
    app = FastAPI(title="embedfleet gateway", version="0.1.0", lifespan=lifespan, **docs,
                  description="OpenAI /v1/embeddings, vLLM /pooling and async jobs on an embedfleet fleet")
    app.include_router(routes.public)
    app.include_router(routes.protected)
    app.include_router(jobs.router)
    errors.install(app, settings.retry_after, metrics.error)

    def reject(err):
        return errors.error_response(err, settings.retry_after, metrics.error)

    # Added innermost first: the body limit, the metrics around it, the error boundary around all.
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes, reject=reject)
    app.add_middleware(MetricsMiddleware, metrics=metrics,
                       routes=[*routes.public.routes, *routes.protected.routes, *jobs.router.routes])
    app.add_middleware(errors.ErrorBoundary, retry_after=settings.retry_after, on_error=metrics.error)
    return app
