"""Workers of the model "hashed" in threads of the test: a fixed vector per text (tests/crashworker.py's),
with `seconds_per_text` of "device" time, so that order is checked exactly and a run can be caught mid-way.
Registered for every test module by tests/conftest.py; torch loads only when a test starts a worker."""

from __future__ import annotations

import socket
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


HASHED_INFO = {"device": "cpu", "dtype": "float32", "max_batch_tokens": 64, "max_batch_size": 64,
               "budget_source": "flags", "max_jobs": 8}


@pytest.fixture
def hashed_worker(fleet, redis_client):
    """start(seconds_per_text=0, **worker options): a worker of MODEL serving in the test's `fleet`."""
    from embedfleet.worker.engine.engine import Engine

    def start(seconds_per_text: float = 0.0, **options):
        engine = Engine(hashed_model(seconds_per_text), max_batch_tokens=64, max_batch_size=64)
        return fleet.serve(engine, **{"max_jobs": 8, "info": {**HASHED_INFO, "host": socket.gethostname()},
                                      **options})

    yield start
    resume(redis_client)  # a test that suspended the fleet: its workers must see the stop, not wait out the pause
