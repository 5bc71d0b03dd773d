"""Heartbeats: a background thread whose death its owner notices, and the started-job TTLs it keeps alive."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import redis

log = logging.getLogger(__name__)


class Heartbeat:
    """Calls `beat()` every `interval` seconds in a daemon thread until `stop()`.

    A failing beat is logged and retried at the next tick (Redis errors without a traceback, anything else
    with one), so the thread only dies on a bug in this class or a BaseException; `ensure_alive()`, called by
    the owner's loop, logs that death and starts a fresh thread.
    """

    def __init__(self, beat: Callable[[], None], interval: float, name: str):
        self.beat = beat
        self.interval = interval
        self.name = name
        self.restarts = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def ensure_alive(self) -> bool:
        """Restarts a dead thread (logged as an error); returns False if it had died."""
        if self.alive or self._stop.is_set():
            return True
        self.restarts += 1
        log.error("%s thread died; restarting it (restart #%d)", self.name, self.restarts)
        self.start()
        return False

    def _run(self) -> None:
        try:
            while not self._stop.wait(self.interval):
                self._beat_once()
        except BaseException:
            log.exception("%s thread is dying", self.name)
            raise

    def _beat_once(self) -> None:
        try:
            self.beat()
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            log.warning("%s: Redis unreachable (%s); retrying in %g s", self.name, exc, self.interval)
        except Exception:
            log.exception("%s: beat failed; retrying in %g s", self.name, self.interval)


def started_ttl(timeout: float | None, working_time: float, interval: float) -> int:
    """Seconds a started job stays in rq's started registry without a beat: three beats + 60 s (not rq's
    job.timeout + 60), and never past the job's timeout + 60 s. None, or rq's -1 ("never times out"): beats."""
    beats = 3 * interval
    if timeout is None or timeout <= 0:
        return int(beats) + 60
    return int(max(0.0, min(timeout - working_time, beats))) + 60


def timed_out(timeout: float | None, working_time: float) -> bool:
    """Past its timeout a job is no longer kept alive: rq's maintenance then retries or fails it."""
    return timeout is not None and timeout > 0 and working_time > timeout
