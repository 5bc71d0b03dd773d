"""The documented FastAPI example app (examples/fastapi_app.py), served by a real uvicorn against a real
redis-server and the real BatchWorker on its null model."""

from __future__ import annotations

import threading
import time

import httpx
import numpy as np
import uvicorn

from embedfleet.common.redisserver import free_port
from tests.nullworker import null_worker


def test_the_example_app_enqueues_and_awaits(redis_url, monkeypatch):
    monkeypatch.setenv("EMBEDFLEET_REDIS_URL", redis_url)  # what the example's docstring tells a user to set
    from examples.fastapi_app import app

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    with null_worker(redis_url) as worker:
        worker.serve()
        thread.start()
        deadline = time.monotonic() + 10
        while not server.started:
            assert time.monotonic() < deadline and thread.is_alive(), "the example app did not start"
            time.sleep(0.02)
        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
                together = client.post("/embed", json={"texts": ["hello", "world"]})
                each = client.post("/embed-each", json={"texts": ["a", "b", "c"]})
                unknown = client.post("/embed", json={"texts": ["x"], "model": "no-such-model"})
        finally:
            server.should_exit = True
            thread.join(10)
    assert together.status_code == 200 and np.asarray(together.json()["embeddings"]).shape == (2, 4)
    assert each.status_code == 200 and np.asarray(each.json()["embeddings"]).shape == (3, 4)
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"
