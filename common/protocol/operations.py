"""Every write of the protocol, each one Lua script (common/protocol/scripts/): nothing else in the tree writes
rq's job, execution and registry keys or a request's answer.

    enqueue    requests -> rq jobs on a queue, each caller's all or none, each id new, within a depth limit;
               one script run for the callers of an AsyncProducer's round
    take       queue -> started, for up to N jobs, atomically: no id is ever held outside a registry; each
               claim is a lease (its started-registry score) and each take counts a delivery. One take
               reads several queues in a given order (a model's priority levels, worker/serving/levels.py)
    finish     answer (publish; a served answer's blob SET just before, in the same write) + FINISHED / FAILED
               / requeued / CANCELED, only while the claim stands; what it records of rq's: `records`
    refresh    renew a held round's leases (the worker's heartbeat)
    recover    requeue, at the queue's head, the jobs whose lease lapsed (their worker died): any live
               worker runs it, the script is atomic, so each lapsed claim is requeued exactly once
    give_back  a draining or yielding worker's jobs not yet on the device, back to the queue's head
    cancel     a queued request out of its queue, answered "cancelled"
    join       one part of a spread request lands; the last one completes it
    publish    an answer outside a claim (an abandoned job, a spread request answered from its parts)

An answer is published by one Lua function (lib.lua `publish`, or its wake-up half `wake` after the blob's SET
in the finish's own write), whichever script ends the request, with one wake-up: on the request's reply stream,
else on its notify list.
Leases (see keys.py): a claim's score is lease expiry + LEASE_GRACE, on the Redis server's clock (TIME),
so rq's own StartedJobRegistry.cleanup sees a lapsed claim only LEASE_GRACE seconds after `recover` does.
Everything the scripts read from Redis is judged before their first write (tests/faults/test_protocol_hostile.py).
"""

from __future__ import annotations

import zlib
from base64 import b64encode
from dataclasses import dataclass
from datetime import datetime, timezone
from uuid import uuid4

import redis
import redis.asyncio as aioredis
import redis.cluster

from embedfleet.common.errors import DuplicateRequestError
from embedfleet.common.protocol import keys, rqjobs, scripts, slotmoves
from embedfleet.common.protocol.records import RQ_RECORDS, Answer, Finished, Kind, Outcome, Recovered, Taken, rq_time
from embedfleet.common.request import EmbedRequest
from embedfleet.common.result import Result
from embedfleet.common.scheduling import estimate_tokens

# -- enqueue ------------------------------------------------------------------------------------------

# rq's job hash of each request: common/protocol/rqjobs.py (rq's own fields, built fast)


class QueueFull(Exception):
    """The queue holds `depth` ids and the requests would pass its limit (the caller says it its way)."""

    def __init__(self, depth: int):
        super().__init__(depth)
        self.depth = depth


@dataclass(frozen=True)
class Enqueue:
    """One caller's enqueue on one queue: build once, run sync or async, alone (`enqueue`) or in one script
    run with other callers' enqueues on the same queue (`round_args`: an AsyncProducer's coalesced round)."""

    queue: str
    front: bool
    max_depth: int
    jobs: list  # this caller's part of the script's ARGV: its job count, then each job's values

    @property
    def keys(self) -> list[str]:
        """The script's KEYS. A queue with a hash tag (Redis Cluster) names its own key in rq:queues' place:
        a script touches one slot, so there the caller lists the queue in rq:queues itself (`announce_key`)."""
        listed = keys.RQ_QUEUES if not keys.tag_of(self.queue) else keys.rq_queue_key(self.queue)
        return [keys.rq_queue_key(self.queue), listed, keys.queued_tokens_key(self.queue)]

    def same_script(self, other: Enqueue) -> bool:
        """Whether the two can go in one script run (one queue, one place in it, one depth limit)."""
        return (self.queue, self.front, self.max_depth) == (other.queue, other.front, other.max_depth)


