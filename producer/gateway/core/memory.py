"""Memory freed after a large request goes back to the operating system.

A 7 MB body becomes the body's bytes, the parsed JSON, a msgpack job and, for 2,000 inputs, a JSON answer of
2,000 vectors: tens of MB that are all freed when the answer is out. glibc's malloc keeps freed memory for
reuse instead of returning it (a freed large block also raises its mmap threshold, so that the next ones come
from the heap, where a few live objects pin the pages around them). Measured on a real gateway process: two
refused 7 MB bodies left +21 to +33 MB of RSS that no Python object held, four answered ones +44 MB, and
`malloc_trim(0)` gave the refused ones' back whole in a few milliseconds. So after a request that moved at
least TRIM_AFTER bytes in or out, the heap is trimmed; small requests never pay for it. The trim waits
TRIM_DELAY: the answer's bytes are still in the socket's write buffer when the app is done with them, and
the large requests of a burst share one trim. Without glibc's `malloc_trim` (musl, macOS) nothing is done.
"""

from __future__ import annotations

import asyncio
import ctypes
from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

TRIM_AFTER = 1024 * 1024  # bytes of request and response body from which the heap is trimmed afterwards
TRIM_DELAY = 1.0  # seconds from the end of a large request to the trim


def _malloc_trim() -> Callable[[], object]:
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (AttributeError, OSError):  # not glibc
        return lambda: None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return lambda: trim(0)


release = _malloc_trim()  # give the heap's free pages back to the OS (a no-op without glibc)


class ReleaseMemory:
    """ASGI middleware: counts each request's body bytes in and out and trims the heap after a large one.
    Outermost, so that everything the request allocated inside it is already freed when it trims."""

    def __init__(self, app: ASGIApp, threshold: int = TRIM_AFTER, delay: float = TRIM_DELAY):
        self.app = app
        self.threshold = threshold
        self.delay = delay
        self.pending: asyncio.TimerHandle | None = None  # the trim to come; one at a time

    def _trim(self) -> None:
        self.pending = None
        release()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        moved = 0

        async def counted_receive() -> Message:
            nonlocal moved
            message = await receive()
            moved += len(message.get("body", b""))
            return message

        async def counted_send(message: Message) -> None:
            nonlocal moved
            moved += len(message.get("body", b""))
            await send(message)

        try:
            await self.app(scope, counted_receive, counted_send)
        finally:
            if moved >= self.threshold and self.pending is None:
                self.pending = asyncio.get_running_loop().call_later(self.delay, self._trim)
