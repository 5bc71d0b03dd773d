"""A worker's claims on the jobs of its model's queues, each one Lua script (scripts/):

    take       queue -> started, for up to N jobs, atomically: no id is ever held outside a registry; each
               claim is a lease (its started-registry score) and each take counts a delivery. One take
               reads several queues in a given order (a model's priority levels, worker/serving/levels.py)
    finish     answer (publish; a served answer's blob SET just before, in the same write) + FINISHED / FAILED
               / requeued / CANCELED, only while the claim stands; what it records of rq's: `records`
    refresh    renew a held round's leases (the worker's heartbeat)
    recover    requeue, at the queue's head, the jobs whose lease lapsed (their worker died): any live
               worker runs it, the script is atomic, so each lapsed claim is requeued exactly once
    give_back  a draining or yielding worker's jobs not yet on the device, back to the queue's head

Leases. A worker's claim on a job it took lasts LEASE_SECONDS and its heartbeat renews it every third of that
(also during a long forward pass: the heartbeat is a thread of its own). A claim's score in rq:wip:<queue> is
lease expiry + LEASE_GRACE, on the Redis server's clock (TIME). When a claim lapses (the worker was killed,
OOM-killed, lost its host or froze) a live worker of the model requeues the job at the queue's head at its next
beat (`recover`, atomic, exactly once): a dead worker's jobs are back within 4/3 of LEASE_SECONDS of its death
(8 s by default). rq's own StartedJobRegistry.cleanup compares the same scores with its clock, so it sees a
lapsed claim LEASE_GRACE seconds later: a backstop that never requeues a job twice.
"""

from __future__ import annotations

import zlib
from base64 import b64encode
from datetime import datetime, timezone
from uuid import uuid4

import redis

from embedfleet.common.names import tag_of
from embedfleet.common.policy import FAILURE_TTL, JOB_TIMEOUT, LEASE_SECONDS, RECOVER_LIMIT, RESULT_TTL_BOUND
from embedfleet.common.protocol import keys, rqkeys, scripts, slotmoves
from embedfleet.common.protocol.records import (RQ_RECORDS, Answer, Finished, Kind, Outcome, Recovered, Taken,
                                                reply_text, rq_time)


def _ttl(raw, default: int, bound: int) -> int:
    """A job's own TTL when it is a positive whole number within `bound`, else the default."""
    try:
        value = int(raw)
    except (TypeError, ValueError):
        return default
    return value if 0 < value <= bound else default


