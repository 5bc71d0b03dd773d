"""Cutting length-sorted items into forward-pass batches by a padded-token budget (pure, no torch)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar

T = TypeVar("T")


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
