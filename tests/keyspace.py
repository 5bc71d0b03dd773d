"""The Redis keys the fleet writes, seen and checked: the key patterns common/protocol/keys.py's docstring
documents, and a recorder of every key a Redis's keyspace notifications name."""

from __future__ import annotations

import re
import threading
import time

import redis

from embedfleet.common.protocol import keys


def documented_patterns() -> list[re.Pattern]:
    """The key patterns in keys.py's docstring: the first column of each line naming an embedfleet: or rq:
    key (several may share a line, comma-separated); <placeholders> match any text."""
    patterns = []
    for line in keys.__doc__.splitlines():
        text = line.strip()
        if not text.startswith(("embedfleet:", "rq:")):
            continue
        column = re.split(r"\s{2,}", text)[0]
        for name in column.split(", "):
            name = name.split(" ...")[0].strip()
            regex = "".join(".+" if part.startswith("<") else re.escape(part)
                            for part in re.split(r"(<[^>]+>)", name) if part)
            patterns.append(re.compile(regex))
    return patterns


class KeyRecorder:
    """Every key a keyspace notification names (writes and expiries), collected by a thread."""

    def __init__(self, url: str):
        self.client = redis.Redis.from_url(url)
        self.client.config_set("notify-keyspace-events", "KA")
        self.pubsub = self.client.pubsub()
        self.pubsub.psubscribe("__keyspace@0__:*")
        self.keys: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            message = self.pubsub.get_message(timeout=0.1)
            if message and message["type"] == "pmessage":
                self.keys.add(message["channel"].decode().split(":", 1)[1])

    def stop(self) -> set[str]:
        """Once every notification sent so far is read: a last message of our own, behind them all."""
        self.client.publish("__keyspace@0__:sentinel", "x")
        deadline = time.monotonic() + 30
        while "sentinel" not in self.keys and time.monotonic() < deadline:
            time.sleep(0.01)
        self._stop.set()
        self._thread.join(5)
        self.pubsub.close()
        self.client.close()
        return self.keys