class RqSchema:
    """The claim scripts bound to one queue and one worker name; `lease` seconds per claim (see above);
    `records`: what they write of rq's own bookkeeping, `lean` or `full` (the worker's --rq-records,
    docs/capacity.md)."""

    def __init__(self, connection: redis.Redis, queue: str, worker_name: str, *, result_ttl: int,
                 lease: float = LEASE_SECONDS, records: str = RQ_RECORDS[0]):
        if records not in RQ_RECORDS:
            raise ValueError(f"unknown rq records {records!r}: one of {', '.join(RQ_RECORDS)}")
        self.records = records
        self.known_empty = False  # whether the last take that read this queue left it empty
        self.connection = connection
        self.worker_name = worker_name
        self.result_ttl = result_ttl
        self.lease = lease
        self.queue = queue
        self.queue_key = rqkeys.rq_queue_key(queue)
        self.tokens_key = keys.queued_tokens_key(queue)
        self.wip_key = rqkeys.rq_wip_key(queue)
        self.worker_keys = [rqkeys.rq_worker_key(worker_name), rqkeys.rq_worker_executions_key(worker_name),
                            rqkeys.rq_suspended_key(tag_of(queue))]
        self.level_keys = [self.queue_key, self.wip_key, rqkeys.rq_canceled_key(queue), self.tokens_key]
        self.finish_keys = [self.queue_key, self.wip_key, rqkeys.rq_finished_key(queue), rqkeys.rq_failed_key(queue),
                            rqkeys.rq_worker_key(worker_name), rqkeys.rq_worker_executions_key(worker_name)]

    def take(self, max_jobs: int, block: float | None, before=None, max_tokens: int = 0) -> tuple[bool, list[Taken]]:
        """(suspended, taken ids) from this queue alone; see `take_from`."""
        return take_from([self], max_jobs, block, before, max_tokens)

    def finish(self, answers: list[Answer], working_seconds: float) -> Finished:
        """One round trip for the whole list: the blobs of served answers SET first (outside Lua: a script
        copies each argument twice, ~120 us of Redis per 100 KB blob), then one script run that wakes their
        waiters and ends every claim (finish.lua)."""
        stamp = datetime.now(timezone.utc)
        stored: list[tuple[str, bytes, bool]] = []
        served: list = []  # a served answer in 5 values (finish.lua): each argument costs both sides
        others: list = []
        for answer in answers:
            taken = answer.taken
            reply_to = answer.reply_to if keys.is_reply_stream_key(answer.reply_to) else ""
            if answer.outcome is Outcome.FINISHED:  # no rq result stream (finish.lua says why)
                ttl = taken.result_ttl or self.result_ttl  # rq's 0 / -1 are not honoured (see BatchWorker)
                if answer.blob:
                    stored.append((keys.result_key(taken.id), answer.blob, answer.only_if_absent))
                    served += [taken.id, taken.execution, reply_to, "1" if taken.options else "", ttl]
                    continue
                payload, exc_info = b"", b""
            else:
                payload = b64encode(zlib.compress(answer.reason.encode()))
                exc_info = zlib.compress(answer.reason.encode())
                ttl = taken.failure_ttl or FAILURE_TTL
            others += [taken.id, taken.execution, answer.outcome.value, answer.blob, reply_to, payload, exc_info, ttl,
                       "1" if answer.only_if_absent else "0", taken.started, "1" if taken.options else "0"]
        args = [self.worker_name, f"{stamp.timestamp():.6f}", rq_time(stamp), f"{working_seconds:.6f}",
                self.result_ttl, self.records, len(stored), *served, *others]
        try:
            reply = self._finish(stored, args)
        except redis.exceptions.NoScriptError:  # the server lost its scripts (a restart): again, by source
            reply = self._finish(stored, args, by_source=True)
        return Finished(*(int(n) for n in reply[:4]), [(reply_text(i), reply_text(why)) for i, why in reply[4:]])

    def _finish(self, stored: list[tuple[str, bytes, bool]], args: list, by_source: bool = False) -> list:
        commands = [("SET", key, blob, "EX", self.result_ttl, *(("NX",) if nx else ())) for key, blob, nx in stored]
        commands.append(scripts.FINISH.command(self.finish_keys, args, by_source))
        replies = scripts.send_at_once(self.connection, commands)
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        return replies[-1]

    def refresh(self, held: list[Taken]) -> int:
        """Renew the lease of each job still held; returns how many were."""
        stamp = datetime.now(timezone.utc)
        args: list = [f"{stamp.timestamp():.6f}", rq_time(stamp), rqkeys.LEASE_GRACE, self.records]
        for taken in held:
            args += [taken.id, taken.execution, self.lease]
        return int(scripts.REFRESH(self.connection, [self.wip_key], args))

    def recover(self, limit: int = RECOVER_LIMIT) -> list[Recovered]:
        """Requeue, at the queue's head, up to `limit` jobs whose lease lapsed (any worker's)."""
        args = [rqkeys.LEASE_GRACE, limit, rq_time(datetime.now(timezone.utc)), rqkeys.JOB_KEY_TTL]
        keys_ = [self.queue_key, self.wip_key, self.tokens_key] + ([] if tag_of(self.queue) else [rqkeys.RQ_QUEUES])
        return [Recovered(reply_text(i), float(overdue), reply_text(owner))
                for i, overdue, owner in scripts.RECOVER(self.connection, keys_, args)]

    def give_back(self, jobs: list[Taken]) -> int:
        """Return jobs this worker took but never started to the head of the queue, in their order."""
        if not jobs:
            return 0
        args: list = [rq_time(datetime.now(timezone.utc)), rqkeys.JOB_KEY_TTL]
        for taken in jobs:
            args += [taken.id, taken.execution]
        keys_ = [self.queue_key, self.wip_key, rqkeys.rq_worker_executions_key(self.worker_name), self.tokens_key]
        return int(scripts.GIVE_BACK(self.connection, keys_, args))


