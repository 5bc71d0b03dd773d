"""One error root with stable string codes, shared by the producer, the worker and the gateway."""

from __future__ import annotations

import builtins
import difflib


MAX_MESSAGE = 2000  # characters an error message keeps: it is stored in result blobs and rq's failure records
RAW_PREFIX = 1024  # bytes of a bad message a DecodeError keeps for the report
MAX_ECHO = 64  # characters of a caller's id (a job, file, batch or model name, a path) that a message repeats


def clip(text: str, limit: int = MAX_MESSAGE) -> str:
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text) - limit} more characters)"


def echo(value: object) -> str:
    """A caller's id or name as an error message repeats it: whole up to MAX_ECHO characters, else its start and
    its length, so that a 5,000-character id is not sent back (and logged) in full. Not a string: its repr."""
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= MAX_ECHO else f"{text[:MAX_ECHO]}... ({len(text)} characters)"


class EmbedfleetError(Exception):
    """Root of every embedfleet error. `code` is stable; `param` names the offending field, if any. The message
    is clipped to MAX_MESSAGE characters: it may quote input, and it travels in result blobs."""

    code = "internal_error"

    def __init__(self, message: str, *, param: str | None = None):
        message = clip(message)
        super().__init__(message)
        self.message = message
        self.param = param

    def to_dict(self) -> dict:
        return {"code": self.code, "message": self.message, "param": self.param}


class ValidationError(EmbedfleetError):
    """A request field has a value the request format or the model does not allow."""

    code = "invalid_request"


class InputTooLongError(ValidationError):
    """An input has more tokens than the model accepts and no truncation was asked for."""

    code = "input_too_long"


class UnknownModelError(EmbedfleetError):
    """No live worker serves the requested model."""

    code = "model_not_found"


class DecodeError(EmbedfleetError):
    """Bytes that are not a valid message; `raw` keeps their first RAW_PREFIX bytes for the error report (the
    bytes may be megabytes, or a zlib bomb's)."""

    code = "decode_error"

    def __init__(self, message: str, raw: bytes = b"", *, param: str | None = None):
        super().__init__(message, param=param)
        self.raw = raw[:RAW_PREFIX]


class ResultTimeoutError(EmbedfleetError, builtins.TimeoutError):
    """A result did not arrive in time; also a built-in TimeoutError, so `except TimeoutError` catches it."""

    code = "timeout"


TimeoutError = ResultTimeoutError  # the name this package has always exported: the same class


class QueueFullError(EmbedfleetError):
    """The model's queue is at its configured depth limit."""

    code = "queue_full"


class NoWorkerError(EmbedfleetError):
    """The model is known but no worker serving it is alive."""

    code = "no_worker"


# What to do about a NoWorkerError (the CLI adds it where a message does not hold it already).
NO_WORKER_HINT = ("start the fleet with `make up` (or `embedfleet up`), or a worker with `embedfleet worker`; or "
                  "point at the fleet's Redis (--redis-url URL, EMBEDFLEET_REDIS_URL, Producer(redis_url=...))")


class UnavailableError(EmbedfleetError):
    """Redis cannot be reached."""

    code = "redis_unavailable"


class AuthError(EmbedfleetError):
    """Missing or wrong API key."""

    code = "unauthorized"


class PayloadTooLargeError(EmbedfleetError):
    """The request body is larger than the configured limit."""

    code = "payload_too_large"


class NotFoundError(EmbedfleetError):
    """No such request or job id (never submitted, or its result expired)."""

    code = "not_found"


class CancelledError(EmbedfleetError):
    """The request was cancelled before a worker took it."""

    code = "cancelled"


class ExpiredError(EmbedfleetError):
    """The request's deadline (`deadline` / `timeout`) passed while it was still queued: it was not computed."""

    code = "expired"


class StartupError(EmbedfleetError):
    """A command could not start what it was asked to (port taken, model missing, data dir in use)."""

    code = "startup_failed"


class DuplicateRequestError(EmbedfleetError):
    """A request id that already names a job or a result: ids are never reused."""

    code = "duplicate_request"


class InternalError(EmbedfleetError):
    """A worker failed on a request for a reason that is not the request's fault."""

    code = "internal_error"


class PoisonError(EmbedfleetError):
    """Every worker that took the request died or hung before answering, --max-deliveries times: it is
    failed rather than run again (it may crash workers)."""

    code = "poison"


