"""An engine with the fleet's vector cache around it, as a worker's steps run them (worker/serving/steps.py), and
the worker that serves it with that cache."""

from __future__ import annotations

from tests import harness
from embedfleet.worker.serving.pipeline import BatchWorker
from embedfleet.worker.serving.steps import Steps


class Cached(Steps):
    """An engine with the fleet's cache around it, as the worker's steps run them; the counters are the
    engine's own."""

    forward_rows = property(lambda self: self.engine.forward_rows)
    forward_passes = property(lambda self: self.engine.forward_passes)
    model = property(lambda self: self.engine.model)
    caps = property(lambda self: self.engine.caps)

    def worker(self, connection, **options) -> BatchWorker:
        """A worker of the engine with this cache (harness.worker's `options`)."""
        return harness.worker(self.engine, connection, cache=self.cache, **options)
