"""The prepare step: each request of a round verified against the model and tokenised into a Work
(worker/engine/seam.py); a request that fails gets its error result here and the round goes on."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from embedfleet.common.errors import EmbedfleetError, InternalError
from embedfleet.common.request import EmbedRequest
from embedfleet.common.result import Result
from embedfleet.worker.engine import stageclock
from embedfleet.worker.engine.inputbounds import bound_inputs
from embedfleet.worker.engine.preprocess import prepare_many
from embedfleet.worker.engine.seam import Work
from embedfleet.worker.engine.tasks.inputs import prepare_task

if TYPE_CHECKING:  # types only
    from embedfleet.common.capabilities import ModelCapabilities
    from embedfleet.common.params import PoolingParams
    from embedfleet.worker.engine.models.base import Model

log = logging.getLogger(__name__)


class _FailingAlone:
    """PrepareStep._failing_alone: a context per request, so a plain class (a generator's costs ~1 us a request)."""

    __slots__ = ("model", "work", "index", "request")

    def __init__(self, model: str, work: Work, index: int, request: EmbedRequest):
        self.model, self.work, self.index, self.request = model, work, index, request

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, exc, traceback) -> bool:
        if exc is None or not isinstance(exc, Exception):  # (KeyboardInterrupt and the like go on up)
            return False
        if not isinstance(exc, EmbedfleetError):  # a tokenizer crash on one request must not sink the others
            log.exception("preprocessing request %s failed", self.request.id, exc_info=exc)
            exc = InternalError(f"preprocessing failed: {type(exc).__name__}: {exc}")
        self.work.results[self.index] = Result.failure(self.request.id, self.model, exc)
        return True


class PrepareStep:
    """Engine's prepare step (worker/engine/engine.py sets the attributes below)."""

    model: Model
    caps: ModelCapabilities
    _resolved: dict[PoolingParams, PoolingParams | EmbedfleetError]  # params -> resolved against caps, or why not

    def prepare(self, requests: list[EmbedRequest]) -> Work:
        """Verify each request against the model and tokenise it; a bad one gets its error result here.
        Plain embed requests are tokenised together (preprocess.prepare_many), not one tokenizer call each."""
        work = Work(list(requests), [None] * len(requests))
        tokenize = self.model.prepare  # a model that tokenises its own way (the null model), or None
        embeds: list[int] = []
        stageclock.lap("other")
        for index, request in enumerate(requests):
            with self._failing_alone(work, index, request):
                resolved = bound_inputs(self.model, self._resolve(request))  # before any tokenizing
                work.resolved[index] = resolved
                if resolved.params.task != "embed" or resolved.params.outputs is not None:
                    stageclock.lap("verify")
                    prepared = prepare_task(self.model, resolved)
                    if isinstance(prepared, Result):  # tokenize / detokenize: answered without a forward pass
                        work.results[index] = prepared
                    else:
                        work.prepared[index] = prepared
                    stageclock.lap("tokenise")
                elif tokenize is not None:
                    work.prepared[index] = tokenize(resolved)
                else:
                    embeds.append(index)
        stageclock.lap("verify")
        if embeds:
            for index, prepared in zip(embeds, prepare_many(self.model, [work.resolved[i] for i in embeds])):
                with self._failing_alone(work, index, requests[index]):
                    if isinstance(prepared, Exception):
                        raise prepared
                    work.prepared[index] = prepared
            # request order, as if prepared one by one (tasks came first above): flat positions follow it
            work.prepared = dict(sorted(work.prepared.items()))
            stageclock.lap("tokenise")
        return work

    def _failing_alone(self, work: Work, index: int, request: EmbedRequest) -> _FailingAlone:
        """A request whose preparing raises gets its error result; the round goes on."""
        return _FailingAlone(self.caps.name, work, index, request)

    def _resolve(self, request: EmbedRequest) -> EmbedRequest:
        """request.resolve(caps), with the params part cached: most requests share a few param sets."""
        if len(request.inputs) > self.caps.max_inputs or request.is_tokens or request.params.task != "embed" \
                or request.params.chunk_spans or request.chat is not None:
            return request.resolve(self.caps)  # raises the right message (or checks token ids)
        params = self._resolved.get(request.params)
        if params is None:
            try:
                params = request.params.resolve(self.caps)
            except EmbedfleetError as exc:
                params = exc
            if len(self._resolved) < 1024:
                self._resolved[request.params] = params
        if isinstance(params, EmbedfleetError):
            raise params
        return request.with_params(params)
