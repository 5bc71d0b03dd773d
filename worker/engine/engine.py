"""Engine: many requests in, one Result per request out, in three steps a pipelined worker can overlap:
prepare (verify, tokenise), forward (the passes worker/engine/batcher.py plans) and finish (cut, normalise,
cast). No Redis here: the serving side (worker/serving/steps.py) looks vectors up in its cache between the
steps and hands them to `forward` as `known` rows, and takes the long requests it spreads over the fleet out of
a Work before its passes."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from embedfleet.common.capabilities import ModelCapabilities
from embedfleet.common.errors import EmbedfleetError, InternalError
from embedfleet.common.params import PoolingParams
from embedfleet.common.request import EmbedRequest
from embedfleet.common.result import Result
from embedfleet.worker.engine import passthreads, stageclock
from embedfleet.worker.engine.batcher import cuts, plan_passes, sharers
from embedfleet.worker.engine.chunking import combine
from embedfleet.worker.engine.inputbounds import bound_inputs
from embedfleet.worker.engine.models.base import Model
from embedfleet.worker.engine.shaper import Shape, Shaper
from embedfleet.worker.engine.latechunking import embed_spans
from embedfleet.worker.engine.postprocess import cast, cut_and_normalise, finish_together
from embedfleet.worker.engine.preprocess import Prepared, prepare_many
from embedfleet.worker.engine.tasks.heads import finish_task
from embedfleet.worker.engine.tasks.inputs import prepare_task
from embedfleet.worker.engine.tasks.sparse import head_outputs

log = logging.getLogger(__name__)

Known = dict[int, dict[int, np.ndarray]]  # request -> {row: its vector}, at hand before the passes


@dataclass
class Work:
    """The engine's work on one round of requests. Each request ends with a result (its own error, or its
    embeddings once `finish` runs) unless the caller took it out of `prepared` before the passes; `rows` and
    `failed` are filled by the forward passes."""

    requests: list[EmbedRequest]
    results: list[Result | None]
    resolved: dict[int, EmbedRequest] = field(default_factory=dict)
    prepared: dict[int, Prepared] = field(default_factory=dict)
    rows: dict[int, np.ndarray | list[np.ndarray]] = field(default_factory=dict)  # a list: per-token rows
    failed: dict[int, EmbedfleetError] = field(default_factory=dict)
    passes: int = 0  # forward passes cut by the budget (a failed pass's halves not counted)
    tokens: int = 0  # real tokens through those passes
    padded_tokens: int = 0  # rows * longest row, summed over the passes: what the device computed

    @property
    def texts(self) -> int:
        """Inputs that reach the forward passes."""
        return sum(len(p.token_lists) for p in self.prepared.values())


class ServingEngine(Protocol):
    """What the serving side (worker/serving) calls on an engine: Engine, or a test's wrapper of one."""

    caps: ModelCapabilities
    shaper: Shaper | None  # learns the forward-pass shape while serving (adverts, metrics); None: it does not

    def shape(self) -> Shape | None:
        """The forward-pass shape the next round runs at; None: no shape (rounds are cut by request count)."""
        ...

    def prepare(self, requests: list[EmbedRequest]) -> Work: ...

    def forward(self, work: Work, between: Callable[[], None] | None = None, *, known: Known | None = None) -> None:
        ...

    def finish(self, work: Work) -> list[Result | None]: ...

    def combine_parts(self, request: EmbedRequest, rows: np.ndarray, owners: list[int], weights: list[int],
                      prompt_tokens: int) -> Result: ...


@dataclass
class _Flat:
    """Every input of a round in one flat list, request by request, with the length-sorted order the
    batches are cut from; vectors land in one array at their flat position."""

    token_lists: list[list[int]]
    prompt_lengths: list[int]
    owners: np.ndarray  # flat position -> request index
    vectors: np.ndarray | None = None
    heads: list[str] = field(default_factory=list)  # flat position -> Prepared.head
    pair_starts: list[int] = field(default_factory=list)  # flat position -> a pair's second text (0: none)
    ragged: dict[int, np.ndarray] = field(default_factory=dict)  # head "tokens": flat position -> its rows
    copies: dict[int, int] = field(default_factory=dict)  # duplicate position -> the computed one (PassPlan)
    _sharers: dict[int, list[int]] | None = None  # the reverse, built when a failure first asks

    def users(self, position: int) -> set[int]:
        """The requests that need the vector computed at `position` (its own and its duplicates')."""
        if self._sharers is None:
            self._sharers = sharers(self.copies)
        return {int(self.owners[position])} | {int(self.owners[p]) for p in self._sharers.get(position, ())}

    def allocate(self, width: int) -> None:
        if self.vectors is None:
            self.vectors = np.empty((len(self.token_lists), width), np.float32)


