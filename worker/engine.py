"""Engine: many requests in, one Result per request out -- verify, preprocess, batch, forward, postprocess."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from common.errors import EmbedfleetError, InternalError
from common.request import EmbedRequest
from common.result import Result
from worker.batcher import batches
from worker.model import LoadedModel
from worker.postprocess import cast, finish
from worker.preprocess import Prepared, prepare

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Item:
    """One input of one request, the unit the batcher sorts and cuts."""

    request: int
    row: int
    ids: list[int]
    prompt_length: int

    @property
    def length(self) -> int:
        return len(self.ids)


class Engine:
    """Runs a loaded model over whole lists of requests; never raises for a bad request.

    max_batch_tokens: padded-token budget of one forward pass (rows * longest row).
    max_batch_size: most rows in one forward pass.
    """

    def __init__(self, model: LoadedModel, *, max_batch_tokens: int = 16384, max_batch_size: int = 256):
        self.model = model
        self.caps = model.caps
        self.max_batch_tokens = max_batch_tokens
        self.max_batch_size = max_batch_size
        self.forward_passes = 0

    def run(self, requests: list[EmbedRequest]) -> list[Result]:
        """One Result per request, in input order."""
        results: list[Result | None] = [None] * len(requests)
        resolved: dict[int, EmbedRequest] = {}
        prepared: dict[int, Prepared] = {}
        for index, request in enumerate(requests):
            try:
                resolved[index] = request.resolve(self.caps)
                prepared[index] = prepare(self.model, resolved[index])
            except EmbedfleetError as exc:
                results[index] = Result.failure(request.id, self.caps.name, exc)
            except Exception as exc:  # a tokenizer crash on one request must not sink the others
                log.exception("preprocessing request %s failed", request.id)
                results[index] = Result.failure(request.id, self.caps.name, InternalError(
                    f"preprocessing failed: {type(exc).__name__}: {exc}"))

        rows, failed = self._forward(prepared)
        for index in prepared:
            request = resolved[index]
            if index in failed:
                results[index] = Result.failure(request.id, self.caps.name, failed[index])
                continue
            results[index] = self._postprocess(request, rows[index], prepared[index].prompt_tokens)
        return results

    def _forward(self, prepared: dict[int, Prepared]) -> tuple[dict[int, np.ndarray], dict[int, EmbedfleetError]]:
        """All inputs of all requests, sorted by length and cut by the token budget; one pass per batch."""
        items = sorted(
            (_Item(index, row, ids, prep.prompt_length)
             for index, prep in prepared.items() for row, ids in enumerate(prep.token_lists)),
            key=lambda item: item.length)
        rows: dict[int, np.ndarray] = {}
        failed: dict[int, EmbedfleetError] = {}
        for batch in batches(items, self.max_batch_tokens, self.max_batch_size, lambda item: item.length):
            self._pass(batch, prepared, rows, failed)
        return rows, failed

    def _pass(self, batch: list[_Item], prepared: dict[int, Prepared], rows: dict[int, np.ndarray],
              failed: dict[int, EmbedfleetError]) -> None:
        """One forward pass; if it fails, the batch again in halves, down to single rows, so that one
        poisoned input fails only its own request and a batch too big for the device (OOM) still runs."""
        live = [item for item in batch if item.request not in failed]
        if not live:
            return
        try:
            self.forward_passes += 1
            vectors = self.model.embed([item.ids for item in live],
                                       [item.prompt_length for item in live]).numpy()
        except Exception as exc:
            error = InternalError(f"forward pass failed: {type(exc).__name__}: {exc}")
            if len(live) == 1:
                log.exception("forward pass over 1 row failed; its request fails")
                failed[live[0].request] = error
                rows.pop(live[0].request, None)
                return
            log.warning("forward pass over %d rows failed (%s); retrying in halves", len(live), error.message)
        else:
            for item, vector in zip(live, vectors):
                if item.request not in rows:
                    count = len(prepared[item.request].token_lists)
                    rows[item.request] = np.empty((count, vectors.shape[1]), np.float32)
                rows[item.request][item.row] = vector
            return
        # Split outside the `except`: the traceback holds the failed pass's tensors (device memory on OOM).
        half = len(live) // 2
        self._pass(live[:half], prepared, rows, failed)
        self._pass(live[half:], prepared, rows, failed)

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

