"""The app factory: `create_app(settings)` wires the producer, routes, limits, auth, errors and metrics."""

from __future__ import annotations

import inspect
import logging
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

from embedfleet.common.errors import UnavailableError
from embedfleet.common.redisclient import connect_async, is_cluster, redact
from embedfleet import AsyncProducer
from embedfleet.producer.gateway.batches import routes as batches
from embedfleet.producer.gateway.batches.runner import Runner
from embedfleet.producer.gateway.batches.store import Store
from embedfleet.producer.gateway.cohere import routes as cohere
from embedfleet.producer.gateway.core import errors
from embedfleet.producer.gateway.core.limits import BodyLimitMiddleware
from embedfleet.producer.gateway.core.memory import ReleaseMemory
from embedfleet.producer.gateway.core.metrics import Metrics, MetricsMiddleware
from embedfleet.producer.gateway.core.service import Gateway
from embedfleet.producer.gateway.fleet import dashboard
from embedfleet.producer.gateway.fleet import routes as fleet
from embedfleet.producer.gateway.jobs import events
from embedfleet.producer.gateway.jobs import routes as jobs
from embedfleet.producer.gateway.jobs.webhooks import Deliveries
from embedfleet.producer.gateway.openai import routes as openai
from embedfleet.producer.gateway.sagemaker import routes as sagemaker
from embedfleet.producer.gateway.settings import GatewaySettings
from embedfleet.producer.gateway.tasks import routes as tasks
from embedfleet.producer.gateway.tei import routes as tei
from embedfleet.producer.gateway.tei.paths import TeiModelPaths
from embedfleet.producer.gateway.vllm import routes as vllm

log = logging.getLogger(__name__)


def create_app(settings: GatewaySettings, tracing=None) -> FastAPI:
    """One app per settings object; nothing here reads the environment (main() built `settings`). `tracing`:
    the process's common.tracing.sdk.Tracing (a span per request, docs/tracing.md), or None: no spans."""
    metrics = Metrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        # The producer is made here, inside the server's event loop, which its redis.asyncio pool binds to.
        producer = AsyncProducer(settings.redis_url, shards=settings.shards.shards,
                                 max_queue_depth=settings.max_queue_depth)
        gw = app.state.gateway = Gateway(settings, producer, metrics)
        gw.deliveries = webhook_deliveries(settings, producer, gw.job_options)
        try:
            await producer.models()
        except UnavailableError as err:  # serve anyway: Redis may come later; until then requests get 503
            log.warning("Redis at %s is unreachable (%s); answering 503 redis_unavailable until it is back",
                        redact(settings.redis_url), err.message)
        for deliveries in gw.deliveries.values():
            deliveries.start()
        # The Batch API's files and batches are on the default Redis (a Redis Cluster too: store.py); this
        # replica drives batches too.
        app.state.batch_store = Store(producer.connection_at(producer.redis_url),
                                      clustered=is_cluster(producer.redis_url))
        app.state.batch_runner = runner = Runner(gw, app.state.batch_store)
        runner.start()
        try:
            yield
        finally:
            await runner.close()
            for deliveries in gw.deliveries.values():
                await deliveries.close()
            await producer.close()

    # FastAPI's own /docs and /redoc load their scripts from a CDN (a blank page offline): ours serves
    # Swagger UI from the swagger-ui-bundle package. With API keys, /docs and /openapi.json (which a
    # browser cannot send a bearer key to) are switched off.
    app = FastAPI(title="embedfleet gateway", version="0.1.0", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None if settings.keys else "/openapi.json",
                  description="OpenAI /v1/embeddings, vLLM /pooling and async jobs on an embedfleet fleet",
                  **_no_native_spans())
    app.state.metrics = metrics  # the server's protocol counts the requests it refuses itself (server.py)
    if not settings.keys:
        _serve_docs(app)
    # events before jobs: jobs' /v1/jobs/{job_id} would match /v1/jobs/events.
    routers = [fleet.public, openai.router, vllm.router, fleet.protected, events.router, jobs.router, tasks.router,
               batches.router, tei.router, cohere.router, sagemaker.router, sagemaker.public]
    for router in routers:
        app.include_router(router)
    dashboard.install(app)
    errors.install(app, settings.retry_after, metrics.error)

    def reject(err, path):
        return errors.error_response(err, settings.retry_after, metrics.error, path)

    # Added innermost first: the body limit, the metrics around it, the error boundary around all.
    # an upload's multipart framing (boundaries, part headers) comes on top of the file's own limit
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes, reject=reject,
                       paths={batches.FILES_PATH: settings.max_file_bytes + 64 * 1024}, max_keys=settings.max_body_keys)
    routes = [route for router in [*routers, dashboard.public, dashboard.protected] for route in router.routes]
    app.add_middleware(MetricsMiddleware, metrics=metrics, routes=routes)
    if tracing is not None:  # around the metrics: its span times what they count
        from embedfleet.producer.gateway.core.tracing import TraceRequests  # noqa: PLC0415 - OpenTelemetry only when tracing

        app.add_middleware(TraceRequests, tracer=tracing.tracer("gateway"), routes=routes)
    app.add_middleware(errors.ErrorBoundary, retry_after=settings.retry_after, on_error=metrics.error)
    app.add_middleware(TeiModelPaths)  # /tei/<model>/<route> is routed as /<route> for <model>
    app.add_middleware(ReleaseMemory)  # outermost: a large request's memory is all freed when it trims the heap
    return app


def _no_native_spans() -> dict:
    """FastAPI 0.165+ makes its own server spans once a tracer provider is set (as tracing does): turned off,
    ours (producer/gateway/core/tracing.py) are the gateway's, with any FastAPI."""
    if "telemetry" in inspect.signature(FastAPI.__init__).parameters:
        return {"telemetry": {"tracing": False}}
    return {}


def webhook_deliveries(settings: GatewaySettings, producer: AsyncProducer, options_of) -> dict[str, Deliveries]:
    """This replica's webhook deliveries, one per Redis (shard): each has a connection of its own for the
    blocking read of the shared webhook stream, and shares the producer's command connections."""
    return {url: Deliveries(producer.connection_at(url), connect_async(url, max_connections=1), options_of,
                            secret=settings.webhook_secret, attempts=settings.webhook_attempts,
                            timeout=settings.webhook_timeout, sweep=settings.webhook_sweep_seconds,
                            policy=settings.webhook_policy, woken=not is_cluster(url))
            for url in producer.urls()}


def _serve_docs(app: FastAPI) -> None:
    """GET /docs: Swagger UI with its assets from the local swagger-ui-bundle package (no CDN)."""
    from swagger_ui_bundle import swagger_ui_path  # noqa: PLC0415 - the [gateway] extra ships it

    app.mount("/docs/assets", StaticFiles(directory=swagger_ui_path), name="docs-assets")

    @app.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        return get_swagger_ui_html(openapi_url="/openapi.json", title=f"{app.title} - Swagger UI",
                                   swagger_js_url="/docs/assets/swagger-ui-bundle.js",
                                   swagger_css_url="/docs/assets/swagger-ui.css",
                                   swagger_favicon_url="/docs/assets/favicon-32x32.png")