def enqueue_args(queue: str, requests: list[EmbedRequest], *, at_front: bool = False, retry: bool = True,
                 max_depth: int | None = None, fresh: bool = False) -> Enqueue:
    """The one builder of jobs, for the sync and async clients and a spread request's parts.

    retry: rq's Retry(max=JOB_RETRIES) (embedding is idempotent: a job whose worker died is retried rather
        than lost); a spread request's parts go without (a part's failure fails its request).
    fresh: the ids are the producer's own new random ones (common.request.new_request_id), which the script
        does not look up; False: ids a caller chose, each checked unused (ids are never reused).
    Raises whatever a request cannot be encoded with (the caller's own fault, before any I/O)."""
    fields = rqjobs.rq_fields(queue, requests, retry)
    jobs: list = [len(requests)]
    for request, rq_job in zip(requests, fields):
        # the reply stream beside rq's fields too: an answer reaches its waiter even when `data` is unreadable
        pairs = [item for pair in rq_job.items() for item in pair]
        pairs += ["reply_to", request.reply_to] if request.reply_to else []
        jobs += [request.id, "0" if fresh else "1", estimate_tokens(request), len(pairs) // 2, *pairs]
    return Enqueue(queue, at_front, max_depth or 0, jobs)


def round_args(works: list[Enqueue], announce: bool = True) -> tuple[list[str], list]:
    """(KEYS, ARGV) of one enqueue script run for callers whose enqueues share a script (Enqueue.same_script);
    `announce`: also list the queue in rq:queues (a producer's first enqueue on it)."""
    first = works[0]
    announce = announce and not keys.tag_of(first.queue)
    args: list = ["1" if first.front else "0", first.max_depth, keys.JOB_KEY_TTL, "1" if announce else "0"]
    for work in works:
        args += work.jobs
    return first.keys, args


def enqueue(connection: redis.Redis, work: Enqueue, announce: bool = True) -> None:
    """Run an enqueue; raises DuplicateRequestError (an id in use) or QueueFull, having written nothing."""
    check_enqueued(scripts.ENQUEUE(connection, *round_args([work], announce))[0])


def check_enqueued(reply: list) -> None:
    """Raise what one caller's reply of an enqueue script says went wrong (see `enqueue`)."""
    code = int(reply[0])
    if code == 0:
        raise DuplicateRequestError(f"request id {_str(reply[1])} is already in use: ids are never reused")
    if code == -1:
        raise QueueFull(int(reply[1]))


# -- a worker's claims on one queue ---------------------------------------------------------------------

def _ttl(raw, default: int, bound: int) -> int:
    """A job's own TTL when it is a positive whole number within `bound`, else the default."""
    try:
        value = int(raw)
    except (TypeError, ValueError):
        return default
    return value if 0 < value <= bound else default


def _str(raw) -> str:
    return raw.decode("utf-8", "backslashreplace") if isinstance(raw, bytes) else str(raw)


class RqSchema:
    """The claim scripts bound to one queue and one worker name; `lease` seconds per claim (keys.py);
    `records`: what they write of rq's own bookkeeping, `lean` or `full` (the worker's --rq-records,
    docs/capacity.md)."""

    def __init__(self, connection: redis.Redis, queue: str, worker_name: str, *, result_ttl: int,
                 lease: float = keys.LEASE_SECONDS, records: str = RQ_RECORDS[0]):
        if records not in RQ_RECORDS:
            raise ValueError(f"unknown rq records {records!r}: one of {', '.join(RQ_RECORDS)}")
        self.records = records
        self.known_empty = False  # whether the last take that read this queue left it empty
        self.connection = connection
        self.worker_name = worker_name
        self.result_ttl = result_ttl
        self.lease = lease
        self.queue = queue
        self.queue_key = keys.rq_queue_key(queue)
        self.tokens_key = keys.queued_tokens_key(queue)
        self.wip_key = keys.rq_wip_key(queue)
        self.worker_keys = [keys.rq_worker_key(worker_name), keys.rq_worker_executions_key(worker_name),
                            keys.rq_suspended_key(keys.tag_of(queue))]
        self.level_keys = [self.queue_key, self.wip_key, keys.rq_canceled_key(queue), self.tokens_key]
        self.finish_keys = [self.queue_key, self.wip_key, keys.rq_finished_key(queue), keys.rq_failed_key(queue),
                            keys.rq_worker_key(worker_name), keys.rq_worker_executions_key(worker_name)]

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
                ttl = taken.failure_ttl or keys.FAILURE_TTL
            others += [taken.id, taken.execution, answer.outcome.value, answer.blob, reply_to, payload, exc_info, ttl,
                       "1" if answer.only_if_absent else "0", taken.started, "1" if taken.options else "0"]
        args = [self.worker_name, f"{stamp.timestamp():.6f}", rq_time(stamp), f"{working_seconds:.6f}",
                self.result_ttl, self.records, len(stored), *served, *others]
        try:
            reply = self._finish(stored, args)
        except redis.exceptions.NoScriptError:  # the server lost its scripts (a restart): again, by source
            reply = self._finish(stored, args, by_source=True)
        return Finished(*(int(n) for n in reply[:4]), [(_str(i), _str(why)) for i, why in reply[4:]])

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
        args: list = [f"{stamp.timestamp():.6f}", rq_time(stamp), keys.LEASE_GRACE, self.records]
        for taken in held:
            args += [taken.id, taken.execution, self.lease]
        return int(scripts.REFRESH(self.connection, [self.wip_key], args))

    def recover(self, limit: int = keys.RECOVER_LIMIT) -> list[Recovered]:
        """Requeue, at the queue's head, up to `limit` jobs whose lease lapsed (any worker's)."""
        args = [keys.LEASE_GRACE, limit, rq_time(datetime.now(timezone.utc)), keys.JOB_KEY_TTL]
        keys_ = [self.queue_key, self.wip_key, self.tokens_key] + ([] if keys.tag_of(self.queue) else [keys.RQ_QUEUES])
        return [Recovered(_str(i), float(overdue), _str(owner))
                for i, overdue, owner in scripts.RECOVER(self.connection, keys_, args)]

    def give_back(self, jobs: list[Taken]) -> int:
        """Return jobs this worker took but never started to the head of the queue, in their order."""
        if not jobs:
            return 0
        args: list = [rq_time(datetime.now(timezone.utc)), keys.JOB_KEY_TTL]
        for taken in jobs:
            args += [taken.id, taken.execution]
        keys_ = [self.queue_key, self.wip_key, keys.rq_worker_executions_key(self.worker_name), self.tokens_key]
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
            keys.JOB_TIMEOUT, first.lease, keys.LEASE_GRACE, keys.CANCELED_TTL, max(0, int(max_tokens)),
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
    job_id, kind = _str(entry[1]), _KINDS.get(entry[2]) or Kind(_str(entry[2]))  # (an unknown kind raises)
    if kind is Kind.CANCELED:  # a reply stream to wake
        return Taken(job_id, kind, data=entry[4], queue=queue, reply_to=_reply_stream(entry[5]),
                     options=entry[6] in _ONE)
    if not (kind is Kind.STARTED or kind is Kind.BAD):
        return Taken(job_id, kind, queue=queue)
    _, _, _, execution, data, timeout, result_ttl, failure_ttl, deliveries, lapses, reason, reply_to, options = entry
    return Taken(job_id, kind, _str(execution), data, float(timeout),
                 _ttl(result_ttl, 0, keys.RESULT_TTL_BOUND) or None,
                 _ttl(failure_ttl, keys.FAILURE_TTL, keys.FAILURE_TTL), started, int(deliveries), int(lapses),
                 queue, _str(reason) if reason else "", _reply_stream(reply_to) if reply_to else None,
                 options in _ONE)


def _reply_stream(raw) -> str | None:
    """A job's `reply_to` field, when it names a reply stream (never any other key: Redis is input)."""
    name = _str(raw)
    return name if keys.is_reply_stream_key(name) else None


# -- what Redis takes ----------------------------------------------------------------------------------

def bulk_limit(connection: redis.Redis) -> int | None:
    """Redis's proto-max-bulk-len: the most bytes one value (one script argument) may have; None where CONFIG
    GET is refused (an ACL user without @dangerous, a managed Redis that renames or hides CONFIG) or says
    nothing. Raises what a Redis that does not answer raises."""
    try:
        found = connection.config_get("proto-max-bulk-len")
    except redis.ResponseError:
        return None
    try:
        value = int(found["proto-max-bulk-len"])
    except (KeyError, TypeError, ValueError):
        return None
    return value if value > 0 else None


# -- answers outside a claim ---------------------------------------------------------------------------

def _publish_args(result: Result, ttl: int, reply_to: str | None, only_if_absent: bool) -> list:
    return [result.id, result.encode(), ttl, "1" if only_if_absent else "0",
            reply_to if keys.is_reply_stream_key(reply_to) else ""]


def publish(connection: redis.Redis, result: Result, ttl: int, reply_to: str | None = None,
            only_if_absent: bool = True, done_with: str | None = None) -> bool:
    """Make `result` visible to its waiters (lib.lua's publish); `done_with`: a key to delete with it (a spread
    request's join state). False if an answer was stored already and `only_if_absent` kept it."""
    return bool(scripts.PUBLISH(connection, [done_with] if done_with else [],
                                _publish_args(result, ttl, reply_to, only_if_absent)))


def cancel(connection: redis.Redis, queue: str, answer: Result, reply_to: str | None) -> bool:
    """True if the request was still queued and is now cancelled, with `answer` published for its waiters."""
    return bool(scripts.CANCEL(connection, *_cancel_args(queue, answer, reply_to)))


async def cancel_async(connection: aioredis.Redis, queue: str, answer: Result, reply_to: str | None) -> bool:
    return bool(await scripts.CANCEL.run_async(connection, *_cancel_args(queue, answer, reply_to)))


def _cancel_args(queue: str, answer: Result, reply_to: str | None) -> tuple[list, list]:
    stamp = datetime.now(timezone.utc).timestamp()
    return ([keys.rq_queue_key(queue), keys.rq_canceled_key(queue), keys.queued_tokens_key(queue)],
            [answer.id, f"{stamp:.6f}", answer.encode(), keys.RESULT_TTL, keys.CANCELED_TTL,
             reply_to if keys.is_reply_stream_key(reply_to) else ""])


async def save_job_options(connection: aioredis.Redis, request_id: str, options: str) -> None:
    """The gateway's answer options of an async job, kept while it waits, then for its result's time."""
    await scripts.SAVE_OPTIONS.run_async(connection, [keys.job_options_key(request_id), keys.result_key(request_id),
                                                      keys.rq_job_key(request_id)],
                                         [options, keys.JOB_TTL + keys.RESULT_TTL])


def withdraw(connection: redis.Redis, model: str, worker_name: str, oldest_beat: float) -> bool:
    """A worker leaves its model's workers; True if it was the last live one (the capabilities went).
    On a Redis Cluster the two keys lie in two slots, so the script's steps run one by one there: an advert
    of another worker between them can lose its capabilities until its next advert (HEARTBEAT_INTERVAL)."""
    if isinstance(connection, redis.cluster.RedisCluster):
        workers = keys.model_workers_key(model)
        connection.zrem(workers, worker_name)
        connection.zremrangebyscore(workers, "-inf", oldest_beat)
        if connection.zcard(workers) > 0:
            return False
        connection.delete(keys.model_key(model))
        connection.delete(workers)
        return True
    return bool(scripts.WITHDRAW(connection, [keys.model_key(model), keys.model_workers_key(model)],
                                 [worker_name, oldest_beat]))


def inflight_attach(connection: redis.Redis, markers: list[str], leaders: list[str], ttl: int) -> list[str]:
    """Per marker: '' (the request given leads it now) or the id of the request it follows."""
    return attach_reply(scripts.INFLIGHT_ATTACH(connection, markers, [ttl, *leaders]))


def attach_reply(reply: list) -> list[str]:
    """The in-flight attach script's reply, per marker ('' or a leader's id; checked where it is used)."""
    return [_str(leader) for leader in reply]


def inflight_release(connection: redis.Redis, markers: list[str], leaders: list[str]) -> int:
    return int(scripts.INFLIGHT_RELEASE(connection, markers, leaders))


@dataclass
class Joined:
    """What a part's join says: `code` 0 nothing to do, -1 no such spread request, 1 complete (`fields`: the
    join state), 2 a part failed (`error`: the request's error blob), 3 the state is unreadable (`what`)."""

    code: int
    fields: dict[str, bytes] | None = None
    error: bytes = b""
    plan: bytes = b""
    what: str = ""


def join(connection: redis.Redis, request_id: str, index: int, blob: bytes, ok: bool) -> Joined:
    reply = scripts.JOIN(connection, [keys.chunks_key(request_id), keys.result_key(request_id)],
                         [index, blob, "1" if ok else "0"])
    code = int(reply[0])
    if code == 1:
        flat = reply[1]
        return Joined(1, {_str(k): v for k, v in zip(flat[::2], flat[1::2])})
    if code == 2:
        return Joined(2, error=reply[1], plan=reply[2])
    if code == 3:
        return Joined(3, plan=reply[1], what=_str(reply[2]))
    return Joined(code)
