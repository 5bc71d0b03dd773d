"""Redis bytes kept per finished request: one-text requests (a 384-dim float32 answer, 1,536 bytes of rows)
served by a real worker on the null model, through the sync Producer and the AsyncProducer; what each key
of one request costs (MEMORY USAGE). Public entry points only, so the same script measures an older tree:

    PYTHONPATH=. .venv/bin/python bench/stored.py [--requests 2000]
    git worktree add /tmp/before <commit> && PYTHONPATH=/tmp/before .venv/bin/python bench/stored.py
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time

import redis

from embedfleet.common.redisserver import RedisServer
from embedfleet import AsyncProducer, Producer

MODEL = "stored"


def serve(url: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "embedfleet.worker", "--redis-url", url, "--model", "null:384",
                             "--served-model-name", MODEL, "--no-cache"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=os.environ)


def settle(conn: redis.Redis) -> int:
    """used_memory once the server's own buffers have calmed down (two equal readings)."""
    last = -1
    while True:
        time.sleep(0.5)
        used = conn.info("memory")["used_memory"]
        if abs(used - last) < 512:
            return used
        last = used


def per_key(conn: redis.Redis, request_id: str) -> dict[str, int]:
    found = {}
    for key in conn.scan_iter(match=f"*{request_id}*", count=1000):
        name = key.decode().replace(request_id, "<id>")
        found[name] = conn.memory_usage(key) or 0
    return found


def sync_run(url: str, count: int) -> list[str]:
    with Producer(url) as producer:
        ids = producer.submit_many([[f"sync text {i}"] for i in range(count)], MODEL)
        for request_id in ids:
            producer.wait(request_id, 120)
    return ids


def async_run(url: str, count: int) -> list[str]:
    async def main():
        async with AsyncProducer(url) as producer:
            ids = await producer.submit_many([[f"async text {i}"] for i in range(count)], MODEL)
            await asyncio.gather(*(producer.wait(i, 120) for i in ids))
            return ids
    return asyncio.run(main())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=2000)
    args = parser.parse_args()
    rows = []
    with RedisServer() as server:
        conn = redis.Redis.from_url(server.url)
        worker = serve(server.url)
        try:
            while not conn.exists(f"embedfleet:model:{MODEL}"):
                time.sleep(0.1)
            sync_run(server.url, 10)  # warm: scripts loaded, connections made
            for name, run in (("Producer (sync)", sync_run), ("AsyncProducer", async_run)):
                before = settle(conn)
                ids = run(server.url, args.requests)
                after = settle(conn)
                rows.append((name, (after - before) / args.requests, per_key(conn, ids[len(ids) // 2])))
        finally:
            worker.terminate()
            worker.wait(30)
    print(f"Redis bytes kept per finished one-text request ({args.requests} requests, 384-dim float32 rows)")
    for name, per_request, keys_ in rows:
        print(f"  {name:16s} {per_request:8.0f} bytes/request   " +
              ", ".join(f"{k} {v}" for k, v in sorted(keys_.items())))


if __name__ == "__main__":
    main()
