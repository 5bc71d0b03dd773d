"""rq's `data` field of an embedfleet job: zlib of msgpack [func, instance, args, kwargs], inflated with a cap.
Shared by the worker (decoding what it took) and the producer (a cancel looking for the reply stream)."""

from __future__ import annotations

import zlib

from common.bounds import MAX_REQUEST_BYTES
from common.errors import DecodeError

# The most bytes a job's data may inflate to: the largest request a producer enqueues (MAX_REQUEST_BYTES, which
# EmbedRequest.encode enforces on every path that enqueues: Producer, AsyncProducer, the gateway, the bulk CLI,
# a worker's spread parts) plus rq's envelope around it ([func, None, [request], {}]: the function's name and a
# few msgpack headers, under 100 bytes), with room to spare. No legal request comes near it; a zlib bomb (1 KB
# inflates to ~1 MB) stops here instead of filling the reader's memory.
MAX_JOB_DATA = MAX_REQUEST_BYTES + (64 << 10)
_STEP = 1 << 20  # inflated a MiB at a time: pieces the allocator hands back to the system once freed
_MOST_RATIO = 1032  # deflate makes at most ~1032 bytes of one (zlib's FAQ); 1028 measured on zeros


def inflate(data: bytes, limit: int = MAX_JOB_DATA) -> bytes:
    """rq's `data` field as rq reads it (zlib-decompressed, or as it is when it is no complete zlib stream),
    never more than `limit` bytes of it: past that, DecodeError."""
    if len(data) * _MOST_RATIO <= limit:  # it cannot inflate past the limit: one call (a request's usual case)
        try:
            return zlib.decompress(data)
        except zlib.error:  # not zlib, or an incomplete stream: as it is, as below
            return data
    inflater = zlib.decompressobj()
    pieces, size, pending = [], 0, data
    try:
        while True:
            piece = inflater.decompress(pending, _STEP)
            size += len(piece)
            if size > limit:
                raise DecodeError(f"job data inflates to more than {limit} bytes, more than any request may be "
                                  f"({MAX_REQUEST_BYTES} bytes encoded); {len(data)} bytes compressed", bytes(data))
            pieces.append(piece)
            pending = inflater.unconsumed_tail
            if inflater.eof or (not pending and len(piece) < _STEP):
                break
    except zlib.error:
        return data  # rq reads uncompressed data too
    return b"".join(pieces) if inflater.eof else data  # an incomplete stream: rq's zlib.decompress fails too
