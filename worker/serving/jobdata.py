"""Reading a taken job's data: rq's `data` field (zlib of msgpack [func, instance, args, kwargs]) into an
EmbedRequest, without building rq Job objects. The bytes came from Redis, so every shape is checked."""

from __future__ import annotations

import zlib

from common.codec import unpackb
from common.errors import DecodeError, ValidationError
from common.protocol.keys import JOB_FUNC
from common.request import EmbedRequest


def decode_job(job_id: str, data: bytes, served_model: str) -> EmbedRequest:
    """The request a job carries. Raises DecodeError (bad bytes or shape: never retried) or ValidationError
    (a well-formed request for another model, put on this model's queue)."""
    try:
        raw = zlib.decompress(data)
    except zlib.error:
        raw = data  # rq reads uncompressed data too
    try:
        fields = unpackb(raw)
    except Exception as exc:
        raise DecodeError(f"job data is not msgpack rq job data: {exc!r}", bytes(data)) from exc
    if not isinstance(fields, list) or len(fields) != 4:
        raise DecodeError(f"job data must be [func, instance, args, kwargs]; got {type(fields).__name__}"
                          f"{f' of {len(fields)} items' if isinstance(fields, list) else ''}", bytes(data))
    func, _, args, kwargs = fields
    if func != JOB_FUNC:
        raise DecodeError(f"job function is {func!r}; this queue only serves {JOB_FUNC!r}", bytes(data))
    if kwargs or not isinstance(args, list) or len(args) != 1 or not isinstance(args[0], bytes):
        count = len(args) if isinstance(args, list) else "?"
        raise DecodeError(f"job args must be [<encoded EmbedRequest bytes>] and no kwargs; got "
                          f"{type(args).__name__} of {count} item(s) and kwargs "
                          f"{sorted(kwargs) if isinstance(kwargs, dict) else kwargs!r}", bytes(data))
    request = EmbedRequest.decode(args[0])
    if request.id != job_id:
        raise DecodeError(f"request id {request.id!r} does not match its job id {job_id!r}", bytes(data))
    if request.model != served_model:
        raise ValidationError(f"the request names model '{request.model}' but was queued for model "
                              f"'{served_model}': submit it to the queue of '{request.model}'", param="model")
    return request
