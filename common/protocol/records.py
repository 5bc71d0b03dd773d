"""What the protocol's operations take and return: a taken job, the answer finish writes for it, a recovered
claim. Plain data; the operations (claims.py, enqueueing.py, answering.py, ...) turn them into script arguments
and back."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum

from embedfleet.common.policy import JOB_TIMEOUT

# What the scripts write of rq's own bookkeeping (the worker's --rq-records; docs/capacity.md says what each
# records): the first is the default.
RQ_RECORDS = ("lean", "full")

# rq's utcformat, as the job hash and the worker hash store timestamps.
_RQ_TIME = "%Y-%m-%dT%H:%M:%S.%fZ"


def rq_time(stamp: datetime) -> str:
    return stamp.strftime(_RQ_TIME)


def reply_text(raw) -> str:
    """A value of a script's reply as text (bytes decoded, what is no UTF-8 escaped)."""
    return raw.decode("utf-8", "backslashreplace") if isinstance(raw, bytes) else str(raw)


class Kind(Enum):
    """What take found for one id."""

    STARTED = "started"  # claimed: run it
    BAD = "bad"  # claimed, but its job hash holds what no producer writes: failed with `reason`, never run
    CANCELED = "canceled"  # cancelled while queued: answered "cancelled"
    MISSING = "missing"  # no job hash: dropped, as rq drops it
    BADID = "badid"  # no job can have this id: dropped
    STALE = "stale"  # the job had already ended: dropped


class Outcome(Enum):
    """How finish ends one job."""

    FINISHED = "finished"  # served: its answer is embeddings or the request's own error
    FAILED = "failed"  # not served, never retried (the message is bad, or its retries are spent)
    RETRY = "retry"  # not served for a reason that may pass (the machine's): requeued while retries last
    CANCELED = "canceled"  # cancelled while queued: answered "cancelled", never run


@dataclass
class Taken:
    """One id as take returned it. `data` is the rq job's raw `data` field (zlib of msgpack)."""

    id: str
    kind: Kind
    execution: str = ""
    data: bytes = b""
    timeout: float = float(JOB_TIMEOUT)
    result_ttl: int | None = None  # the job's own, when positive and bounded
    failure_ttl: int | None = None
    started: str = ""  # when take started it (unix seconds, as rq's execution records it)
    deliveries: int = 1  # times a worker has taken it, this take included
    lapses: int = 0  # times a worker died holding it (its lease lapsed and recover requeued it)
    queue: str = ""  # the rq queue it was taken from: finish, refresh and return use that queue's keys
    reason: str = ""  # Kind.BAD: what in its job hash no producer writes
    reply_to: str | None = None  # the reply stream its producer waits on (the job's `reply_to` field)
    options: bool = False  # the gateway saved answer options for it (embedfleet:job:<id>): they expire with it

    @property
    def claimed(self) -> bool:
        """Whether this worker holds a claim on it (in the started registry) that finish must end."""
        return self.kind in (Kind.STARTED, Kind.BAD)


@dataclass
class Answer:
    """What finish writes for one job."""

    taken: Taken
    outcome: Outcome
    blob: bytes = b""
    reply_to: str | None = None
    reason: str = ""  # rq's exc_string for a failed job
    only_if_absent: bool = True  # the first answer stays: a re-enqueued id cannot replace a stored result
    code: str = ""  # the error code answered, if any (the worker's error metric)


@dataclass
class Finished:
    """What one finish run did: counts per outcome, and what it could not write as asked (and why)."""

    finished: int = 0
    failed: int = 0
    requeued: int = 0
    late: int = 0  # answered, but the claim had lapsed (rq left as is)
    problems: list[tuple[str, str]] = field(default_factory=list)  # (request id, what went wrong)

    def __add__(self, other: Finished) -> Finished:
        return Finished(self.finished + other.finished, self.failed + other.failed, self.requeued + other.requeued,
                        self.late + other.late, self.problems + other.problems)


@dataclass
class Recovered:
    """One job whose lease had lapsed, requeued by `recover`."""

    id: str
    overdue: float  # seconds between its lease's end and its requeue
    worker: str  # the worker that held it
