"""The batcher is a pure function: property tests over random length lists, no torch, no Redis."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from embedfleet.worker.engine.batcher import batches, next_batch

lengths_lists = st.lists(st.integers(1, 600), max_size=200).map(sorted)
budgets = st.integers(1, 4096)
counts = st.integers(1, 64)


def _cost(batch):
    return len(batch) * max(batch)


@settings(max_examples=300, deadline=None)
@given(lengths_lists, budgets, counts)
def test_every_item_once_in_order_and_within_budget(lengths, max_tokens, max_count):
    items = list(enumerate(lengths))  # (original position, length): identity survives duplicates
    out = list(batches(items, max_tokens, max_count, length=lambda item: item[1]))
    assert [item for batch in out for item in batch] == items  # each exactly once, order kept
    for batch in out:
        assert 1 <= len(batch) <= max_count
        if len(batch) > 1:  # only a lone item may exceed the budget (it is larger than the budget)
            assert _cost([length for _, length in batch]) <= max_tokens


@settings(max_examples=300, deadline=None)
@given(lengths_lists.filter(bool), budgets, counts)
def test_next_batch_takes_the_longest_fitting_prefix(lengths, max_tokens, max_count):
    batch, rest = next_batch(lengths, max_tokens, max_count)
    assert batch + rest == lengths and batch
    if rest and len(batch) < max_count:  # one more item would break the token budget
        assert (len(batch) + 1) * max(batch + rest[:1]) > max_tokens


def test_oversize_item_goes_alone_and_does_not_block():
    batch, rest = next_batch([5000, 5000, 6000], max_tokens=1000, max_count=8)
    assert batch == [5000] and rest == [5000, 6000]


def test_padded_cost_counts_the_longest_row():
    assert next_batch([10, 10, 10, 40], max_tokens=80, max_count=8) == ([10, 10, 10], [40])
    assert next_batch([1, 1, 1, 1], max_tokens=100, max_count=3) == ([1, 1, 1], [1])


def test_unsorted_input_still_respects_the_budget():
    batch, rest = next_batch([40, 10, 10], max_tokens=80, max_count=8)
    assert batch == [40, 10] and rest == [10]


def test_empty_input():
    assert next_batch([], 100, 4) == ([], [])
    assert list(batches([], 100, 4)) == []
