"""How a round's inputs become forward passes, in one place (pure: no torch, no Redis).

    1. dedup   inputs that are the same to the model (same token ids, prompt length, head and pair split)
               run once; positions whose vectors are already at hand (the vector cache) do not run at all
    2. sort    by head (a pass never mixes heads: each runs its own forward), then by length: padding is
               lowest when neighbours are alike
    3. cut     into passes by a padded-token budget (rows * longest row) and a row limit; the first row of a
               pass is always taken, so an input longer than the whole budget runs alone instead of blocking

`plan_passes` does all three for the engine; `cuts`, `next_batch` and `batches` are the cutting alone.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Hashable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np

T = TypeVar("T")


@dataclass
class PassPlan:
    """passes: the flat positions each forward pass computes, in order; copies: duplicate position -> the
    computed position whose vector it takes (`sharers` gives the reverse, when a failure needs it)."""

    passes: list[np.ndarray] = field(default_factory=list)
    copies: dict[int, int] = field(default_factory=dict)


def sharers(copies: dict[int, int]) -> dict[int, list[int]]:
    """Computed position -> its duplicates: `copies` reversed."""
    found: dict[int, list[int]] = {}
    for copy, source in copies.items():
        found.setdefault(source, []).append(copy)
    return found


def plan_passes(token_lists: Sequence[Sequence[int]], prompt_lengths: Sequence[int], kinds: Sequence[Hashable],
                known: Container[int], max_tokens: int, max_count: int) -> PassPlan:
    """The forward passes for a round's flat inputs. `kinds[p]`: what else makes two rows different to the
    model, whose first element is the head ("pool" rows run first); `known`: positions already at hand."""
    runs, copies = _distinct(token_lists, prompt_lengths, kinds, known)
    plan = PassPlan(copies=copies)
    if not runs:
        return plan
    lengths = np.fromiter((len(token_lists[p]) for p in runs), np.int64, len(runs))
    other_head = np.asarray([kinds[p][0] != "pool" for p in runs], dtype=bool)
    order = np.asarray(runs, dtype=np.int64)[np.lexsort((lengths, other_head))]
    sorted_lengths = [len(token_lists[p]) for p in order]
    heads = [kinds[p][0] for p in order]
    begin = 0
    for head_end in [i for i in range(1, len(heads)) if heads[i] != heads[i - 1]] + [len(heads)]:
        for start, end in cuts(sorted_lengths[begin:head_end], max_tokens, max_count):
            plan.passes.append(order[begin + start:begin + end])
        begin = head_end
    return plan


def _distinct(token_lists, prompt_lengths, kinds, known) -> tuple[list[int], dict[int, int]]:
    """The positions to compute (the first of each distinct input, ascending) and each duplicate's source."""
    first: dict[tuple, int] = {}
    runs: list[int] = []
    copies: dict[int, int] = {}
    for position, (ids, prompt_length) in enumerate(zip(token_lists, prompt_lengths)):
        if position in known:
            continue
        source = first.setdefault((prompt_length, kinds[position], tuple(ids)), position)
        if source == position:
            runs.append(position)
        else:
            copies[position] = source
    return runs, copies


# -- cutting by the budget ----------------------------------------------------------------------------

def _identity(item):
    return item


def _fit(items: Sequence[T], start: int, max_tokens: int, max_count: int,
         length: Callable[[T], int]) -> int:
    """End index of the longest run from `start` whose padded cost fits (at least one item)."""
    if max_count < 1:
        raise ValueError(f"max_count must be at least 1, got {max_count}")
    longest = 0
    end = start
    while end < len(items) and end - start < max_count:
        candidate = max(longest, length(items[end]))
        if end > start and (end - start + 1) * candidate > max_tokens:
            break
        longest = candidate
        end += 1
    return end


def next_batch(items: Sequence[T], max_tokens: int, max_count: int,
               length: Callable[[T], int] = _identity) -> tuple[list[T], list[T]]:
    """Take the longest prefix of `items` that fits the budget; return (batch, leftovers).

    `items` should be sorted by length (ascending keeps padding lowest); `length(item)` gives an item's
    token count (default: the items are the lengths themselves). A batch costs `count * longest` padded
    tokens and must stay within `max_tokens` and `max_count` rows. The first item is always taken, so an
    item longer than the whole budget goes alone instead of blocking the queue. Order is kept.
    """
    end = _fit(items, 0, max_tokens, max_count, length)
    return list(items[:end]), list(items[end:])


def cuts(items: Sequence[T], max_tokens: int, max_count: int,
         length: Callable[[T], int] = _identity) -> Iterator[tuple[int, int]]:
    """(start, end) of each batch of `items` in order, each cut as `next_batch` cuts."""
    start = 0
    while start < len(items):
        end = _fit(items, start, max_tokens, max_count, length)
        yield start, end
        start = end


def batches(items: Sequence[T], max_tokens: int, max_count: int,
            length: Callable[[T], int] = _identity) -> Iterator[list[T]]:
    """All batches of `items` in order, each cut as `next_batch` cuts (without re-copying leftovers)."""
    for start, end in cuts(items, max_tokens, max_count, length):
        yield list(items[start:end])
