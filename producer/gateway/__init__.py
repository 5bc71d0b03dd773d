"""The HTTP gateway: OpenAI /v1/embeddings, vLLM /pooling and async jobs over the fleet (no model here)."""

from __future__ import annotations

import logging
import sys

import redis

from embedfleet.common import console, tracing
from embedfleet.common.errors import StartupError
from embedfleet.common.ports import port_free
from embedfleet.common.redisclient import check_access, connect
from embedfleet.producer.gateway.app import create_app
from embedfleet.producer.gateway.settings import GatewaySettings

__all__ = ["GatewaySettings", "create_app", "main"]


def main(argv: list[str] | None = None) -> int:
    """`embedfleet gateway [--redis-url URL] [--host H] [--port P] [--api-key KEY] ...`: serve until stopped."""
    return console.run(serve, sys.argv[1:] if argv is None else argv)


def serve(argv: list[str]) -> int:
    import uvicorn  # noqa: PLC0415 - only the entry point needs the server

    from embedfleet.producer.gateway import server  # noqa: PLC0415 - nor uvicorn's protocol

    settings = GatewaySettings.from_args(argv, prog="embedfleet gateway",
                                         description="HTTP gateway of an embedfleet fleet")
    if not port_free(settings.host, settings.port):
        raise StartupError(f"port {settings.port} on {settings.host} is already in use; pass --port N "
                           "(or EMBEDFLEET_PORT)")
    for url in settings.shards.urls():
        connection = connect(url)
        try:  # a wrong password, ACL or certificate stops the start (AccessError); an outage does not:
            check_access(connection, url)  # until Redis is back, requests get 503 redis_unavailable
        except (redis.ConnectionError, redis.TimeoutError):
            pass
        finally:
            connection.close()
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    traced = tracing.start("embedfleet-gateway", settings.otlp_endpoint)
    app = create_app(settings, traced)
    try:
        uvicorn.run(app, **server.options(app, settings))
    finally:
        if traced is not None:
            traced.shutdown()
    return 0
