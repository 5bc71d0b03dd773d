"""rq 3.0's per-job schema, written on the server by Lua scripts (common/protocol/rqscripts.py) run with EVALSHA.

This module is the only place in the tree that writes rq's job, execution and registry keys by hand (rq's
own Worker class still registers the worker and runs maintenance). Each script's header lists every key it
touches; tests/test_rqschema.py compares what these scripts leave in Redis with what rq 3.0's SimpleWorker
leaves for the same jobs, so a change in rq's layout fails loudly there.

    take     queue -> started, for up to N jobs, atomically: no id is ever held outside a registry; each
             claim is a lease (its started-registry score) and each take counts a delivery. One take reads
             several queues in a given order (a model's priority levels, worker/serving/levels.py), each job
             started in its own queue's registry
    finish   answer (result blob, notify list, reply stream) + FINISHED / FAILED / requeued / CANCELED
    refresh  renew a held batch's leases (the worker's heartbeat)
    recover  requeue, at the queue's head, the jobs whose lease lapsed (their worker died): any live worker
             runs it, the script is atomic, so each lapsed claim is requeued exactly once
    return   a draining worker's jobs not yet on the device, back to the queue's head

Leases (see common/protocol/keys.py): a claim's score is lease expiry + LEASE_GRACE, on the Redis server's clock
(TIME), so rq's own StartedJobRegistry.cleanup (maintenance, `rq info`) sees a lapsed claim only
LEASE_GRACE seconds after `recover` does: rq's recovery is the backstop, never a second requeue.

Everything the scripts read from Redis is treated as input: an id outside rq's alphabet is dropped (it can
name no job), a missing or corrupt job field falls back to a bounded default, a foreign key type is never
written to, and a job is acknowledged only while this worker's claim on it (its started entry) stands.
"""

from __future__ import annotations

import functools
import zlib
from base64 import b64encode
from dataclasses import dataclass
from datetime import datetime, timezone
from enum import Enum
from uuid import uuid4

import redis
from redis import Redis

from common.protocol import keys
from common.codec import packb

from common.protocol.rqscripts import (FINISH_SCRIPT, RECOVER_SCRIPT, REFRESH_SCRIPT, RETURN_SCRIPT,
                               TAKE_SCRIPT)

# rq's utcformat, as the job hash and the worker hash store timestamps.
_RQ_TIME = "%Y-%m-%dT%H:%M:%S.%fZ"


class Kind(Enum):
    """What take found for one id."""

    STARTED = "started"
    CANCELED = "canceled"
    MISSING = "missing"
    BADID = "badid"
    STALE = "stale"


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
    timeout: float = float(keys.JOB_TIMEOUT)
    result_ttl: int | None = None  # the job's own, when positive and bounded
    failure_ttl: int | None = None
    started: str = ""  # when take started it (unix seconds, as rq's execution records it)
    deliveries: int = 1  # times a worker has taken it, this take included
    lapses: int = 0  # times a worker died holding it (its lease lapsed and recover requeued it)
    queue: str = ""  # the rq queue it was taken from: finish, refresh and return use that queue's keys


@dataclass
class Answer:
    """What finish writes for one job."""

    taken: Taken
    outcome: Outcome
    blob: bytes = b""
    reply_to: str | None = None
    summary: dict | None = None  # rq's return value for a finished job (never the embeddings)
    reason: str = ""  # rq's exc_string for a failed job
    only_if_absent: bool = True  # the first answer stays: a re-enqueued id cannot replace a stored result
    code: str = ""  # the error code answered, if any (the worker's error metric)


def _ttl(raw: bytes | str, default: int, bound: int) -> int:
    """A job's own TTL when it is a positive whole number within `bound`, else the default."""
    try:
        value = int(raw)
    except (TypeError, ValueError):
        return default
    return value if 0 < value <= bound else default


@functools.lru_cache(maxsize=64)
def _encoded_return_value(items: tuple) -> bytes:
    return b64encode(packb(dict(items)))


def _return_value(summary: dict | None) -> bytes:
    """rq's result-stream encoding of a return value (base64 of the serializer's bytes); few distinct ones."""
    return _encoded_return_value(tuple(sorted((summary or {}).items())))


def rq_time(stamp: datetime) -> str:
    return stamp.strftime(_RQ_TIME)


def _text(raw) -> str:
    return raw.decode("utf-8", "backslashreplace") if isinstance(raw, bytes) else str(raw)


@dataclass
class Recovered:
    """One job whose lease had lapsed, requeued by `recover`."""

    id: str
    overdue: float  # seconds between its lease's end and its requeue
    worker: str  # the worker that held it


