"""Engine: many requests in, one Result per request out, in three steps a pipelined worker can overlap:
prepare (verify, tokenise), forward (length-sorted, token-budgeted passes) and finish (cut, normalise, cast)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np

from common.errors import EmbedfleetError, InternalError
from common.params import PoolingParams
from common.request import EmbedRequest
from common.result import Result
from worker.batcher import batches
from worker.postprocess import cast, finish
from worker.preprocess import Prepared, prepare

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Row:
    """One input of one request, the unit the batcher sorts and cuts."""

    request: int  # index into Round.requests
    row: int
    ids: list[int]
    prompt_length: int

    @property
    def length(self) -> int:
        return len(self.ids)


@dataclass
class Round:
    """Requests on their way through the engine. Each request ends with a result (its own error, or its
    embeddings once `finish` runs); `rows` and `failed` are filled by the forward passes."""

    requests: list[EmbedRequest]
    results: list[Result | None]
    resolved: dict[int, EmbedRequest] = field(default_factory=dict)
    prepared: dict[int, Prepared] = field(default_factory=dict)
    rows: dict[int, np.ndarray] = field(default_factory=dict)
    failed: dict[int, EmbedfleetError] = field(default_factory=dict)

    @property
    def texts(self) -> int:
        return sum(len(p.token_lists) for p in self.prepared.values())


class Engine:
    """Runs a loaded model over whole lists of requests; never raises for a bad request.

    model: a LoadedModel (worker.model) or anything with its `caps`, `embed(token_lists, prompt_lengths)`
        and, for `prepare`, a tokenizer (see worker.nullmodel for one without).
    max_batch_tokens: padded-token budget of one forward pass (rows * longest row).
    max_batch_size: most rows in one forward pass.
    """

    def __init__(self, model, *, max_batch_tokens: int = 16384, max_batch_size: int = 256):
        self.model = model
        self.caps = model.caps
        self.max_batch_tokens = max_batch_tokens
        self.max_batch_size = max_batch_size
        self.forward_passes = 0
        self._resolved: dict[PoolingParams, PoolingParams | EmbedfleetError] = {}

    def run(self, requests: list[EmbedRequest]) -> list[Result]:
        """One Result per request, in input order: the three steps back to back."""
        work = self.prepare(requests)
        self.forward(work)
        return self.finish(work)

    # -- the three steps --------------------------------------------------------------------------------

    def prepare(self, requests: list[EmbedRequest]) -> Round:
        """Verify each request against the model and tokenise it; a bad one gets its error result here."""
        work = Round(list(requests), [None] * len(requests))
        tokenize = getattr(self.model, "prepare", None)
        for index, request in enumerate(requests):
            try:
                resolved = self._resolve(request)
                work.resolved[index] = resolved
                work.prepared[index] = tokenize(resolved) if tokenize else prepare(self.model, resolved)
            except EmbedfleetError as exc:
                work.results[index] = Result.failure(request.id, self.caps.name, exc)
            except Exception as exc:  # a tokenizer crash on one request must not sink the others
                log.exception("preprocessing request %s failed", request.id)
                work.results[index] = Result.failure(request.id, self.caps.name, InternalError(
                    f"preprocessing failed: {type(exc).__name__}: {exc}"))
        return work

    def forward(self, work: Round) -> None:
        """All inputs of all requests, sorted by length and cut by the token budget; one pass per batch."""
        rows = sorted((_Row(index, row, ids, prep.prompt_length)
                       for index, prep in work.prepared.items() for row, ids in enumerate(prep.token_lists)),
                      key=lambda item: item.length)
        for batch in batches(rows, self.max_batch_tokens, self.max_batch_size, lambda item: item.length):
            self._pass(batch, work)

    def finish(self, work: Round) -> list[Result]:
        """Post-process every request that reached the forward pass; returns all results in input order."""
        for index, request in work.resolved.items():
            if work.results[index] is not None:
                continue
            if index in work.failed:
                work.results[index] = Result.failure(request.id, self.caps.name, work.failed[index])
            else:
                work.results[index] = self._postprocess(request, work.rows[index],
                                                        work.prepared[index].prompt_tokens)
        return work.results

    # -- internals --------------------------------------------------------------------------------------

    def _resolve(self, request: EmbedRequest) -> EmbedRequest:
        """request.resolve(caps), with the params part cached: most requests share a few param sets."""
        if len(request.inputs) > self.caps.max_inputs or request.is_tokens:
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
        return request.model_copy(update={"params": params})

    def _pass(self, batch: list[_Row], work: Round) -> None:
        """One forward pass; if it fails, the batch again in halves, down to single rows, so that one
        poisoned input fails only its own request and a batch too big for the device (OOM) still runs."""
        live = [item for item in batch if item.request not in work.failed]
        if not live:
            return
        try:
            self.forward_passes += 1
            vectors = self.model.embed([item.ids for item in live], [item.prompt_length for item in live])
            vectors = vectors.numpy() if hasattr(vectors, "numpy") else vectors  # torch, or numpy (null model)
        except Exception as exc:
            error = InternalError(f"forward pass failed: {type(exc).__name__}: {exc}")
            if len(live) == 1:
                log.exception("forward pass over 1 row failed; its request fails")
                work.failed[live[0].request] = error
                work.rows.pop(live[0].request, None)
                return
            log.warning("forward pass over %d rows failed (%s); retrying in halves", len(live), error.message)
        else:
            for item, vector in zip(live, vectors):
                if item.request not in work.rows:
                    count = len(work.prepared[item.request].token_lists)
                    work.rows[item.request] = np.empty((count, vectors.shape[1]), np.float32)
                work.rows[item.request][item.row] = vector
            return
        # Split outside the `except`: the traceback holds the failed pass's tensors (device memory on OOM).
        half = len(live) // 2
        self._pass(live[:half], work)
        self._pass(live[half:], work)

    def _postprocess(self, request: EmbedRequest, vectors: np.ndarray, prompt_tokens: int) -> Result:
        params = request.params
        try:
            final = finish(vectors, params.dimensions, bool(params.use_activation))
            stored = cast(final, params.embed_dtype)
            return Result.success(request.id, self.caps.name, stored, params.embed_dtype,
                                  params.endianness, prompt_tokens)
        except Exception as exc:
            log.exception("postprocessing request %s failed", request.id)
            return Result.failure(request.id, self.caps.name, InternalError(
                f"postprocessing failed: {type(exc).__name__}: {exc}"))