class _FailingAlone:
    """Engine._failing_alone: a context per request, so a plain class (a generator's costs ~1 us a request)."""

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


class Engine:
    """Runs a loaded model over whole lists of requests; never raises for a bad request.

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

    # -- the three steps --------------------------------------------------------------------------------

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

    def shape(self) -> Shape:
        """The forward-pass shape the next round runs at (the shaper's, or the fixed one)."""
        return self.shaper.shape() if self.shaper is not None else Shape(self.max_batch_tokens, self.max_batch_size)

    def forward(self, work: Work, between: Callable[[], None] | None = None, *, known: Known | None = None) -> None:
        """All inputs of all requests, sorted by length and cut by the token budget; one pass per batch.
        A late-chunking request (spans) gets a pass of its own: its rows are spans, not inputs.
        `between()` is called between two passes: the serving side runs higher-priority work there, and
        this round goes on where it paused. `known`: vectors at hand before the passes (the serving side's
        cache hits), request -> {row: vector}; those rows are not computed."""
        stageclock.lap("other")
        shape = self.shape()
        for index, prep in work.prepared.items():
            if prep.spans is not None:
                self._span_pass(index, prep, work, shape)
        flat = self._flatten(work)
        if flat is None:
            return
        known = self._known(work, known or {})
        plan = plan_passes(flat.token_lists, flat.prompt_lengths, list(zip(flat.heads, flat.pair_starts)), known,
                           shape.tokens, shape.rows)
        flat.copies = plan.copies
        stageclock.lap("plan")
        for number, positions in enumerate(plan.passes):
            if number and between is not None:
                between()
            batch = [len(flat.token_lists[p]) for p in positions]
            work.passes += 1
            work.tokens += sum(batch)
            work.padded_tokens += len(batch) * max(batch)  # what the device computed
            began = time.perf_counter()
            if self._pass(positions, flat, work) and self.shaper is not None:
                self.shaper.observe(shape, len(batch), len(batch) * max(batch), time.perf_counter() - began,
                                    tokens=sum(batch))
            stageclock.lap("scatter")
        if known:
            flat.allocate(len(next(iter(known.values()))))
            for position, vector in known.items():
                flat.vectors[position] = vector
        self._share(flat)
        offset = 0
        for index, prep in work.prepared.items():
            if prep.spans is not None:
                continue
            count = len(prep.token_lists)
            if index not in work.failed:
                work.rows[index] = [flat.ragged[p] for p in range(offset, offset + count)] \
                    if prep.head != "pool" else flat.vectors[offset:offset + count]
            offset += count
        stageclock.lap("scatter")

    @staticmethod
    def _share(flat: _Flat) -> None:
        """Each duplicate takes its computed position's rows: per-token rows by reference, pooled vectors in one
        numpy copy (a round of one text repeated 1,024 times spent 0.7 us a row on a copy each)."""
        copies = flat.copies
        if flat.ragged:
            for copy, source in copies.items():
                if source in flat.ragged:
                    flat.ragged[copy] = flat.ragged[source]
            copies = {copy: source for copy, source in copies.items() if source not in flat.ragged}
        if copies and flat.vectors is not None:  # None only if every pass failed: those requests failed
            targets = np.fromiter(copies.keys(), np.intp, len(copies))
            flat.vectors[targets] = flat.vectors[np.fromiter(copies.values(), np.intp, len(copies))]

    @staticmethod
    def _flatten(work: Work) -> _Flat | None:
        token_lists: list[list[int]] = []
        prompt_lengths: list[int] = []
        owners: list[int] = []
        heads: list[str] = []
        pair_starts: list[int] = []
        for index, prep in work.prepared.items():
            if prep.spans is not None:
                continue
            token_lists.extend(prep.token_lists)
            prompt_lengths.extend(prep.prompt_lengths)
            owners.extend([index] * len(prep.token_lists))
            heads.extend([prep.head] * len(prep.token_lists))
            pair_starts.extend(prep.pair_starts or [0] * len(prep.token_lists))
        if not token_lists:
            return None
        return _Flat(token_lists, prompt_lengths, np.asarray(owners), heads=heads, pair_starts=pair_starts)

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

    # -- internals --------------------------------------------------------------------------------------

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

    @staticmethod
    def _known(work: Work, given: Known) -> dict[int, np.ndarray]:
        """Flat position -> the vector given for it (flat order is request by request, row by row)."""
        known: dict[int, np.ndarray] = {}
        offset = 0
        for index, prep in work.prepared.items():
            if prep.spans is not None:  # late chunking runs apart (_span_pass): not in the flat positions
                continue
            for row, vector in given.get(index, {}).items():
                known[offset + row] = vector
            offset += len(prep.token_lists)
        return known

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

    def _span_pass(self, index: int, prep: Prepared, work: Work, shape: Shape) -> None:
        """A late-chunking request's inputs, in order, in passes cut by the token budget."""
        try:
            rows = []
            for start, end in cuts([len(ids) for ids in prep.token_lists], shape.tokens, shape.rows):
                spans = [(owner - start, *rest) for owner, *rest in prep.spans if start <= owner < end]
                batch = [len(ids) for ids in prep.token_lists[start:end]]
                work.passes, work.tokens = work.passes + 1, work.tokens + sum(batch)
                work.padded_tokens += len(batch) * max(batch)
                self.forward_passes += 1
                rows.append(embed_spans(self.model, prep.token_lists[start:end], spans))
            work.rows[index] = np.vstack(rows)
        except Exception as exc:  # this request fails alone
            log.exception("late-chunking pass failed")
            work.failed[index] = InternalError(f"forward pass failed: {type(exc).__name__}: {exc}")

    def _pass(self, positions: np.ndarray, flat: _Flat, work: Work) -> bool:
        """One forward pass over these flat positions; if it fails, the batch again in halves, down to single
        rows, so that one poisoned input fails only its own request and a batch too big for the device (OOM)
        still runs. True if it ran whole, as one pass (what the shaper may learn from)."""
        if work.failed:  # rows no live request needs any more are skipped
            positions = positions[[not flat.users(int(p)) <= work.failed.keys() for p in positions]]
        if not len(positions):
            return False
        try:
            self.forward_passes += 1
            self.forward_rows += len(positions)
            lists = [flat.token_lists[p] for p in positions]
            head = flat.heads[positions[0]]
            if head != "pool":  # per-token rows, or a multi-head model's parts (worker/engine/tasks/sparse.py)
                ragged = self.model.token_embed(lists) if head == "tokens" \
                    else self.model.outputs(lists, head_outputs(head))
                for p, rows in zip(positions, ragged):
                    flat.ragged[int(p)] = rows
                return True
            pairs = {"pair_starts": [flat.pair_starts[p] for p in positions]} \
                if any(flat.pair_starts[p] for p in positions) else {}  # a cross-encoder's pairs
            padded = len(lists) * max(map(len, lists))
            with self.small_passes.for_pass(padded, getattr(self.model, "device", "")):  # 1 or all threads
                vectors = self.model.embed(lists, [flat.prompt_lengths[p] for p in positions], **pairs)
            vectors = vectors.numpy() if hasattr(vectors, "numpy") else vectors  # torch, or numpy (null model)
        except Exception as exc:
            error = InternalError(f"forward pass failed: {type(exc).__name__}: {exc}")
            if len(positions) == 1:
                log.exception("forward pass over 1 row failed; its request fails")
                for owner in flat.users(int(positions[0])):  # a duplicate of the row would fail alike
                    work.failed.setdefault(owner, error)
                return False
            log.warning("forward pass over %d rows failed (%s); retrying in halves", len(positions), error.message)
        else:
            self._fail_unfinite(vectors, positions, flat, work)
            flat.allocate(vectors.shape[1])
            flat.vectors[positions] = vectors
            return True
        # Split outside the `except`: the traceback holds the failed pass's tensors (device memory on OOM).
        half = len(positions) // 2
        self._pass(positions[:half], flat, work)
        self._pass(positions[half:], flat, work)
        return False

    def _fail_unfinite(self, vectors: np.ndarray, positions: np.ndarray, flat: _Flat, work: Work) -> None:
        """A row whose vector holds inf or NaN (the model overflowed on that input: float16 past 65,504, say)
        fails the requests that use it, with a message; never stored as a vector. Microseconds a pass."""
        unfinite = ~np.isfinite(vectors).all(axis=1)
        if not unfinite.any():
            return
        error = InternalError("the model's output for this input is not finite (inf or NaN): the model overflows on "
                              "it in the precision this worker serves; a worker with --dtype float32 can embed it")
        for p in positions[unfinite]:
            for owner in flat.users(int(p)):
                work.failed.setdefault(owner, error)
        log.warning("%d of %d rows gave non-finite vectors; their requests fail", int(unfinite.sum()), len(positions))

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
