"""The forward step: every input of a round's Work (worker/engine/seam.py) sorted by length and cut by the token
budget (worker/engine/batcher.py), one model pass per batch; identical inputs computed once, vectors at hand
(`known`: the serving side's cache hits) not computed, a failed pass run again in halves."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from embedfleet.common.errors import InternalError
from embedfleet.worker.engine import stageclock
from embedfleet.worker.engine.batcher import cuts, plan_passes, sharers
from embedfleet.worker.engine.latechunking import embed_spans
from embedfleet.worker.engine.seam import Known, Prepared, Work
from embedfleet.worker.engine.shaper import Shape, Shaper
from embedfleet.worker.engine.tasks.sparse import head_outputs

if TYPE_CHECKING:  # types only
    from embedfleet.worker.engine.models.base import Model
    from embedfleet.worker.engine.passthreads import SmallPasses

log = logging.getLogger(__name__)


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


class ForwardStep:
    """Engine's forward step (worker/engine/engine.py sets the attributes below)."""

    model: Model
    max_batch_tokens: int  # the fixed shape, without a shaper
    max_batch_size: int
    shaper: Shaper | None
    small_passes: SmallPasses  # a small CPU pass: one thread on a busy machine
    forward_passes: int
    forward_rows: int  # inputs the model ran over (after the cache and in-round dedup)

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
