"""The engine seam: the values the serving side (worker/serving) and the engine (worker/engine/engine.py) hand each
other, and the engine's duck type. No torch here (nor anything that loads it): a serving module imports this and
not the engine, so that a null-model worker never loads torch.

    Prepared       one request's token-id lists, ready for batching (the prepare step's output per request)
    Work           one round of requests through the three steps (prepare, forward, finish), and what the
                   serving side asks of it: the rows to cache, a request's computed rows, the passes it needs
    ServingEngine  what the serving side calls on an engine: Engine, or a test's wrapper of one
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import numpy as np

from embedfleet.worker.engine.batcher import cuts
from embedfleet.worker.engine.chunking import combine

if TYPE_CHECKING:  # types only
    from embedfleet.common.capabilities import ModelCapabilities
    from embedfleet.common.errors import EmbedfleetError
    from embedfleet.common.request import EmbedRequest
    from embedfleet.common.result import Result
    from embedfleet.worker.engine.shaper import Shape, Shaper

Known = dict[int, dict[int, np.ndarray]]  # request -> {row: its vector}, at hand before the passes


@dataclass
class Prepared:
    """One request's token-id lists, ready for batching."""

    token_lists: list[list[int]]
    prompt_length: int = 0  # tokens to leave out of pooling (only with ST's include_prompt=False)
    # what the forward pass returns: "pool" (one vector per row), "tokens" (one per token), or "outputs:<heads>" (a
    # multi-head or sparse model's parts, worker/engine/tasks/sparse.py)
    head: str = "pool"
    pair_starts: list[int] | None = None  # a cross-encoder's pairs: where each row's second text starts
    owners: list[int] | None = None  # chunked inputs: the input each token list is a chunk of (ascending)
    spans: list[tuple[int, int, int, int, int]] | None = None  # late chunking: one output row per span

    @property
    def texts(self) -> int:
        """Token lists (rows) it sends to the forward passes: an input's chunks count one each."""
        return len(self.token_lists)

    @property
    def prompt_tokens(self) -> int:
        """Tokens actually embedded: after truncation, special and prompt tokens included (every chunk's)."""
        return sum(map(len, self.token_lists))

    @property
    def prompt_lengths(self) -> list[int]:
        """Per token list: the prompt sits at the front of an input, so in its first chunk only."""
        if self.owners is None:
            return [self.prompt_length] * len(self.token_lists)
        return [self.prompt_length if k == 0 or self.owners[k - 1] != owner else 0
                for k, owner in enumerate(self.owners)]

    @property
    def pooled_rows(self) -> bool:
        """Whether each row is one pooled vector of one text's tokens (not late chunking's spans pooled from a
        whole input's states, per-token rows or a cross-encoder's pairs): what a vector cache may keep."""
        return self.spans is None and self.head == "pool" and not self.pair_starts

    def pooled(self, rows: np.ndarray) -> np.ndarray:
        """One row per input: a chunked input's chunk rows combined by their token-count-weighted mean."""
        if self.owners is None:
            return rows
        return combine(rows, self.owners, [len(ids) for ids in self.token_lists], self.owners[-1] + 1)


@dataclass
class Work:
    """The engine's work on one round of requests. Each request ends with a result (its own error, or its
    embeddings once `finish` runs) unless the caller took it out (`set_aside`) before the passes; `rows` and
    `failed` are filled by the forward passes. The fields are the engine's; the serving side reads the methods
    and the counters (`texts`, `passes`, `tokens`, `padded_tokens`)."""

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
        return sum(p.texts for p in self.prepared.values())

    @property
    def padded_alone(self) -> int:
        """Padded tokens were each request one pass of its own (rows * its longest row, summed): a bound on what
        the passes compute, known before them (the watchdog's measure)."""
        return sum(len(p.token_lists) * max(map(len, p.token_lists), default=0) for p in self.prepared.values())

    def verified(self, index: int) -> EmbedRequest:
        """Request `index` as verified against the model (params resolved)."""
        return self.resolved[index]

    def prepared_of(self, index: int) -> Prepared | None:
        """Request `index`'s inputs as the passes take them; None: answered at prepare (its own error, tokenize)
        or set aside."""
        return self.prepared.get(index)

    def cacheable(self) -> Iterator[tuple[int, Prepared]]:
        """Each request still to compute whose rows a vector cache may keep (it allows caching, and its rows are
        `pooled_rows`), with its inputs."""
        for index, request in self.resolved.items():
            prepared = self.prepared.get(index)
            if request.cache and prepared is not None and request.params.task == "embed" and prepared.pooled_rows:
                yield index, prepared

    def computed(self, index: int) -> np.ndarray | list[np.ndarray] | None:
        """Request `index`'s rows from the passes; None: none (failed, answered at prepare, or set aside)."""
        return None if index in self.failed else self.rows.get(index)

    def set_aside(self, wanted: Callable[[EmbedRequest, Prepared], bool]) -> dict[int, Prepared]:
        """Take out of the passes each request for which `wanted(verified request, prepared)` holds: the caller
        answers it (`finish` leaves its result None). Returns them by request index."""
        taken: dict[int, Prepared] = {}
        for index, prepared in list(self.prepared.items()):
            if wanted(self.resolved[index], prepared):
                taken[index] = self.prepared.pop(index)
        return taken

    def passes_needed(self, shape: Shape, known: Known) -> tuple[int, int]:
        """About how many forward passes this work needs at `shape`, and its largest request alone: the rows it
        must compute (not the `known` ones) sorted by length and cut as the forward step cuts them."""
        each = {index: [len(ids) for row, ids in enumerate(prepared.token_lists) if row not in known.get(index, ())]
                for index, prepared in self.prepared.items()}
        largest = max(each.values(), key=len, default=[])
        return (_passes(sorted(n for lengths in each.values() for n in lengths), shape),
                _passes(sorted(largest), shape))


def _passes(lengths: list[int], shape: Shape) -> int:
    return sum(1 for _ in cuts(lengths, shape.tokens, shape.rows))


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
