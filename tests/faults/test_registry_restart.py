"""A Redis restarted empty under a live gateway and worker (issue 32, item 4): until the worker advertises again
the model registry is gone, and a model served a moment ago is answered 503 no_worker (retryable), never 404
(OpenAI clients retry a 503, not a 404). The clients loop until the fleet answers again, or a deadline."""

from __future__ import annotations

import threading
import time
from collections import Counter

import httpx

from embedfleet.common.redisserver import RedisServer
from tests.livegateway import live_gateway

DEADLINE = 120  # seconds the test may take at most: it ends as soon as the fleet answers after the restart
CLIENTS = 3


def test_a_redis_restart_answers_503_never_404(tmp_path, minilm_engine):
    server = RedisServer(tmp_path / "redis").start()  # no AOF, no RDB: a restart loses every key
    statuses: Counter = Counter()
    after_restart: Counter = Counter()
    restarted = threading.Event()
    answered_again = threading.Event()
    samples: dict[int, str] = {}

    def client(url: str) -> None:
        with httpx.Client(base_url=url, timeout=30) as http:
            end = time.monotonic() + DEADLINE
            while not answered_again.is_set() and time.monotonic() < end:
                try:
                    status = http.post("/v1/embeddings", json={"model": "minilm", "input": "hello"})
                except httpx.TransportError:
                    continue
                statuses[status.status_code] += 1
                samples.setdefault(status.status_code, status.text[:300])
                if restarted.is_set():
                    after_restart[status.status_code] += 1
                    if after_restart[200] >= 5:
                        answered_again.set()

    try:
        with live_gateway(server.url, [minilm_engine]) as url:
            threads = [threading.Thread(target=client, args=(url,), daemon=True) for _ in range(CLIENTS)]
            for thread in threads:
                thread.start()
            end = time.monotonic() + DEADLINE
            while statuses[200] < 5 and time.monotonic() < end:
                time.sleep(0.05)
            server.restart()
            restarted.set()
            for thread in threads:
                thread.join(DEADLINE)
    finally:
        server.stop()
    assert answered_again.is_set(), f"the fleet did not answer again after the restart: {dict(after_restart)}"
    assert statuses[404] == 0, f"{statuses[404]} x 404 ({samples.get(404)}); all: {dict(statuses)}"
    assert set(statuses) <= {200, 503}, f"{dict(statuses)}: {samples}"
