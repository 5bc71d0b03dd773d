"""One error root with stable string codes, shared by the producer, the worker and the gateway."""

from __future__ import annotations


class EmbedfleetError(Exception):
    """Root of every embedfleet error. `code` is stable; `param` names the offending field, if any."""

    code = "internal_error"

    def __init__(self, message: str, *, param: str | None = None):
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
    """Bytes that are not a valid message; `raw` keeps them for the error report."""

    code = "decode_error"

    def __init__(self, message: str, raw: bytes = b"", *, param: str | None = None):
        super().__init__(message, param=param)
        self.raw = raw


class TimeoutError(EmbedfleetError):  # noqa: A001 - deliberately our own, derives from the root
    """A result did not arrive in time."""

    code = "timeout"


class QueueFullError(EmbedfleetError):
    """The model's queue is at its configured depth limit."""

    code = "queue_full"


class NoWorkerError(EmbedfleetError):
    """The model is known but no worker serving it is alive."""

    code = "no_worker"


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


class DuplicateRequestError(EmbedfleetError):
    """A request id that already names a job or a result: ids are never reused."""

    code = "duplicate_request"


class InternalError(EmbedfleetError):
    """A worker failed on a request for a reason that is not the request's fault."""

    code = "internal_error"


_BY_CODE: dict[str, type[EmbedfleetError]] = {
    cls.code: cls
    for cls in (
        ValidationError, InputTooLongError, UnknownModelError, DecodeError, TimeoutError,
        QueueFullError, NoWorkerError, UnavailableError, AuthError, PayloadTooLargeError,
        NotFoundError, CancelledError, DuplicateRequestError, InternalError,
    )
}


def pydantic_message(exc: Exception) -> str:
    """A pydantic ValidationError as one sentence per field ("field: what is wrong"); others as str()."""
    errors = getattr(exc, "errors", None)
    if not callable(errors):
        return str(exc)
    return "; ".join(f"{'.'.join(map(str, err.get('loc', ()))) or 'request'}: "
                     f"{err.get('msg', '').removeprefix('Value error, ')}" for err in errors())


def error_from_code(code: str, message: str, param: str | None = None) -> EmbedfleetError:
    """Rebuild the error a worker reported (unknown codes become the root class)."""
    cls = _BY_CODE.get(code)
    if cls is None:
        err = EmbedfleetError(message, param=param)
        err.code = code
        return err
    return cls(message, param=param)
