"""What a worker is doing now, for its advert (`embedfleet status`, the gateway's /dashboard): its current
round on the device and the texts it finished, in 10-second buckets over the last 10 minutes."""

from __future__ import annotations

import threading
import time

BUCKET_SECONDS = 10
BUCKETS = 60  # 10 minutes of history
RATE_WINDOW = 60  # seconds `texts_per_s` averages over


class LiveStats:
    """Fed by the worker's stages (any thread); `facts()` is read by the heartbeat thread."""

    def __init__(self, clock=time.time):
        self._clock = clock
        self._lock = threading.Lock()
        self._started = clock()
        self._buckets: dict[int, int] = {}  # bucket number (time // BUCKET_SECONDS) -> texts finished
        self._on_device = (0, 0)  # (requests, texts) of the round on the device now
        self.rounds = 0
        self.texts = 0

    def on_device(self, requests: int, texts: int) -> None:
        with self._lock:
            self._on_device = (requests, texts)

    def finished(self, texts: int) -> None:
        now = self._clock()
        with self._lock:
            bucket = int(now // BUCKET_SECONDS)
            self._buckets[bucket] = self._buckets.get(bucket, 0) + texts
            for old in [b for b in self._buckets if b <= bucket - BUCKETS]:
                del self._buckets[old]
            self.rounds += 1
            self.texts += texts

    def facts(self) -> dict:
        now = self._clock()
        current = int(now // BUCKET_SECONDS)
        with self._lock:
            history = [self._buckets.get(b, 0) for b in range(current - BUCKETS + 1, current + 1)]
            requests, texts = self._on_device
        # The last minute: the current (partial) bucket and the five before it, over the time they span,
        # which is less than a minute for a worker that started less than a minute ago.
        span = min(now - self._started, (RATE_WINDOW - BUCKET_SECONDS) + (now - current * BUCKET_SECONDS))
        recent = sum(history[-(RATE_WINDOW // BUCKET_SECONDS):])
        return {"texts_per_s": round(recent / span, 3) if span > 0 else 0.0, "texts_history": history,
                "history_bucket_s": BUCKET_SECONDS, "current_requests": requests, "current_texts": texts,
                "rounds": self.rounds, "texts_done": self.texts, "started_at": self._started}
