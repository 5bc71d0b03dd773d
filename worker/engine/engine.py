"""Engine: many requests in, one Result per request out, in three steps a pipelined worker can overlap, one module
each in worker/engine/steps/: prepare (verify, tokenise), forward (the passes worker/engine/batcher.py plans) and
finish (cut, normalise, cast). No Redis here: the serving side (worker/serving/steps.py) looks vectors up in its
cache between the steps and hands them to `forward` as `known` rows, and takes the long requests it spreads over
the fleet out of a Work before its passes. What the two sides hand each other (Work, Prepared) and the engine's
duck type (ServingEngine) are in worker/engine/seam.py."""

from __future__ import annotations

from typing import TYPE_CHECKING

from embedfleet.worker.engine import passthreads
from embedfleet.worker.engine.steps.finish import FinishStep
from embedfleet.worker.engine.steps.forward import ForwardStep
from embedfleet.worker.engine.steps.prepare import PrepareStep

if TYPE_CHECKING:  # types only
    from embedfleet.common.errors import EmbedfleetError
    from embedfleet.common.params import PoolingParams
    from embedfleet.common.request import EmbedRequest
    from embedfleet.common.result import Result
    from embedfleet.worker.engine.models.base import Model
    from embedfleet.worker.engine.shaper import Shaper


class Engine(PrepareStep, ForwardStep, FinishStep):
    """Runs a loaded model over whole lists of requests; never raises for a bad request. A ServingEngine
    (worker/engine/seam.py): `prepare`, `forward`, `finish`, `shape`, `combine_parts`.

    model: a Model (worker/engine/models/base.py): a LoadedModel or another kind, or the null model.
    max_batch_tokens: padded-token budget of one forward pass (rows * longest row).
    max_batch_size: most rows in one forward pass.
    shaper: a worker.engine.shaper.Shaper that picks the shape per round and learns from every pass; None:
        the fixed shape above.
    Identical inputs in one round (same token ids, prompt length, head and pair split) are computed once.
    """

    def __init__(self, model: Model, *, max_batch_tokens: int = 16384, max_batch_size: int = 256,
                 shaper: Shaper | None = None):
        self.model = model
        self.caps = model.caps
        self.max_batch_tokens = max_batch_tokens
        self.max_batch_size = max_batch_size
        self.shaper = shaper
        self.forward_passes = 0
        self.forward_rows = 0  # inputs the model ran over (after the cache and in-round dedup)
        self.small_passes = passthreads.SmallPasses()  # a small CPU pass: one thread on a busy machine
        self._resolved: dict[PoolingParams, PoolingParams | EmbedfleetError] = {}

    def run(self, requests: list[EmbedRequest]) -> list[Result]:
        """One Result per request, in input order: the three steps back to back."""
        work = self.prepare(requests)
        self.forward(work)
        return self.finish(work)
