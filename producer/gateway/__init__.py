"""The HTTP gateway: OpenAI /v1/embeddings, vLLM /pooling and async jobs over the fleet (no model here)."""

from __future__ import annotations

import logging

from producer.gateway.app import create_app
from producer.gateway.settings import GatewaySettings

__all__ = ["GatewaySettings", "create_app", "main"]


def main(argv: list[str] | None = None) -> None:
    """`embedfleet gateway [--redis-url URL] [--host H] [--port P] [--api-key KEY] ...`: serve until stopped."""
    import uvicorn  # noqa: PLC0415 - only the entry point needs the server

    settings = GatewaySettings.from_args(argv, prog="embedfleet gateway",
                                         description="HTTP gateway of an embedfleet fleet")
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    uvicorn.run(create_app(settings), host=settings.host, port=settings.port, log_level=settings.log_level)
