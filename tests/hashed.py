"""A worker of the model "hashed" in a thread of the test: a fixed vector per text (tests/crashworker.py's),
with `seconds_per_text` of "device" time, so that order is checked exactly and a run can be caught mid-way.
Registered for every test module by tests/conftest.py; torch loads only when a test starts a worker."""

from __future__ import annotations

import socket
import threading
import time

import pytest
from rq.suspension import resume

MODEL = "hashed"
DIM = 8


def hashed_model(seconds_per_text: float):
    import numpy as np

    from tests.crashworker import CrashModel, vector

    class Hashed(CrashModel):
        def embed(self, token_lists, prompt_lengths=None) -> np.ndarray:
            time.sleep(seconds_per_text * len(token_lists))
            return np.stack([vector(t[0]) for t in token_lists])

    return Hashed(MODEL)


@pytest.fixture
def fleet(redis_client):
    """start(seconds_per_text=0, **worker kwargs): a running worker of MODEL; all stopped at the end."""
    from worker.engine.engine import Engine
    from worker.serving.pipeline import BatchWorker

    started = []

    def start(seconds_per_text: float = 0.0, **kwargs) -> BatchWorker:
        engine = Engine(hashed_model(seconds_per_text), max_batch_tokens=64, max_batch_size=64)
        info = {"device": "cpu", "dtype": "float32", "max_batch_tokens": 64, "max_batch_size": 64,
                "budget_source": "flags", "max_jobs": 8, "host": socket.gethostname()}
        worker = BatchWorker(engine, redis_client, max_jobs=8, poll_timeout=1, info=info, **kwargs)
        worker.advertiser.advertise()
        thread = threading.Thread(target=worker.work, daemon=True)
        thread.start()
        started.append((worker, thread))
        return worker

    yield start
    resume(redis_client)
    for worker, thread in started:
        worker.stop()
        thread.join(30)