class RqSchema:
    """The scripts bound to one queue and one worker name; `lease` seconds per claim (common.protocol.keys)."""

    def __init__(self, connection: Redis, queue: str, worker_name: str, *, result_ttl: int,
                 lease: float = keys.LEASE_SECONDS):
        self.connection = connection
        self.worker_name = worker_name
        self.result_ttl = result_ttl
        self.lease = lease
        q = f"rq:queue:{queue}"
        self.queue = queue
        self.queue_key = q
        self.tokens_key = keys.queued_tokens_key(queue)
        self.wip_key = f"rq:wip:{queue}"
        worker_key = f"rq:worker:{worker_name}"
        self.worker_keys = [worker_key, f"{worker_key}:executions", "rq:suspended"]
        self.level_keys = [q, self.wip_key, f"rq:canceled:{queue}", self.tokens_key]
        self.finish_keys = [q, self.wip_key, f"rq:finished:{queue}", f"rq:failed:{queue}",
                            f"rq:canceled:{queue}", worker_key, f"{worker_key}:executions"]

    def take(self, max_jobs: int, block: float | None, before=None) -> tuple[bool, list[Taken]]:
        """(suspended, taken ids) from this queue alone; see `take_from`."""
        return take_from([self], max_jobs, block, before)

    def finish(self, answers: list[Answer], working_seconds: float) -> list[int]:
        """One EVALSHA for the whole list; returns [finished, failed, requeued, late]."""
        stamp = datetime.now(timezone.utc)
        args: list = [self.worker_name, f"{stamp.timestamp():.6f}", rq_time(stamp), f"{working_seconds:.6f}",
                      self.result_ttl, keys.result_key(""), keys.notify_key(""), keys.REPLY_STREAM_MAXLEN]
        for answer in answers:
            taken = answer.taken
            if answer.outcome is Outcome.FINISHED:
                payload, exc_info = _return_value(answer.summary), b""
                ttl = taken.result_ttl or self.result_ttl  # rq's 0 / -1 are not honoured (see BatchWorker)
            else:
                payload = b64encode(zlib.compress(answer.reason.encode()))
                exc_info = zlib.compress(answer.reason.encode())
                ttl = taken.failure_ttl or keys.FAILURE_TTL
            args += [taken.id, taken.execution, answer.outcome.value, answer.blob,
                     answer.reply_to if keys.is_reply_stream_key(answer.reply_to) else "", payload, exc_info, ttl,
                     "1" if answer.only_if_absent else "0", taken.started]
        return [int(n) for n in FINISH_SCRIPT(self.connection, self.finish_keys, args)]

    def refresh(self, held: list[Taken]) -> int:
        """Renew the lease of each job still held; returns how many were."""
        stamp = datetime.now(timezone.utc)
        args: list = [f"{stamp.timestamp():.6f}", rq_time(stamp), keys.LEASE_GRACE]
        for taken in held:
            args += [taken.id, taken.execution, self.lease]
        return int(REFRESH_SCRIPT(self.connection, [self.wip_key], args))

    def recover(self, limit: int = 1000) -> list[Recovered]:
        """Requeue, at the queue's head, up to `limit` jobs whose lease lapsed (any worker's)."""
        args = [keys.LEASE_GRACE, limit, rq_time(datetime.now(timezone.utc))]
        keys_ = [self.queue_key, self.wip_key, self.tokens_key]
        return [Recovered(_text(i), float(overdue), _text(owner))
                for i, overdue, owner in RECOVER_SCRIPT(self.connection, keys_, args)]

    def give_back(self, jobs: list[Taken]) -> int:
        """Return jobs this worker took but never started to the head of the queue, in their order."""
        if not jobs:
            return 0
        args: list = [rq_time(datetime.now(timezone.utc))]
        for taken in jobs:
            args += [taken.id, taken.execution]
        keys_ = [self.queue_key, self.wip_key, f"rq:worker:{self.worker_name}:executions", self.tokens_key]
        return int(RETURN_SCRIPT(self.connection, keys_, args))


def take_from(schemas: list[RqSchema], max_jobs: int, block: float | None, before=None) -> tuple[bool, list[Taken]]:
    """(suspended, taken ids): up to `max_jobs` from the schemas' queues in their order (the first queue is
    emptied before the next is read), in one atomic script. With `block` seconds, first wait until the
    first queue has an id, without taking it (BLMOVE of the queue onto itself, LEFT to LEFT, moves
    nothing), then take in the same round trip. `before(pipe)` may queue commands ahead (the worker's rq
    heartbeat). The schemas share one connection and worker name."""
    first = schemas[0]
    stamp = datetime.now(timezone.utc)
    args = [max_jobs, first.worker_name, f"{stamp.timestamp():.6f}", rq_time(stamp), uuid4().hex[:24],
            keys.MAX_REQUEST_ID_LENGTH, keys.JOB_TIMEOUT, first.lease, keys.LEASE_GRACE]
    keys_ = first.worker_keys + [key for schema in schemas for key in schema.level_keys]
    try:
        suspended, entries = _take(first, keys_, args, block, before)
    except redis.exceptions.NoScriptError:  # the server lost its scripts (a restart): load, take again
        TAKE_SCRIPT.load(first.connection)
        suspended, entries = _take(first, keys_, args, None, before)
    return bool(suspended), [_taken(entry, args[2], schemas) for entry in entries]


def _take(first: RqSchema, keys_: list[str], args: list, block: float | None, before) -> tuple[int, list]:
    with first.connection.pipeline(transaction=False) as pipe:  # MULTI would not block
        if before is not None:
            before(pipe)
        if block is not None:
            pipe.blmove(first.queue_key, first.queue_key, block, "LEFT", "LEFT")
        TAKE_SCRIPT.queue(pipe, keys_, args)
        return pipe.execute()[-1]


def _taken(entry: list, started: str, schemas: list[RqSchema]) -> Taken:
    queue = schemas[int(entry[0]) - 1].queue
    raw_id, kind = entry[1], Kind(_text(entry[2]))
    job_id = _text(raw_id)
    if kind is Kind.CANCELED:
        return Taken(job_id, kind, data=entry[4], queue=queue)  # its request may name a reply stream to wake
    if kind is not Kind.STARTED:
        return Taken(job_id, kind, queue=queue)
    _, _, _, execution, data, timeout, result_ttl, failure_ttl, deliveries, lapses = entry
    return Taken(job_id, kind, _text(execution), data, float(timeout),
                 _ttl(result_ttl, 0, keys.RESULT_TTL_BOUND) or None,
                 _ttl(failure_ttl, keys.FAILURE_TTL, keys.FAILURE_TTL), started, int(deliveries), int(lapses),
                 queue)
