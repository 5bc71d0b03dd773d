"""The finish step: each request's rows from the forward passes -> its Result (pooled per input, Matryoshka cut,
normalised, cast: worker/engine/postprocess.py; the tasks' heads: worker/engine/tasks/heads.py), in input order;
and the result of a long request whose chunks the fleet computed apart (`combine_parts`)."""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING

import numpy as np

from embedfleet.common.errors import InternalError
from embedfleet.common.request import EmbedRequest
from embedfleet.common.result import Result
from embedfleet.worker.engine import stageclock
from embedfleet.worker.engine.chunking import combine
from embedfleet.worker.engine.postprocess import cast, cut_and_normalise, finish_together
from embedfleet.worker.engine.seam import Prepared, Work
from embedfleet.worker.engine.tasks.heads import finish_task

if TYPE_CHECKING:  # types only
    from embedfleet.common.capabilities import ModelCapabilities
    from embedfleet.worker.engine.models.base import Model

log = logging.getLogger(__name__)


class FinishStep:
    """Engine's finish step (worker/engine/engine.py sets the attributes below)."""

    model: Model
    caps: ModelCapabilities

    def finish(self, work: Work) -> list[Result]:
        """Post-process every request that reached the forward pass; returns all results in input order. Plain
        embed requests that share their output params are cut, normalised and cast together (`_postprocess_all`)."""
        stageclock.lap("other")
        plain: dict[tuple, list[tuple[int, EmbedRequest, np.ndarray, Prepared]]] = {}
        for index, request in work.resolved.items():
            if work.results[index] is not None or index not in work.prepared:  # (taken out: spread by the caller)
                continue
            if index in work.failed:
                work.results[index] = Result.failure(request.id, self.caps.name, work.failed[index])
                continue
            prep, params = work.prepared[index], request.params
            if params.task == "embed" and params.outputs is None and prep.spans is None:
                key = (params.dimensions, bool(params.use_activation), params.embed_dtype)
                plain.setdefault(key, []).append((index, request, prep.pooled(work.rows[index]), prep))
                continue
            result = self._postprocess(request, prep.pooled(work.rows[index]), prep)
            if prep.spans is not None and result.ok:
                result = dataclasses.replace(result, spans=tuple(prep.spans))
            work.results[index] = result
        for (dimensions, normalize, embed_dtype), group in plain.items():
            self._postprocess_all(group, dimensions, normalize, embed_dtype, work.results)
        stageclock.lap("cast")
        return work.results

    def combine_parts(self, request: EmbedRequest, rows: np.ndarray, owners: list[int], weights: list[int],
                      prompt_tokens: int) -> Result:
        """The result of a long request whose chunks were computed apart (its parts, spread over the fleet by
        worker/serving/spread.py): the chunk rows (`owners`: each one's input; `weights`: its tokens) pooled per
        input as a long input's chunks are (worker/engine/chunking.py), then cut, normalised and cast."""
        pooled = combine(rows, owners, weights, len(request.inputs))
        params = request.params
        stored = cast(cut_and_normalise(pooled, params.dimensions, bool(params.use_activation)), params.embed_dtype)
        return Result.success(request.id, self.caps.name, stored, params.embed_dtype, params.endianness,
                              prompt_tokens)

    def _postprocess_all(self, group: list[tuple[int, EmbedRequest, np.ndarray, Prepared]], dimensions: int | None,
                         normalize: bool, embed_dtype: str, results: list[Result | None]) -> None:
        """Plain embed requests that share their output params, cut, normalised and cast together
        (postprocess.finish_together); if that fails, each alone, so that a failure stays its own."""
        try:
            stored = finish_together([pooled for _, _, pooled, _ in group], dimensions, normalize, embed_dtype)
        except Exception:
            log.warning("postprocessing %d requests together failed; each alone", len(group), exc_info=True)
            stored = [None] * len(group)
        for (index, request, pooled, prep), mine in zip(group, stored):
            results[index] = self._postprocess(request, pooled, prep) if mine is None else Result.success(
                request.id, self.caps.name, mine, embed_dtype, request.params.endianness, prep.prompt_tokens)

    def _postprocess(self, request: EmbedRequest, vectors, prepared: Prepared) -> Result:
        params, prompt_tokens = request.params, prepared.prompt_tokens
        try:
            if params.task != "embed" or params.outputs is not None:
                return finish_task(self.model, request, vectors, prepared)
            final = cut_and_normalise(vectors, params.dimensions, bool(params.use_activation))
            stored = cast(final, params.embed_dtype)
            return Result.success(request.id, self.caps.name, stored, params.embed_dtype,
                                  params.endianness, prompt_tokens)
        except Exception as exc:
            log.exception("postprocessing request %s failed", request.id)
            return Result.failure(request.id, self.caps.name, InternalError(
                f"postprocessing failed: {type(exc).__name__}: {exc}"))
