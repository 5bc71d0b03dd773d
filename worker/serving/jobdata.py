"""Reading a taken job's data: rq's `data` field (zlib of msgpack [func, instance, args, kwargs]) into an
EmbedRequest, without building rq Job objects. The bytes came from Redis, so every shape is checked, the
decompression is capped, and no error message quotes more than a few characters of them."""

from __future__ import annotations

import reprlib

from embedfleet.common.codec import unpackb
from embedfleet.common.errors import DecodeError, ValidationError
from embedfleet.common.protocol.jobdata import JOB_FUNC, JOB_FUNCS, inflate
from embedfleet.common.request import EmbedRequest

_QUOTED = 80  # characters of job data an error message may quote


class _Quote(reprlib.Repr):
    """reprlib's bounded repr, bytes included (reprlib would repr them whole before cutting)."""

    def repr_bytes(self, x, level):
        return self.repr_str(x, level)  # slices, then reprs the slice


_QUOTE = _Quote()
_QUOTE.maxstring = _QUOTE.maxother = _QUOTED
_QUOTE.maxlist = _QUOTE.maxdict = 6
_QUOTE.maxlevel = 2


def quoted(value) -> str:
    """A value read from job data, as an error message may quote it: a repr of at most ~`_QUOTED` characters
    per item, built from a slice (the data may be megabytes)."""
    return _QUOTE.repr(value)


def decode_job(job_id: str, data: bytes, served_model: str) -> EmbedRequest:
    """The request a job carries. Raises DecodeError (bad bytes or shape: never retried) or ValidationError
    (a well-formed request for another model, put on this model's queue)."""
    raw = inflate(data)
    try:
        fields = unpackb(raw)
    except Exception as exc:  # msgpack's exceptions carry the data (ExtraData): their message only
        raise DecodeError(f"job data is not msgpack rq job data: {type(exc).__name__}: {quoted(str(exc))}",
                          bytes(data)) from exc
    if not isinstance(fields, list) or len(fields) != 4:
        raise DecodeError(f"job data must be [func, instance, args, kwargs]; got {type(fields).__name__}"
                          f"{f' of {len(fields)} items' if isinstance(fields, list) else ''}", bytes(data))
    func, _, args, kwargs = fields
    if func not in JOB_FUNCS:
        raise DecodeError(f"job function is {quoted(func)}; this queue only serves {JOB_FUNC!r}", bytes(data))
    if kwargs or not isinstance(args, list) or len(args) != 1 or not isinstance(args[0], bytes):
        count = len(args) if isinstance(args, list) else "?"
        raise DecodeError(f"job args must be [<encoded EmbedRequest bytes>] and no kwargs; got "
                          f"{type(args).__name__} of {count} item(s) and kwargs {quoted(kwargs)}", bytes(data))
    request = EmbedRequest.decode(args[0])
    if request.id != job_id:
        raise DecodeError(f"request id {request.id!r} does not match its job id {job_id!r}", bytes(data))
    if request.model != served_model:
        raise ValidationError(f"the request names model {quoted(request.model)} but was queued for model "
                              f"'{served_model}': submit it to the queue of {quoted(request.model)}", param="model")
    return request
