"""Storing a round's answers within what Redis takes (the finish stage's writes, worker/serving/pipeline.py).

Redis refuses any one value longer than its proto-max-bulk-len (512 MB by default, 1 MB at its lowest): a value
a little over it is answered "Protocol error: invalid bulk length", a larger one resets the connection, which
looks like an outage. It is none: the same write is refused however often it is tried, and letting the claims
lapse would compute the request again until it fails as poison. So:

- the limit is read (CONFIG GET) at the first store, again every REREAD_SECONDS (CONFIG SET changes it live)
  and after a refused write or an outage (a restarted Redis may have another); where CONFIG is refused (an ACL
  user without @dangerous, a managed Redis) it is never asked again (each ask would be one more entry in ACL
  LOG): Redis's default is assumed, and a refusal lowers it;
- an answer over the limit is replaced, before the script runs, by its request's `result_too_large` error:
  that request alone fails, once; its round-mates are stored;
- the answers go in calls of at most CALL_BYTES of blobs (a larger answer alone), so that a round of many
  large results is never one command too large for Redis, nor one that holds its single thread for long;
- a call refused, or reset, while Redis still answers PING is sent again one answer per call; an answer refused
  alone twice fails `result_too_large`. Only a Redis that does not answer is an outage, ridden out by
  `with_retries` (the round is only in memory).
"""

from __future__ import annotations

import logging
import time

import redis
from redis import Redis

from embedfleet.common.protocol import scripts
from embedfleet.common.protocol.records import Answer, Finished
from embedfleet.worker.serving import answers as answering
from embedfleet.worker.serving.levels import Levels

log = logging.getLogger("embedfleet.worker")

DEFAULT_BULK_LIMIT = 512 * 1024 * 1024  # Redis's own default proto-max-bulk-len
REREAD_SECONDS = 60.0  # how old a limit read from Redis may be before the next store reads it again
CALL_BYTES = 64 * 1024 * 1024  # answer bytes one finish call carries at most (one larger answer goes alone)
_REFUSED = "Protocol error"  # Redis's reply to a value over its limit (when it answers before resetting)


class BulkLimit:
    """Redis's proto-max-bulk-len as this worker knows it: `current()`, and whether it was `read` from Redis
    (else Redis's default is assumed). A refusal lowers it below the refused size for REREAD_SECONDS."""

    def __init__(self, connection: Redis, reread: float = REREAD_SECONDS):
        self.connection = connection
        self.reread = reread
        self.read = False
        self._value = DEFAULT_BULK_LIMIT
        self._read_at: float | None = None
        self._refused: tuple[int, float] | None = None  # (bytes Redis refused, when)
        self._config_refused = False

    def current(self) -> int:
        """The limit, read again when it may have changed. Raises what a Redis that does not answer raises."""
        now = time.monotonic()
        if not self._config_refused and (self._read_at is None or now - self._read_at >= self.reread):
            found = scripts.bulk_limit(self.connection)
            if found is None:
                log.warning("Redis refuses CONFIG GET proto-max-bulk-len: assuming its default of %d bytes (not "
                            "asked again); an answer that Redis refuses still fails its request alone",
                            DEFAULT_BULK_LIMIT)
                self._config_refused = True
            self._value, self.read = (found, True) if found is not None else (DEFAULT_BULK_LIMIT, False)
            self._read_at = now
        if self._refused is not None and now - self._refused[1] < self.reread:
            return min(self._value, self._refused[0] - 1)
        return self._value

    def stale(self) -> None:
        """Read it again before the next store."""
        self._read_at = None

    def refused(self, size: int) -> None:
        """Redis refused a value of `size` bytes while it answers: its limit is below that, whatever it said."""
        self._refused = (size, time.monotonic())
        self.read = False


