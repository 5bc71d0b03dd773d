"""The request body limits: its bytes, enforced on Content-Length AND on the bytes actually read, and its JSON keys.

A client can lie in Content-Length or send a chunked body without one, so the body is read here, up to
the limit, before any route sees it; the route then reads the buffered copy. Bodies are JSON that the
route must read whole anyway, so buffering costs nothing extra. An upload (a path in `paths`) is the
exception: its route streams it into Redis, so its bytes are only counted here as the route reads them.

The keys limit: vLLM (pydantic) and TEI (serde) bound a body by its bytes only, and so did we, but FastAPI and
pydantic validate on the event loop and build one error object per unknown field: 1.5 MB of `{"k1":1,...}`
(100,000 keys) held the loop for minutes, /health included. A body is therefore also refused with 413 when its
objects hold more than `max_keys` keys in all, counted here before any validation (json_keys_over: exact, and
bounded by the limit rather than by the body's size).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from json.decoder import scanstring

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from embedfleet.common.errors import PayloadTooLargeError


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, max_bytes: int, reject: Callable[[PayloadTooLargeError, str], object],
                 paths: dict[str, int] | None = None, max_keys: int | None = None):
        self.app = app
        self.max_bytes = max_bytes
        self.max_keys = max_keys  # JSON object keys a body may hold in all (None: no limit)
        self.reject = reject  # builds the error answer (an ASGI app), so that the error table decides
        self.paths = paths or {}  # exact path -> its own limit (a file upload's is larger than a request's)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "DELETE", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        limit = self.paths.get(scope.get("path", ""), self.max_bytes)
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            await self._too_large(scope, receive, send, f"{declared} bytes declared in Content-Length", limit)
            return
        if scope.get("path", "") in self.paths:  # an upload: streamed by its route, never held here whole
            await self.app(scope, self._counted(receive, limit), send)
            return
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                await self._too_large(scope, receive, send, f"more than {limit} bytes sent", limit)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        if self.max_keys is not None and json_keys_over(body, self.max_keys):
            await self.reject(too_many_keys(self.max_keys), scope.get("path", ""))(scope, receive, send)
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # later calls wait for the disconnect, as with the real receive

        await self.app(scope, replay, send)

    @staticmethod
    def _counted(receive: Receive, limit: int) -> Receive:
        """`receive`, raising 413's error once more than `limit` bytes came (the route's reading stops)."""
        size = 0

        async def counted() -> Message:
            nonlocal size
            message = await receive()
            size += len(message.get("body", b""))
            if size > limit:
                raise PayloadTooLargeError(f"request body too large: more than {limit} bytes sent; the limit is "
                                           f"{limit} bytes (send a smaller file)")
            return message

        return counted

    async def _too_large(self, scope: Scope, receive: Receive, send: Send, what: str, limit: int) -> None:
        hint = "a smaller file" if scope.get("path", "") in self.paths else "fewer or shorter inputs per request"
        err = PayloadTooLargeError(f"request body too large: {what}; the limit is {limit} bytes (send {hint})")
        await self.reject(err, scope.get("path", ""))(scope, receive, send)


def too_many_keys(limit: int, param: str | None = None) -> PayloadTooLargeError:
    """The 413 of a body whose JSON objects hold more than `limit` keys in all: a route's, or a batch line's
    (batches/lines.py, `param` "body"), in the same words."""
    return PayloadTooLargeError(f"request body too large: its JSON objects hold more than {limit} keys in all; the "
                                f"limit is {limit} keys (send only the request's fields, and fewer inputs per request)",
                                param=param)


_SPACE = re.compile(r"[ \t\n\r]*")  # JSON's whitespace


def json_keys_over(body: bytes, limit: int) -> bool:
    """Whether the JSON in `body` has more than `limit` object keys in all (False for a body that is not JSON: its
    route answers that). Two byte counts unless the body has more than `limit` colons and 2 x `limit` quotes, as
    every key has one and two; then its strings are walked (each read by json's C scanner) up to the key past
    `limit`, so that a refusal costs about the same whatever the body's size."""
    if min(body.count(b":"), body.count(b'"') // 2) <= limit:  # bytes of UTF-16 and -32 bodies bound them too
        return False
    try:
        text = body.decode(json.detect_encoding(body), "surrogatepass")  # as json.loads reads bytes
    except UnicodeDecodeError:
        return False
    count, at = 0, text.find('"')
    while at >= 0:  # outside the strings of JSON there is no quote: each one found opens a string
        try:
            _, at = scanstring(text, at + 1)
        except ValueError:  # an unclosed string, a control character: not JSON
            return False
        at = _SPACE.match(text, at).end()
        if text.startswith(":", at):  # a string followed by a colon is a key
            count += 1
            if count > limit:
                return True
        at = text.find('"', at)
    return False


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None
