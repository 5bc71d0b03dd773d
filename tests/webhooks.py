"""Webhooks' far end: a loopback HTTP receiver that records what the gateways POST (the `receiver` fixture,
registered for every test module by tests/conftest.py), the secret they sign with, and an SSE stream read into
its events."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    import httpx

SECRET = "webhook-s3cret"


class Receiver:
    """A loopback HTTP server that records each POST and answers with the next of `statuses` (then 200);
    `connections` counts every TCP connection it accepted, requests or not."""

    def __init__(self, statuses=()):
        self.requests: list[dict] = []
        self.statuses = list(statuses)
        self.connections = 0
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                status = receiver.statuses.pop(0) if receiver.statuses else 200
                receiver.requests.append({"headers": dict(self.headers), "body": body, "status": status,
                                          "path": self.path})
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        class Counting(ThreadingHTTPServer):
            def verify_request(self, request, client_address):
                receiver.connections += 1
                return True

        self.server = Counting(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def wait_for(self, count: int, timeout: float = 30) -> list[dict]:
        deadline = time.monotonic() + timeout
        while len(self.requests) < count:
            assert time.monotonic() < deadline, f"{len(self.requests)} of {count} webhook requests came"
            time.sleep(0.05)
        return self.requests

    def close(self):
        self.server.shutdown()


@pytest.fixture
def receiver():
    receiver = Receiver()
    yield receiver
    receiver.close()


def read_events(response: httpx.Response) -> list[tuple[str, dict]]:
    """(event name, data) of each event of an SSE response, until the stream ends."""
    events, name, data = [], None, None
    for line in response.iter_lines():
        if line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: "):
            data = json.loads(line[6:])
        elif line == "" and name is not None:
            events.append((name, data))
            name = data = None
    return events
