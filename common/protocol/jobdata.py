"""rq's `data` field of an embedfleet job: msgpack [func, instance, args, kwargs] (func: JOB_FUNC), zlib-compressed
when it is larger than COMPRESS_ABOVE bytes, inflated with a cap; and the reply stream its request names. Shared by
the producer (which writes it, and a cancel looking for the reply stream: args_reply_to) and the worker (decoding
what it took; job_reply_to for a job it answers without running).

rq compresses every job's data and reads it back either way (`Job.restore`: zlib, or the bytes as they are). A
one-text request is ~430 bytes of msgpack that zlib cuts by ~80, for a call on each side: ~6 us of the worker's
per request, and a release of the GIL in the take stage that another stage's thread may hold for the rest of
its switch interval. So small data goes as it is; larger data (64 texts: 4 KB -> 1.9 KB) is compressed."""

from __future__ import annotations

import zlib

from embedfleet.common.bounds import MAX_REQUEST_BYTES
from embedfleet.common.errors import DecodeError
from embedfleet.common.protocol import keys
from embedfleet.common.request import EmbedRequest

# The rq job's function name, which producers write and the batch worker runs in bulk: a name on the wire, kept
# as 0.1 wrote it (before its module moved to embedfleet.worker.jobs), so that producers and workers of either
# version serve each other whichever is upgraded first. A worker takes the module's own name too.
JOB_FUNC = "worker.jobs.embed"
JOB_FUNCS = (JOB_FUNC, "embedfleet.worker.jobs.embed")

# The most bytes a job's data may inflate to: the largest request a producer enqueues (MAX_REQUEST_BYTES, which
# EmbedRequest.encode enforces on every path that enqueues: Producer, AsyncProducer, the gateway, the bulk CLI,
# a worker's spread parts) plus rq's envelope around it ([func, None, [request], {}]: the function's name and a
# few msgpack headers, under 100 bytes), with room to spare. No legal request comes near it; a zlib bomb (1 KB
# inflates to ~1 MB) stops here instead of filling the reader's memory.
MAX_JOB_DATA = MAX_REQUEST_BYTES + (64 << 10)
_STEP = 1 << 20  # inflated a MiB at a time: pieces the allocator hands back to the system once freed
_MOST_RATIO = 1032  # deflate makes at most ~1032 bytes of one (zlib's FAQ); 1028 measured on zeros


COMPRESS_ABOVE = 1024  # bytes of msgpack: larger job data is written zlib-compressed (rq's own format)


def deflate(raw: bytes) -> bytes:
    """A job's `data` field from its msgpack bytes: zlib-compressed if it is larger than COMPRESS_ABOVE."""
    return zlib.compress(raw) if len(raw) > COMPRESS_ABOVE else raw


def _zlib_header(data: bytes) -> bool:
    """Whether `data` starts as a zlib stream does (RFC 1950: deflate, and the header's check bits); msgpack
    data starts with 0x94 (an array of four), which no zlib stream does."""
    return len(data) >= 2 and data[0] & 0x0F == 8 and ((data[0] << 8) | data[1]) % 31 == 0


def inflate(data: bytes, limit: int = MAX_JOB_DATA) -> bytes:
    """rq's `data` field as rq reads it (zlib-decompressed, or as it is when it is no complete zlib stream),
    never more than `limit` bytes of it: past that, DecodeError."""
    if not _zlib_header(data):  # what zlib would refuse at its first two bytes: as it is, without the call
        return data
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


def job_reply_to(job) -> str | None:
    """The reply stream named in an rq job's request, or None (no args, unreadable job data, bytes that are
    no request, or a `reply_to` outside the reply-stream key space): for every path that answers for a job
    without running it. Job data is input: any shape may arrive here."""
    try:
        args = job.args
    except Exception:  # noqa: BLE001 - rq raises DeserializationError, or anything for a corrupt hash
        return None
    return args_reply_to(args)


def args_reply_to(args) -> str | None:
    """The reply stream named by the request in an rq job's args (see job_reply_to), for a reader that
    decoded the job's data itself."""
    if not isinstance(args, (list, tuple)) or not args or not isinstance(args[0], bytes):
        return None
    try:
        reply_to = EmbedRequest.decode(args[0]).reply_to
    except DecodeError:
        return None
    return reply_to if keys.is_reply_stream_key(reply_to) else None
