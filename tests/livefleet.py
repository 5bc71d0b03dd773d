"""A live fleet for a test module: BatchWorker threads on real Engines (one per served model), a real uvicorn
gateway, the session's real redis-server (flushed once, when the module's fleet starts)."""

from __future__ import annotations

import contextlib
import threading

import httpx
import redis

from tests import gatewayserver
from worker.engine.engine import Engine
from worker.serving.pipeline import BatchWorker


@contextlib.contextmanager
def live_fleet(redis_url: str, engines: dict[str, Engine], **settings):
    """Yield an httpx client on a gateway in front of one worker per engine (served under its caps' name)."""
    connection = redis.Redis.from_url(redis_url)
    connection.flushall()
    workers = [BatchWorker(engine, connection, poll_timeout=1) for engine in engines.values()]
    threads = [threading.Thread(target=w.work, daemon=True) for w in workers]
    for worker, thread in zip(workers, threads):
        thread.start()
        worker.advertiser.advertise()
    server = gatewayserver.Server(gatewayserver.settings(redis_url, **settings))
    try:
        with httpx.Client(base_url=server.url, timeout=60) as client:
            yield client
    finally:
        server.stop()
        for worker in workers:
            worker.stop()
        for thread in threads:
            thread.join(30)
        connection.close()
