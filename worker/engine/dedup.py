"""In-round dedup: inputs that are the same to the model (same token ids, same prompt length) run once.

Pure: positions in, a plan out; the engine computes `runs` and copies each vector to its duplicates.
"""

from __future__ import annotations

from collections.abc import Container, Hashable, Sequence
from dataclasses import dataclass, field

import numpy as np


@dataclass
class Plan:
    """runs: the positions to compute (the first of each distinct input, ascending); copies: duplicate
    position -> the run position whose vector it takes."""

    runs: np.ndarray
    copies: dict[int, int] = field(default_factory=dict)

    def sharers(self) -> dict[int, list[int]]:
        """Run position -> the duplicate positions that take its vector (only runs that have some)."""
        shared: dict[int, list[int]] = {}
        for copy, source in self.copies.items():
            shared.setdefault(source, []).append(copy)
        return shared


def plan(token_lists: Sequence[Sequence[int]], prompt_lengths: Sequence[int],
         known: Container[int] = (), kinds: Sequence[Hashable] | None = None) -> Plan:
    """Each distinct (prompt length, kind, token ids) once; positions in `known` (vectors already at hand,
    e.g. from the cache) are neither computed nor used as a source. `kinds`: what else makes two rows
    different to the model (the engine's head and a pair's split), None when nothing does."""
    first: dict[tuple, int] = {}
    runs: list[int] = []
    copies: dict[int, int] = {}
    for position, (ids, prompt_length) in enumerate(zip(token_lists, prompt_lengths)):
        if position in known:
            continue
        kind = None if kinds is None else kinds[position]
        source = first.setdefault((prompt_length, kind, tuple(ids)), position)
        if source == position:
            runs.append(position)
        else:
            copies[position] = source
    return Plan(np.asarray(runs, dtype=np.int64), copies)
