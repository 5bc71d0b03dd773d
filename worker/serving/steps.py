"""The model-side steps of one round as the serving pipeline runs them: the engine (worker/engine, no Redis)
with the fleet's vector cache (worker/serving/cache.py) around it.

    prepare   engine.prepare (verify, tokenise), then the cache's lookup (one MGET): rows found are `hits`
    forward   the rows the rounds just before computed (in memory), engine.forward, remember its rows
    finish    the new vectors written to the cache (one pipeline), then engine.finish (cut, normalise, cast)

Each step is what one stage of worker/serving/pipeline.py calls; `run` does the three back to back. Without
a cache the steps are the engine's own.
"""

from __future__ import annotations

from common.request import EmbedRequest
from common.result import Result
from worker.engine import stageclock
from worker.engine.engine import Work


class Steps:
    """`engine`: worker.engine.engine.Engine (or anything with its caps, prepare, forward and finish);
    `cache`: a worker.serving.cache.VectorCache, or None."""

    def __init__(self, engine, cache=None):
        self.engine = engine
        self.cache = cache

    def prepare(self, requests: list[EmbedRequest]) -> Work:
        work = self.engine.prepare(requests)
        if self.cache is not None:
            stageclock.lap("other")
            self.cache.lookup(work)  # never raises: an unreachable cache is all misses
            stageclock.lap("cache")
        return work

    def forward(self, work: Work, between=None) -> None:
        """`between()`: called between two passes (Engine.forward)."""
        if self.cache is not None:
            stageclock.lap("other")
            self.cache.recall(work)  # in memory: what the rounds just before computed
            stageclock.lap("cache")
        if between is None:
            self.engine.forward(work)
        else:
            self.engine.forward(work, between)
        if self.cache is not None:
            stageclock.lap("other")
            self.cache.remember(work)
            stageclock.lap("cache")

    def finish(self, work: Work) -> list[Result]:
        if self.cache is not None:
            stageclock.lap("other")
            self.cache.store(work)  # never raises: a cache that refuses writes only costs later misses
            stageclock.lap("cache")
        return self.engine.finish(work)

    def run(self, requests: list[EmbedRequest]) -> list[Result]:
        work = self.prepare(requests)
        self.forward(work)
        return self.finish(work)

    def stats(self) -> dict:
        """Counters for the worker's advert: the cache's hits and misses (none without a cache)."""
        return self.cache.stats() if self.cache is not None else {}
