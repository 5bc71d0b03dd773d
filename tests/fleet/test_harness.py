"""The in-process worker harness (tests/harness.py) fails a test whose worker fails: what work() raised is raised
again, and a worker that does not end after its stop fails the exit within the bound."""

from __future__ import annotations

import signal
import threading

import pytest

from embedfleet.common.request import EmbedRequest
from tests import harness
from tests.harness import burst, serve
from tests.nullworker import NULL, null_engine
from tests.heldpasses import GatedEngine
from tests.rqjobs import enqueue
from embedfleet.worker.serving.pipeline import BatchWorker


class Boom(Exception):
    pass


def broken(worker: BatchWorker, where: str) -> BatchWorker:
    def fail(*args, **kwargs):
        raise Boom(where)

    setattr(worker, where, fail) if where == "bootstrap" else setattr(worker.forwarding, "loop", fail)
    return worker


@pytest.mark.parametrize("where", ["bootstrap", "loop"])  # before its advert, and after it
def test_what_work_raised_is_raised_again(redis_client, where):
    with pytest.raises(Boom, match=where), serve(broken(harness.worker(null_engine(), redis_client), where)):
        pass
    with pytest.raises(Boom, match=where):
        burst(broken(harness.worker(null_engine(), redis_client), where))


def test_a_worker_that_does_not_end_fails_the_exit(redis_client):
    gated = GatedEngine(null_engine())  # a forward pass held until the test lets it go
    enqueue(redis_client, EmbedRequest(model=NULL, inputs=["held"]))
    worker = harness.worker(gated, redis_client)
    try:
        with pytest.raises(AssertionError, match="did not return within 0.5 s"), \
                serve(worker, stop_seconds=0.5):
            assert gated.entered.wait(30)  # stop() finishes what it took: the held pass keeps it running
    finally:
        gated.release.set()
    [thread] = [t for t in threading.enumerate() if t.name == f"serve-{worker.name}"]
    thread.join(30)  # once let go, it ends as it should
    assert not thread.is_alive() and thread.error is None


def test_a_burst_runs_outside_the_test_thread(redis_client):
    """work() in the main thread would leave the worker's SIGINT handler in the test process."""
    enqueue(redis_client, EmbedRequest(model=NULL, inputs=["one"]))
    before = signal.getsignal(signal.SIGINT)
    assert burst(null_engine(), redis_client)
    assert signal.getsignal(signal.SIGINT) is before
