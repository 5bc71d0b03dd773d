"""The model-side steps of one round as the serving pipeline runs them: the engine (worker/engine, no Redis)
with what only the serving side does around it: the fleet's vector cache (worker/serving/cache.py) and the long
requests it spreads over the fleet (worker/serving/spread.py).

    prepare   engine.prepare (verify, tokenise); long requests set aside to spread; the cache's lookup (one
              MGET, with the round's in-flight claims where both are on one Redis): rows found are the
              round's hits
    forward   the rows the rounds just before computed (in memory), engine.forward with the hits known,
              remember its rows
    finish    engine.finish (cut, normalise, cast)
    cache     once the round's answers are published: its new vectors written to the cache (one pipeline), so
              that the round trip is not on its requests' way (a request that asks again meanwhile misses)

Each step is what one stage of the pipeline calls (take.py, forward.py, finish.py), on the round it carries
(worker/serving/rounds.py); `run` does the three back to back. Without a cache the steps are the engine's own.
"""

from __future__ import annotations

import time

from embedfleet.common.request import EmbedRequest
from embedfleet.common.result import Result
from embedfleet.worker.engine import stageclock
from embedfleet.worker.engine.seam import ServingEngine
from embedfleet.worker.serving.rounds import Round
from embedfleet.worker.serving.spread import set_aside


class Steps:
    """`engine`: a worker.engine.engine.Engine (or another ServingEngine); `cache`: a
    worker.serving.cache.VectorCache, or None; `chunks_per_job`: a request with more chunks is spread over the
    fleet (0: none is)."""

    def __init__(self, engine: ServingEngine, cache=None, chunks_per_job: int = 0):
        self.engine = engine
        self.cache = cache
        self.chunks_per_job = chunks_per_job

    def prepare(self, round_: Round, requests: list[EmbedRequest], claim=None) -> None:
        """The round's `work`, `spread` and `lookup`; `claim`: the round's in-flight claims, sent and answered
        with the lookup (one round trip: `sends_claims`)."""
        round_.work = work = self.engine.prepare(requests)
        round_.spread = set_aside(work, self.chunks_per_job)
        if self.cache is not None:
            stageclock.lap("other")
            round_.lookup = self.cache.lookup(work, claim)  # never raises: an unreachable cache is all misses
            stageclock.lap("cache")

    def sends_claims(self, connection) -> bool:
        """Whether in-flight claims on `connection` can go with the cache's lookup (the same Redis client)."""
        return self.cache is not None and self.cache.sends_claims(connection)

    def forward(self, round_: Round, between=None) -> None:
        """`between()`: called between two passes (Engine.forward)."""
        work, found = round_.work, round_.lookup
        if found is not None:
            stageclock.lap("other")
            self.cache.recall(found)  # in memory: what the rounds just before computed
            stageclock.lap("cache")
        self.engine.forward(work, between, known=found.hits if found is not None else None)
        if found is not None:
            stageclock.lap("other")
            self.cache.remember(work, found)
            stageclock.lap("cache")

    def finish(self, round_: Round) -> list[Result | None]:
        return self.engine.finish(round_.work)

    def cache_new(self, round_: Round) -> None:
        """The round's new vectors into the cache; called after its answers are published."""
        if round_.lookup is not None:
            stageclock.lap("other")
            self.cache.store(round_.work, round_.lookup)  # never raises: a refused write only costs later misses
            stageclock.lap("cache")

    def run(self, requests: list[EmbedRequest]) -> list[Result | None]:
        round_ = Round(time.time())
        self.prepare(round_, requests)
        self.forward(round_)
        results = self.finish(round_)
        self.cache_new(round_)
        return results

    def stats(self) -> dict:
        """Counters for the worker's advert: the cache's hits and misses (none without a cache)."""
        return self.cache.stats() if self.cache is not None else {}
