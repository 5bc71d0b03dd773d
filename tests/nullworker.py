"""The real BatchWorker serving its null model (no compute) in a thread: the queue path for tests about
the producer and gateway side that need real workers but no real vectors."""

from __future__ import annotations

import contextlib
import threading

import redis

from worker.engine.engine import Engine
from worker.engine.models.nullmodel import NullModel
from worker.serving.pipeline import BatchWorker

NULL = "null"


@contextlib.contextmanager
def null_worker(redis_url: str, dimensions: int = 4):
    """An advertised worker; call `.serve()` to start it (the queue stays untouched until then)."""
    engine = Engine(NullModel(f"null:{dimensions}", served_name=NULL), max_batch_tokens=1 << 20,
                    max_batch_size=4096)
    worker = BatchWorker(engine, redis.Redis.from_url(redis_url), max_jobs=512, poll_timeout=1)
    worker.advertiser.advertise()
    thread = threading.Thread(target=worker.work, daemon=True)
    worker.serve = thread.start
    try:
        yield worker
    finally:
        worker.stop()
        if thread.ident is not None:
            thread.join(30)
