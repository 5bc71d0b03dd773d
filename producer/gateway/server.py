"""How the gateway is served: uvicorn on h11, whose refusals of a request's head are the gateway's own answers.

uvicorn answers a request that h11 cannot parse with a plain-text 400 and closes the socket at once. A client
still sending (a 200 KB header: h11 gives up at --max-header-bytes) then gets a TCP reset instead of the
answer, because closing a socket with unread bytes resets it. Here the answer is the gateway's JSON error,
with h11's status (431 headers_too_large for a head over the limit, 400 otherwise), and the connection
lingers as nginx's does: our side is shut for writing and what the client still sends is read and dropped,
until it closes, LINGER_SECONDS pass or LINGER_BYTES came, so that the client reads the answer.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from functools import partial

import h11
from fastapi import FastAPI
from uvicorn.protocols.http.h11_impl import H11Protocol

from embedfleet.common.errors import EmbedfleetError, ValidationError
from embedfleet.producer.gateway.core.errors import HeadersTooLargeError, error_body, status_of
from embedfleet.producer.gateway.settings import GatewaySettings

log = logging.getLogger("uvicorn.error")

LINGER_SECONDS = 5.0  # after a refusal, the longest the rest of the request is read and dropped
LINGER_BYTES = 1024 * 1024  # ... and the most bytes of it


def options(app: FastAPI, settings: GatewaySettings) -> dict:
    """uvicorn's options (uvicorn.run's, uvicorn.Config's) serving `app`, create_app's, as `embedfleet gateway`."""
    return {"host": settings.host, "port": settings.port, "log_level": settings.log_level,
            "access_log": settings.access_log,
            "http": partial(GatewayProtocol, on_error=app.state.metrics.error),
            "h11_max_incomplete_event_size": settings.max_header_bytes}


class _Connection(h11.Connection):
    """h11's connection, keeping the error it raised on the client's bytes (uvicorn's handler drops it), and
    holding every request head to the limit, however it arrived.

    h11 applies max_incomplete_event_size only to a head still incomplete in its buffer: a 70 KB head that came
    in one read was parsed whole and served. Here the bytes a Request event took are measured too, and over the
    limit it is refused as h11 refuses one that arrives in pieces (431).
    """

    refused: h11.RemoteProtocolError | None = None

    def next_event(self):
        before = len(self._receive_buffer)  # h11's own buffer (private; tests/e2e/test_hostile_bodies.py pins it)
        try:
            event = super().next_event()
        except h11.RemoteProtocolError as exc:
            self.refused = exc
            raise
        if isinstance(event, h11.Request) and before - len(self._receive_buffer) > self._max_incomplete_event_size:
            self.refused = h11.RemoteProtocolError("request head too long", error_status_hint=431)
            self._process_error(self.their_role)  # as h11 does for its own errors: the request is not served
            raise self.refused
        return event


class GatewayProtocol(H11Protocol):
    """uvicorn's h11 protocol, refusing an unreadable request head as described in the module docstring."""

    def __init__(self, *args, on_error: Callable[[str], None], **kwargs):
        super().__init__(*args, **kwargs)
        self.conn = _Connection(h11.SERVER, self.config.h11_max_incomplete_event_size)
        self.on_error = on_error
        self.lingering: asyncio.TimerHandle | None = None
        self.dropped = 0

    def send_400_response(self, msg: str) -> None:  # uvicorn calls it for every h11.RemoteProtocolError
        err = self._refusal()
        self.on_error(err.code)
        log.info("refused a request from %s: %s", self.client and self.client[0], err.message)
        body = json.dumps(error_body(err), ensure_ascii=True, separators=(",", ":")).encode("ascii")
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                   (b"connection", b"close")]
        try:
            for event in (h11.Response(status_code=status_of(err.code), headers=headers), h11.Data(data=body),
                          h11.EndOfMessage()):
                self.transport.write(self.conn.send(event))
        except h11.LocalProtocolError:  # an answer to this request had already begun: closing is all we can do
            self.transport.close()
            return
        self._linger()

    def _refusal(self) -> EmbedfleetError:
        exc = self.conn.refused
        limit = self.config.h11_max_incomplete_event_size
        if exc is not None and exc.error_status_hint == 431:
            return HeadersTooLargeError(f"the request line and headers are longer than {limit} bytes, the limit "
                                        "(send smaller headers, or start the gateway with a larger "
                                        "--max-header-bytes)")
        return ValidationError(f"the request is not valid HTTP/1.1 ({exc or 'unreadable'})")

    def _linger(self) -> None:
        if not self.transport.can_write_eof():
            self.transport.close()
            return
        self.transport.write_eof()
        self.lingering = self.loop.call_later(LINGER_SECONDS, self.transport.close)

    def data_received(self, data: bytes) -> None:
        if self.lingering is None:
            super().data_received(data)
            return
        self.dropped += len(data)
        if self.dropped > LINGER_BYTES:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.lingering is not None:
            self.lingering.cancel()
        super().connection_lost(exc)
