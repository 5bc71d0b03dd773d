"""How many results one MGET of a WaitHub (producer/client/waiters.py) asks for.

One MGET asks for about READ_BYTES of results (by the size of the results this hub has read so far): Redis
builds a reply in its memory before it sends it, and a reply of many large results costs it twice as much per
byte as a few at a time (docs/capacity.md, "Large results are read a few at a time"); one small MGET round trip
more per read of large results, and the first results land before the last are read.
"""

from __future__ import annotations

READ_CHUNK = 1000  # keys per MGET at most
READ_BYTES = 512 * 1024  # result bytes one MGET asks for, about (by the results read so far)
FIRST_READ = 4  # keys of an MGET before any result was read here (its size not known yet)


def read_size(result_bytes: float | None, first: bool) -> int:
    """Keys for the next MGET of a read: about READ_BYTES of results of `result_bytes` each. Before any result
    was read, FIRST_READ for a read's first MGET, and the rest of it at once when that found none (first looks
    at waits just begun: their results are mostly not there yet)."""
    if result_bytes is None:
        return FIRST_READ if first else READ_CHUNK
    return max(1, min(READ_CHUNK, int(READ_BYTES // max(result_bytes, 1.0))))


def result_bytes(previous: float | None, blobs: list) -> float | None:
    """The size of a result, smoothed over MGET replies (the mean of each reply's results)."""
    sizes = [len(blob) for blob in blobs if blob is not None]
    if not sizes:
        return previous
    mean = sum(sizes) / len(sizes)
    return mean if previous is None else (previous + mean) / 2
