"""The real BatchWorker serving its null model (no compute) in a thread: the queue path for tests about
the producer and gateway side that need real workers but no real vectors."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import redis

from tests.harness import idle_worker, serve
from embedfleet.worker.engine.engine import Engine
from embedfleet.worker.engine.models.nullmodel import NullModel
from embedfleet.worker.serving.pipeline import BatchWorker

NULL = "null"


def null_engine(dimensions: int = 4) -> Engine:
    return Engine(NullModel(f"null:{dimensions}", served_name=NULL), max_batch_tokens=1 << 20, max_batch_size=4096)


@contextlib.contextmanager
def null_worker(redis_url: str, dimensions: int = 4) -> Iterator[BatchWorker]:
    """An advertised worker; call `.serve()` to start it (the queue stays untouched until then). It serves in a
    thread (tests/harness.py's `serve`) until the `with` ends."""
    connection = redis.Redis.from_url(redis_url)
    worker = idle_worker(null_engine(dimensions), connection, max_jobs=512)
    with contextlib.ExitStack() as serving:
        serving.callback(connection.close)  # last: after the worker's thread has ended
        worker.serve = lambda: serving.enter_context(serve(worker))
        yield worker