def take_from(schemas: list[RqSchema], max_jobs: int, block: float | None, before=None,
              max_tokens: int = 0, states: tuple[str, str] = ("", "")) -> tuple[bool, list[Taken]]:
    """(suspended, taken ids): up to `max_jobs` from the schemas' queues in their order (the first queue is
    emptied before the next is read), and no more jobs once their estimated tokens reach `max_tokens` (0: no
    limit; at least one job is taken), in one atomic script. With `block` seconds, first wait until the
    first queue has an id, without taking it (BLMOVE of the queue onto itself, LEFT to LEFT, moves
    nothing), then take in the same round trip. `before(pipe)` may queue commands ahead (the worker's rq
    heartbeat). The schemas share one connection, worker name and records. Each schema's `known_empty` says
    afterwards whether this take saw its queue empty (False: it holds ids, or the take did not look).
    `states`: the worker's rq state to write if it claims jobs / if it claims none ('': leave it)."""
    first = schemas[0]
    stamp = datetime.now(timezone.utc)
    args = [max_jobs, first.worker_name, f"{stamp.timestamp():.6f}", rq_time(stamp), (uuid4().hex + uuid4().hex)[:56],
            JOB_TIMEOUT, first.lease, rqkeys.LEASE_GRACE, rqkeys.CANCELED_TTL, max(0, int(max_tokens)),
            first.records, *states]
    keys_ = first.worker_keys + [key for schema in schemas for key in schema.level_keys]
    try:
        suspended, entries, _, empty = _take(first, keys_, args, block, before)
    except redis.exceptions.NoScriptError:  # the server lost its scripts (a restart): take again by source
        suspended, entries, _, empty = _take(first, keys_, args, None, before, by_source=True)
    if not suspended:
        for schema, flag in zip(schemas, empty):
            schema.known_empty = int(flag) == 1
    return bool(suspended), [_taken(entry, args[2], schemas) for entry in entries]


def _take(first: RqSchema, keys_: list[str], args: list, block: float | None, before, by_source=False) -> list:
    if slotmoves.is_cluster(first.connection):  # sent again while the slot is being moved (slotmoves.py)
        return slotmoves.while_moving(lambda: _take_once(first, keys_, args, block, before, by_source),
                                      first.connection)
    return _take_once(first, keys_, args, block, before, by_source)


def _take_once(first: RqSchema, keys_: list[str], args: list, block: float | None, before, by_source) -> list:
    with first.connection.pipeline(transaction=False) as pipe:  # MULTI would not block
        if before is not None:
            before(pipe)
        if block is not None:
            pipe.blmove(first.queue_key, first.queue_key, block, "LEFT", "LEFT")
        scripts.TAKE.queue(pipe, keys_, args, by_source)
        return pipe.execute()[-1]


_KINDS = {form: kind for kind in Kind for form in (kind.value, kind.value.encode())}  # as take.lua answers it
_ONE = ("1", b"1")


def _taken(entry: list, started: str, schemas: list[RqSchema]) -> Taken:
    queue = schemas[int(entry[0]) - 1].queue
    job_id, kind = reply_text(entry[1]), _KINDS.get(entry[2]) or Kind(reply_text(entry[2]))  # (an unknown kind raises)
    if kind is Kind.CANCELED:  # a reply stream to wake
        return Taken(job_id, kind, data=entry[4], queue=queue, reply_to=_reply_stream(entry[5]),
                     options=entry[6] in _ONE)
    if not (kind is Kind.STARTED or kind is Kind.BAD):
        return Taken(job_id, kind, queue=queue)
    _, _, _, execution, data, timeout, result_ttl, failure_ttl, deliveries, lapses, reason, reply_to, options = entry
    return Taken(job_id, kind, reply_text(execution), data, float(timeout),
                 _ttl(result_ttl, 0, RESULT_TTL_BOUND) or None,
                 _ttl(failure_ttl, FAILURE_TTL, FAILURE_TTL), started, int(deliveries), int(lapses),
                 queue, reply_text(reason) if reason else "", _reply_stream(reply_to) if reply_to else None,
                 options in _ONE)


def _reply_stream(raw) -> str | None:
    """A job's `reply_to` field, when it names a reply stream (never any other key: Redis is input)."""
    name = reply_text(raw)
    return name if keys.is_reply_stream_key(name) else None
