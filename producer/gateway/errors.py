"""Every error the gateway answers: ONE table from error code to HTTP status, and the handlers using it.

Bodies follow OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`, so that OpenAI clients
raise their usual exceptions (openai.NotFoundError, openai.RateLimitError, ...).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from common.errors import DecodeError, EmbedfleetError, NotFoundError, invalid_request

log = logging.getLogger(__name__)


class JobNotCancellableError(EmbedfleetError):
    """DELETE on a job a worker has already taken, or that has already finished or been cancelled."""

    code = "job_not_cancellable"


class MethodNotAllowedError(EmbedfleetError):
    """A route called with a method it does not serve (GET /v1/embeddings)."""

    code = "method_not_allowed"


# code -> (HTTP status, OpenAI error type). The one place where codes become statuses.
STATUS: dict[str, tuple[int, str]] = {
    "invalid_request": (400, "invalid_request_error"),
    "input_too_long": (400, "invalid_request_error"),
    "decode_error": (400, "invalid_request_error"),
    "unauthorized": (401, "authentication_error"),
    "model_not_found": (404, "not_found_error"),
    "not_found": (404, "not_found_error"),
    "method_not_allowed": (405, "invalid_request_error"),
    "cancelled": (409, "conflict_error"),
    "job_not_cancellable": (409, "conflict_error"),
    "payload_too_large": (413, "invalid_request_error"),
    "queue_full": (429, "rate_limit_error"),
    "internal_error": (500, "server_error"),
    "startup_failed": (500, "server_error"),  # a command line failure; listed for completeness
    "no_worker": (503, "service_unavailable_error"),
    "redis_unavailable": (503, "service_unavailable_error"),
    "timeout": (504, "timeout_error"),
}
RETRY_LATER = {"queue_full", "no_worker", "redis_unavailable"}  # answered with a Retry-After header


def status_of(code: str) -> int:
    return STATUS.get(code, STATUS["internal_error"])[0]


def error_body(err: EmbedfleetError) -> dict:
    status, kind = STATUS.get(err.code, STATUS["internal_error"])
    return {"error": {"message": err.message, "type": kind, "param": err.param, "code": err.code}}


def error_response(err: EmbedfleetError, retry_after: int, on_error: Callable[[str], None]) -> JSONResponse:
    """The HTTP answer for `err`; `on_error` sees every code answered (the error metric)."""
    on_error(err.code)
    headers = {"Retry-After": str(retry_after)} if err.code in RETRY_LATER else None
    if err.code == "unauthorized":
        headers = {"WWW-Authenticate": "Bearer"}
    return JSONResponse(error_body(err), status_code=status_of(err.code), headers=headers)


def install(app: FastAPI, retry_after: int, on_error: Callable[[str], None]) -> None:
    """Route every failure through `error_response`, including FastAPI's and Starlette's own."""

    async def embedfleet_error(request: Request, exc: EmbedfleetError):
        return error_response(exc, retry_after, on_error)

    async def validation_error(request: Request, exc: RequestValidationError):
        # A body that is not JSON at all is a decode error; a JSON body that does not fit the schema is
        # 400 invalid_request, formatted as Producer.submit formats the same mistake (vLLM and OpenAI
        # answer 400 too, not FastAPI's 422).
        bad_json = [err for err in exc.errors() if err.get("type") == "json_invalid"]
        if bad_json:
            err = DecodeError(f"the body is not valid JSON: {bad_json[0].get('ctx', {}).get('error', '')}")
        else:
            err = invalid_request(exc.errors())
        return error_response(err, retry_after, on_error)

    async def http_error(request: Request, exc: StarletteHTTPException):
        if exc.status_code == 404:
            err = NotFoundError(f"no route {request.method} {request.url.path}")
        elif exc.status_code == 405:
            err = MethodNotAllowedError(f"{request.method} is not allowed on {request.url.path}")
        else:
            err = EmbedfleetError(str(exc.detail))
            err.code = next((c for c, (s, _) in STATUS.items() if s == exc.status_code), "internal_error")
        return error_response(err, retry_after, on_error)

    async def unexpected(request: Request, exc: Exception):
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return error_response(EmbedfleetError(f"internal error: {type(exc).__name__}"), retry_after, on_error)

    app.add_exception_handler(EmbedfleetError, embedfleet_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(Exception, unexpected)
