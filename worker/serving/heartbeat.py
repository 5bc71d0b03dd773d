"""Heartbeats: a background thread whose death its owner notices, and the forward-pass watchdog it runs."""

from __future__ import annotations

import logging
import threading
import time
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


def timed_out(timeout: float | None, working_time: float) -> bool:
    """Past its timeout a job's lease is no longer renewed: it lapses and the job is recovered (requeued, a
    lapse counted toward poison)."""
    return timeout is not None and timeout > 0 and working_time > timeout


class Watchdog:
    """A deadline per forward round: `floor` seconds + `per_token` seconds per padded token of the round.
    Armed by the forward stage, checked by the heartbeat thread (which a hung device call does not stop)."""

    def __init__(self, floor: float, per_token: float):
        if floor <= 0 or per_token < 0:
            raise ValueError(f"watchdog floor must be positive and per-token seconds not negative, got "
                             f"{floor}, {per_token}")
        self.floor = floor
        self.per_token = per_token
        self._armed: tuple[float, float, int] | None = None  # (started, deadline seconds, padded tokens)

    def arm(self, work) -> None:
        """`work`: an engine Work (its prepared token lists count: `Work.padded_alone`) or a padded-token count."""
        tokens = work if isinstance(work, int) else work.padded_alone
        self._armed = (time.monotonic(), self.floor + self.per_token * tokens, tokens)

    def disarm(self) -> None:
        self._armed = None

    def overdue(self) -> tuple[int, float, float] | None:
        """(padded tokens, seconds run, deadline) of a round past its deadline, else None."""
        armed = self._armed
        if armed is None:
            return None
        started, deadline, tokens = armed
        ran = time.monotonic() - started
        return (tokens, ran, deadline) if ran > deadline else None
