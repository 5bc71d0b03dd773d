"""A real uvicorn server for one gateway app, in a thread of the test process, on a free port."""

from __future__ import annotations

import threading
import time

import uvicorn

from embedfleet.common.redisserver import free_port
from embedfleet.producer.gateway import GatewaySettings, create_app, server


class Server:
    def __init__(self, settings: GatewaySettings):
        self.redis_url = settings.redis_url
        self.app = create_app(settings)
        self.server = uvicorn.Server(uvicorn.Config(self.app, **server.options(self.app, settings)))
        self.url = f"http://127.0.0.1:{settings.port}"
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "gateway did not start"
            time.sleep(0.02)

    def stop(self):
        self.server.should_exit = True
        self.thread.join(10)


def settings(redis_url: str, **fields) -> GatewaySettings:
    return GatewaySettings(redis_url=redis_url, port=free_port(), **{"log_level": "warning", **fields})