class ResultTooLargeError(EmbedfleetError):
    """The request's result is larger than Redis takes in one value (its proto-max-bulk-len): it was computed
    once and cannot be stored; fewer inputs per request, a smaller `embed_dtype` or a larger limit fits it."""

    code = "result_too_large"


_BY_CODE: dict[str, type[EmbedfleetError]] = {
    cls.code: cls
    for cls in (
        ValidationError, InputTooLongError, UnknownModelError, DecodeError, TimeoutError,
        QueueFullError, NoWorkerError, UnavailableError, AuthError, PayloadTooLargeError,
        NotFoundError, CancelledError, ExpiredError, StartupError, DuplicateRequestError, InternalError, PoisonError,
        ResultTooLargeError,
    )
}


# Every field a request may carry, over HTTP or as Producer keywords: the candidates of "did you mean".
REQUEST_FIELDS = ("input", "model", "encoding_format", "user", "task", "dimensions", "use_activation",
                  "normalize", "truncate_prompt_tokens", "truncation_side", "prompt_name", "prompt",
                  "add_special_tokens", "embed_dtype", "endianness", "priority", "deadline", "timeout")
_LOCATIONS = ("body", "query", "path")  # FastAPI's first loc element: where, not which field


MAX_PROBLEMS = 20  # problems one invalid_request message lists; the rest are counted ("and N more problems")
MAX_SUGGESTIONS = 3  # unknown fields matched for "did you mean": difflib is slow, and a body may send 100,000


def invalid_request(errors: list[dict], fields: tuple[str, ...] = REQUEST_FIELDS) -> ValidationError:
    """pydantic's errors (from a model or from FastAPI) as the one ValidationError both paths raise.

    Python keywords and HTTP bodies end here alike, so the same mistake gets the same message and param.
    `fields`: the known fields an unknown one is matched against (another route's body has its own).
    One pass, so that a body of 100,000 unknown fields costs milliseconds: the first MAX_PROBLEMS distinct
    problems are listed and the rest counted, and only the first MAX_SUGGESTIONS unknown fields are matched.
    """
    listed, seen, refused, more, param = [], set(), set(), set(), None
    unmatched = False  # an unknown field got no suggestion: the known fields are listed, once, at the end
    for err in errors:
        kind, msg, where = err.get("type"), err.get("msg", ""), tuple(err.get("loc", ()))
        loc = where[1:] if where[:1] and where[0] in _LOCATIONS else where
        if kind == "extra_forbidden":
            refused.add(".".join(map(str, loc)))
        if len(listed) >= MAX_PROBLEMS:  # counted, not written: distinct (kind, place, message) triples
            more.add((kind, loc, msg))
            unmatched = unmatched or kind == "extra_forbidden"
            continue
        text = _problem(kind, msg, loc, fields, suggest=len(refused) <= MAX_SUGGESTIONS)
        unmatched = unmatched or (kind == "extra_forbidden" and "did you mean" not in text)
        if text not in seen:
            seen.add(text)
            listed.append(text)
        param = param or (str(loc[0]) if loc else None)
    if more:
        listed.append(f"and {len(more)} more problems")
    if unmatched:
        listed.append(f"known fields are {', '.join(f for f in fields if f not in refused)}")
    return ValidationError("; ".join(listed) or "invalid request", param=param)


def _problem(kind: str | None, msg: str, loc: tuple, fields: tuple[str, ...], suggest: bool) -> str:
    """One pydantic error as its part of the message."""
    field = ".".join(map(str, loc))
    text = msg.removeprefix("Value error, ")
    if kind == "extra_forbidden":
        close = _close_field(field, fields) if suggest else None
        return f"`{echo(field)}` is not a request field" + (f"; did you mean `{close}`?" if close else "")
    return f"{field}: {text}" if field and f"`{field}`" not in text else text


def _close_field(field: str, fields: tuple[str, ...]) -> str | None:
    """The known field `field` was probably meant as; never `field` itself (a field this body does not take may
    be another body's)."""
    close = difflib.get_close_matches(field, [known for known in fields if known != field], n=1)
    return close[0] if close else None


def error_from_code(code: str, message: str, param: str | None = None) -> EmbedfleetError:
    """Rebuild the error a worker reported (unknown codes become the root class)."""
    cls = _BY_CODE.get(code)
    if cls is None:
        err = EmbedfleetError(message, param=param)
        err.code = code
        return err
    return cls(message, param=param)
