"""Hostile bodies (issue 49, item 1): seconds to answer a POST /v1/embeddings of N unknown keys (or, with --list,
a POST to each of LIST_BODIES' routes of a list of N wrongly typed items), and the worst /health latency meanwhile,
on a real gateway process (no worker: the body is refused before one is asked).

    PYTHONPATH=. .venv/bin/python bench/hostilebody.py [--sizes 16000,20000,50000,100000,200000]
        [--list] [--before TREE] [--give-up 120]

"seconds" runs from the last byte of the body sent to the whole answer; "worst /health" is the slowest of the
back-to-back GET /health answers (one kept-alive connection, another thread) that overlapped that span. With
--before TREE (a checkout of the code before the change, e.g. `git archive HEAD | tar -x -C TREE`), its gateway is
measured too, in the same run; a size that takes it longer than --give-up seconds ends its column (it still
holds its event loop: the gateway is stopped).
"""

from __future__ import annotations

import argparse
import http.client
import json
import socket
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, describe_machine, start_from, table, wait_http

from embedfleet.common.redisserver import RedisServer, free_port


class HealthPoller(threading.Thread):
    """GET /health back to back: (start, seconds) of every answer."""

    def __init__(self, port: int):
        super().__init__(daemon=True)
        self.port, self.answers, self.stop = port, [], threading.Event()
        self.waiting_since: float | None = None  # the start of the request now unanswered

    def run(self) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=3600)
        try:
            while not self.stop.is_set():
                self.waiting_since = began = time.monotonic()
                conn.request("GET", "/health")
                conn.getresponse().read()
                self.answers.append((began, time.monotonic() - began))
                self.waiting_since = None
        except (OSError, http.client.HTTPException):  # the gateway was stopped (one that gave up is stopped stuck)
            if not self.stop.is_set():
                raise
        finally:
            conn.close()

    def worst(self, start: float, end: float) -> float:
        """The slowest answer overlapping [start, end]; one still unanswered counts as waiting until now."""
        found = [seconds for began, seconds in self.answers if began < end and began + seconds > start]
        waiting = self.waiting_since
        return max([*found, time.monotonic() - waiting if waiting is not None else 0.0])


# route -> a body whose list holds `n` items of the wrong type (the first text aside): under the byte and key
# limits at 1,000,000 items (2-4 MB), it had pydantic and FastAPI build one error object per item
LIST_BODIES = {
    "/score": lambda n: {"model": "m", "text_1": "a", "text_2": [1] * n},
    "/v1/embeddings": lambda n: {"model": "m", "input": ["a"] + [1] * n},
    "/rerank": lambda n: {"model": "m", "query": "q", "documents": [1] * n},
    "/classify": lambda n: {"model": "m", "input": ["a"] + [1] * n},
    "/detokenize": lambda n: {"model": "m", "tokens": ["x"] * n},
    "/decode": lambda n: {"model": "m", "ids": ["x"] * n},
    "/v2/embed": lambda n: {"model": "m", "texts": [1] * n},
    "/similarity": lambda n: {"inputs": {"source_sentence": "a", "sentences": [1] * n}},
    "/pooling": lambda n: {"model": "m", "input": "a", "outputs": [1] * n},
}


def body(path: str, size: int, as_list: bool) -> bytes:
    """The request of one case: `size` unknown keys on `path`, or `size` list items with `as_list`."""
    if as_list:
        return request(path, json.dumps(LIST_BODIES[path](size), separators=(",", ":")).encode())
    return request(path, ("{" + ",".join(f'"k{i}":0' for i in range(size)) + "}").encode())


def request(path: str, data: bytes) -> bytes:
    return (b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\nConnection: close\r\n\r\n" % (path.encode(), len(data))) + data


def send(port: int, request: bytes, give_up: float) -> tuple[int | None, float, float]:
    """(status or None past `give_up`, seconds from the upload's end to the answer, when the upload ended)."""
    with socket.create_connection(("127.0.0.1", port), timeout=give_up) as sock:
        sock.sendall(request)
        sent = time.monotonic()
        answer = b""
        try:
            while chunk := sock.recv(65536):
                answer += chunk
        except TimeoutError:
            return None, time.monotonic() - sent, sent
    return int(answer.split(b" ", 2)[1]), time.monotonic() - sent, sent


def measure(tree: Path, redis_url: str, cases: list[tuple[str, int]], as_list: bool, give_up: float) -> dict:
    """(path, size) -> (body MB, status or None, seconds, worst /health seconds) for each of `cases`."""
    port = free_port()
    gateway = start_from(tree, "producer.gateway", ["--redis-url", redis_url, "--port", str(port),
                                                     "--log-level", "warning"], f"gateway-{tree.name}")
    found, poller = {}, None
    try:
        wait_http(gateway, f"http://127.0.0.1:{port}/health", 60, any_status=True)
        poller = HealthPoller(port)
        poller.start()
        for case in cases:
            data = body(*case, as_list)
            status, seconds, sent = send(port, data, give_up)
            found[case] = (len(data) / 1e6, status, seconds, poller.worst(sent, sent + seconds))
            print(f"{tree}: {case}: {status} in {seconds:.2f} s", file=sys.stderr)
            if status is None:
                break
    finally:
        if poller is not None:
            poller.stop.set()
        gateway.stop(timeout=10)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default=None, help="unknown keys per body (default 16000,20000,50000,100000,"
                                                      "200000), or list items with --list (default 1000000)")
    parser.add_argument("--list", action="store_true", help="lists of wrongly typed items on LIST_BODIES' routes")
    parser.add_argument("--before", type=Path, default=None, help="a checkout of the code before the change")
    parser.add_argument("--give-up", type=float, default=120.0, help="seconds one answer may take")
    args = parser.parse_args()
    sizes = [int(size) for size in (args.sizes or ("1000000" if args.list else "16000,20000,50000,100000,200000"))
             .split(",")]
    if args.list:
        cases = [(path, n) for n in sizes for path in LIST_BODIES]
        headers, title = ["route", "items"], "POSTs with a list of N wrongly typed items"
    else:
        cases = [("/v1/embeddings", n) for n in sizes]
        headers, title = ["route", "unknown keys"], "POST /v1/embeddings with N unknown keys"
    trees = ([(args.before, "before")] if args.before else []) + [(REPO, "after")]
    with RedisServer() as redis_server:
        results = {label: measure(tree, redis_server.url, cases, args.list, args.give_up) for tree, label in trees}
    headers, rows = [*headers, "body MB"], []
    for _, label in trees:
        headers += [f"{label}: status", f"{label}: seconds", f"{label}: worst /health s"]
    for case in cases:
        row = [case[0], f"{case[1]:,}", next((r[case][0] for r in results.values() if case in r), float("nan"))]
        for _, label in trees:
            mb, status, seconds, worst = results[label].get(case, (0, "-", float("nan"), float("nan")))
            row += ["gave up" if status is None else status,
                    f"> {args.give_up:g}" if status is None else seconds, worst]
        rows.append(row)
    print(table(headers, rows, f"{title} ({describe_machine()})"))


if __name__ == "__main__":
    main()
