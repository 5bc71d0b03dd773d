"""Every error the gateway answers: ONE table from error code to HTTP status, and the handlers using it.

Bodies follow OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`, so that OpenAI clients
raise their usual exceptions (openai.NotFoundError, openai.RateLimitError, ...). A route that speaks another
API's dialect (TEI, Cohere, vLLM) registers its own body shape with `shape_errors`; the status and headers
still come from the one table below.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from http import HTTPStatus

import redis
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from redis.exceptions import RedisClusterException
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from embedfleet.common.errors import DecodeError, EmbedfleetError, NotFoundError, echo, invalid_request
from embedfleet.producer.client.redisfaults import unavailable

log = logging.getLogger(__name__)


class JobNotCancellableError(EmbedfleetError):
    """DELETE on a job a worker has already taken, or that has already finished or been cancelled."""

    code = "job_not_cancellable"


class MethodNotAllowedError(EmbedfleetError):
    """A route called with a method it does not serve (GET /v1/embeddings)."""

    code = "method_not_allowed"


class HeadersTooLargeError(EmbedfleetError):
    """A request whose line and headers together are longer than --max-header-bytes (answered before routing)."""

    code = "headers_too_large"


class RateLimitedError(EmbedfleetError):
    """An API key sent requests faster than its configured rate; `retry_after`: whole seconds to wait."""

    code = "rate_limited"

    def __init__(self, message: str, retry_after: int):
        super().__init__(message)
        self.retry_after = retry_after


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
    "duplicate_request": (409, "conflict_error"),
    "payload_too_large": (413, "invalid_request_error"),
    "result_too_large": (413, "invalid_request_error"),  # its result is over Redis's proto-max-bulk-len
    "headers_too_large": (431, "invalid_request_error"),
    "queue_full": (429, "rate_limit_error"),
    "internal_error": (500, "server_error"),
    "poison": (500, "server_error"),  # its workers died with it --max-deliveries times
    "startup_failed": (500, "server_error"),  # a command line failure; listed for completeness
    "no_worker": (503, "service_unavailable_error"),
    "redis_unavailable": (503, "service_unavailable_error"),
    "timeout": (504, "timeout_error"),
    "expired": (504, "timeout_error"),  # its own `deadline` / `timeout` passed while it was queued
    "rate_limited": (429, "rate_limit_error"),  # an API key over its rate (producer/gateway/core/apikeys.py)
}
RETRY_LATER = {"queue_full", "no_worker", "redis_unavailable"}  # answered with a Retry-After header


# An error body builder: (error, HTTP status, OpenAI error type) -> the JSON body a route's clients parse.
ErrorShape = Callable[[EmbedfleetError, int, str], object]
_SHAPES: dict[str, ErrorShape] = {}  # exact request path -> its dialect's shape (absent: OpenAI's)


def shape_errors(paths, shape: ErrorShape) -> None:
    """Answer errors on these exact paths with `shape`'s body (a dialect's module calls this at import)."""
    for path in paths:
        _SHAPES[path] = shape


def vllm_type(status: int) -> str:
    """vLLM's error `type`: the status's name as an exception class (400 BadRequestError, 404 NotFoundError,
    500 InternalServerError, 503 ServiceUnavailableError)."""
    name = "".join(word.capitalize() for word in HTTPStatus(status).phrase.replace("-", " ").split())
    return name if name.endswith("Error") else f"{name}Error"


def vllm_shape(err: EmbedfleetError, status: int, kind: str) -> dict:
    """vLLM's ErrorResponse: `error.type` names the status (vllm_type) and `error.code` is the status as an
    integer. An OpenAI client parses it too (the same keys); our stable code travels as `error.embedfleet_code`."""
    return {"error": {"message": err.message, "type": vllm_type(status), "param": err.param, "code": status,
                      "embedfleet_code": err.code}}


def vllm_and_cohere_shape(err: EmbedfleetError, status: int, kind: str) -> dict:
    """/v2/rerank is vLLM's and Cohere's path: vLLM's body plus Cohere's top-level `message`, so that either
    client reads its own error from one body."""
    return {**vllm_shape(err, status, kind), "message": err.message}


def status_of(code: str) -> int:
    return STATUS.get(code, STATUS["internal_error"])[0]


def error_body(err: EmbedfleetError, path: str = "") -> object:
    """The body answering `err` on `path`: the path's registered dialect, else OpenAI's shape."""
    status, kind = STATUS.get(err.code, STATUS["internal_error"])
    shape = _SHAPES.get(path)
    if shape is not None:
        return shape(err, status, kind)
    return {"error": {"message": err.message, "type": kind, "param": err.param, "code": err.code}}


def error_response(err: EmbedfleetError, retry_after: int, on_error: Callable[[str], None],
                   path: str = "") -> JSONResponse:
    """The HTTP answer for `err` on `path`; `on_error` sees every code answered (the error metric)."""
    on_error(err.code)
    headers = {"Retry-After": str(retry_after)} if err.code in RETRY_LATER else None
    if isinstance(err, RateLimitedError):
        headers = {"Retry-After": str(err.retry_after)}
    if err.code == "unauthorized":
        headers = {"WWW-Authenticate": "Bearer"}
    return AsciiJSONResponse(error_body(err, path), status_code=status_of(err.code), headers=headers)


class AsciiJSONResponse(JSONResponse):
    """JSON with every non-ASCII character escaped: a message that quotes client text (a lone surrogate
    included) can always be encoded."""

    def render(self, content) -> bytes:
        return json.dumps(content, ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode("ascii")


def install(app: FastAPI, retry_after: int, on_error: Callable[[str], None]) -> None:
    """Route every failure through `error_response`, including FastAPI's and Starlette's own."""

    async def embedfleet_error(request: Request, exc: EmbedfleetError):
        return error_response(exc, retry_after, on_error, request.url.path)

    async def validation_error(request: Request, exc: RequestValidationError):
        # A body that is not JSON at all is a decode error; a JSON body that does not fit the schema is
        # 400 invalid_request, formatted as Producer.submit formats the same mistake (vLLM and OpenAI
        # answer 400 too, not FastAPI's 422).
        bad_json = [err for err in exc.errors() if err.get("type") == "json_invalid"]
        if bad_json:
            err = DecodeError(f"the body is not valid JSON: {bad_json[0].get('ctx', {}).get('error', '')}")
        else:
            err = invalid_request(exc.errors(), *_body_fields(request))
        return error_response(err, retry_after, on_error, request.url.path)

    async def http_error(request: Request, exc: StarletteHTTPException):
        if exc.status_code == 404:
            err = NotFoundError(f"no route {request.method} {echo(request.url.path)}")
        elif exc.status_code == 405:
            err = MethodNotAllowedError(f"{request.method} is not allowed on {echo(request.url.path)}")
        else:
            err = EmbedfleetError(str(exc.detail))
            err.code = next((c for c, (s, _) in STATUS.items() if s == exc.status_code), "internal_error")
        return error_response(err, retry_after, on_error, request.url.path)

    async def redis_fault(request: Request, exc: Exception):
        # A Redis fault a route let through unsaid (the clients say theirs: producer/client/redisfaults.py): 503
        # with Retry-After as theirs, never a 500; anything else goes on to ErrorBoundary.
        err = unavailable(exc)
        if err is None:
            raise exc
        log.warning("%s %s: %s", request.method, echo(request.url.path), err.message)
        return error_response(err, retry_after, on_error, request.url.path)

    app.add_exception_handler(EmbedfleetError, embedfleet_error)
    app.add_exception_handler(redis.RedisError, redis_fault)
    app.add_exception_handler(RedisClusterException, redis_fault)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(StarletteHTTPException, http_error)


def _body_fields(request: Request) -> tuple:
    """A body model's own "did you mean" candidates (`known_fields`, the task routes' bodies), as the
    optional argument of invalid_request; empty (the embeddings fields) for every other route."""
    model = getattr(getattr(getattr(request.scope.get("route"), "body_field", None), "field_info", None),
                    "annotation", None)
    known = getattr(model, "known_fields", None)
    return (known(),) if callable(known) else ()


class ErrorBoundary:
    """Answers an unexpected exception with a 500 in the OpenAI shape and swallows it.

    Starlette's own handler for `Exception` re-raises after answering, and uvicorn then closes the
    connection: every other request pipelined or kept alive on it would fail too. Outermost, so that it
    also covers the other middleware.
    """

    def __init__(self, app: ASGIApp, retry_after: int, on_error: Callable[[str], None]):
        self.app = app
        self.retry_after = retry_after
        self.on_error = on_error

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def watch(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, watch)
        except Exception as exc:
            log.exception("unhandled error on %s %s", scope.get("method"), scope.get("path"))
            if started:  # half an answer is out: only closing the connection can tell the client
                raise
            err = EmbedfleetError(f"internal error: {type(exc).__name__}")
            await error_response(err, self.retry_after, self.on_error, scope.get("path", ""))(scope, receive, send)