class Store:
    """Writes a round's answers with the finish script (`levels.finish`, worker/serving/levels.py), within the
    limit, in calls of at most `call_bytes` of answers; `name`: the worker's, for its log lines."""

    def __init__(self, levels: Levels, connection: Redis, model: str, name: str, limit: BulkLimit | None = None,
                 call_bytes: int = CALL_BYTES):
        self.levels = levels
        self.call_bytes = call_bytes
        self.connection = connection
        self.model = model
        self.name = name
        self.limit = limit or BulkLimit(connection)
        self._swapped: dict[str, Answer] = {}  # answers Redis refused alone, by job id: their replacements

    def write(self, answers: list[Answer], working_seconds: float) -> tuple[Finished, list[Answer]]:
        """What the finish calls did, and the answers as written (some replaced by `result_too_large`)."""
        self._swapped = {}
        written = with_retries(lambda: self._fitted(answers), self.name, self.limit)
        done = Finished()
        for number, call in enumerate(calls(written, self.call_bytes)):
            seconds = working_seconds if number == 0 else 0.0  # the worker's working time, counted once
            done += with_retries(lambda c=call, s=seconds: self._call(c, s), self.name, self.limit)
        return done, [self._swapped.get(answer.taken.id, answer) for answer in written]

    def _fitted(self, answers: list[Answer]) -> list[Answer]:
        limit = self.limit.current()
        return [self._too_large(answer, limit) if len(answer.blob) > limit else answer for answer in answers]

    def _too_large(self, answer: Answer, limit: int) -> Answer:
        replaced = answering.too_large(answer, limit, self.limit.read, self.model)
        log.warning("worker %s: %s", self.name, replaced.reason)
        return replaced

    def _call(self, call: list[Answer], seconds: float) -> Finished:
        """One finish script run; refused while Redis answers: the answers one by one."""
        try:
            return self.levels.finish(call, seconds)
        except (redis.ConnectionError, redis.ResponseError) as exc:
            if not self._refused(exc):
                raise
            log.warning("worker %s: Redis refused a call of %d answers, %d bytes (%s), and still answers: storing "
                        "them one per call", self.name, len(call), sum(len(a.blob) for a in call), exc)
        self.limit.stale()
        done = Finished()
        for number, answer in enumerate(call):
            done += self._alone(answer, seconds if number == 0 else 0.0)
        return done

    def _alone(self, answer: Answer, seconds: float) -> Finished:
        """One answer in its own call; refused twice while Redis answers: its request fails as too large."""
        for _ in range(2):
            try:
                return self.levels.finish([answer], seconds)
            except (redis.ConnectionError, redis.ResponseError) as exc:
                if not self._refused(exc):
                    raise
        self.limit.refused(len(answer.blob))
        replaced = self._swapped[answer.taken.id] = self._too_large(answer, self.limit.current())
        return self.levels.finish([replaced], seconds)

    def _refused(self, exc: redis.RedisError) -> bool:
        """Whether a failed write was refused by a Redis that answers (else: an outage, or another error)."""
        if isinstance(exc, redis.ResponseError):
            return str(exc).startswith(_REFUSED)
        try:
            return bool(self.connection.ping())
        except (redis.ConnectionError, redis.TimeoutError):
            return False


def calls(answers: list[Answer], budget: int = CALL_BYTES) -> list[list[Answer]]:
    """The answers in order, cut into calls of at most `budget` blob bytes (an answer larger alone)."""
    cut: list[list[Answer]] = []
    size = budget + 1
    for answer in answers:
        if size + len(answer.blob) > budget:
            cut.append([])
            size = 0
        cut[-1].append(answer)
        size += len(answer.blob)
    return cut


def with_retries(write, name: str, limit: BulkLimit | None = None, attempts: int = 5):
    """The engine's work is in memory: ride out a short Redis outage rather than lose the round (the limit is
    read again after it: a restarted Redis may have another)."""
    delay = 1.0
    for attempt in range(attempts):
        try:
            return write()
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            if attempt == attempts - 1:
                raise
            log.error("worker %s: storing a round failed (%s); retrying in %.0f s", name, exc, delay)
            if limit is not None:
                limit.stale()
            time.sleep(delay)
            delay *= 2
