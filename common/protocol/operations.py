"""Every write of the protocol, each one Lua script (common/protocol/scripts/): nothing else in the tree writes
rq's job, execution and registry keys or a request's answer.

    enqueue    requests -> rq jobs on a queue, all or none, each id new, within a depth limit
    take       queue -> started, for up to N jobs, atomically: no id is ever held outside a registry; each
               claim is a lease (its started-registry score) and each take counts a delivery. One take
               reads several queues in a given order (a model's priority levels, worker/serving/levels.py)
    finish     answer (publish) + FINISHED / FAILED / requeued / CANCELED, only while the claim stands
    refresh    renew a held round's leases (the worker's heartbeat)
    recover    requeue, at the queue's head, the jobs whose lease lapsed (their worker died): any live
               worker runs it, the script is atomic, so each lapsed claim is requeued exactly once
    give_back  a draining or yielding worker's jobs not yet on the device, back to the queue's head
    cancel     a queued request out of its queue, answered "cancelled"
    join       one part of a spread request lands; the last one completes it
    publish    an answer outside a claim (an abandoned job, a spread request answered from its parts)

An answer is published by one Lua function (lib.lua `publish`), whichever script ends the request.
Leases (see keys.py): a claim's score is lease expiry + LEASE_GRACE, on the Redis server's clock (TIME),
so rq's own StartedJobRegistry.cleanup sees a lapsed claim only LEASE_GRACE seconds after `recover` does.
Everything the scripts read from Redis is judged before their first write (tests/test_protocol_hostile.py).
"""

from __future__ import annotations

import zlib
from base64 import b64encode
from dataclasses import dataclass
from datetime import datetime, timezone
from uuid import uuid4

import redis
import redis.asyncio as aioredis
from rq import Queue, Retry

from common.errors import DuplicateRequestError
from common.protocol import keys, scripts
from common.protocol.records import Answer, Finished, Kind, Outcome, Recovered, Taken, rq_time
from common.request import EmbedRequest
from common.result import Result
from common.scheduling import estimate_tokens
from common.serializer import MsgpackSerializer

# -- enqueue ------------------------------------------------------------------------------------------

# rq builds its job hash on a pipeline of a client that never connects; the fields it would write are read
# off that pipeline and handed to the enqueue script (so the jobs are byte for byte rq's own).
_RECORDER = redis.Redis(host="embedfleet-recorder.invalid")
_RQ_VERSION = (7, 0, 0)  # what rq would read with INFO; it only picks commands, never fields


class QueueFull(Exception):
    """The queue holds `depth` ids and the requests would pass its limit (the caller says it its way)."""

    def __init__(self, depth: int):
        super().__init__(depth)
        self.depth = depth


@dataclass(frozen=True)
class Enqueue:
    """The script's keys and arguments for one enqueue: build once, run sync or async."""

    keys: list[str]
    args: list


def enqueue_args(queue: str, requests: list[EmbedRequest], *, at_front: bool = False, retry: bool = True,
                 max_depth: int | None = None) -> Enqueue:
    """The one builder of jobs, for the sync and async clients and a spread request's parts.

    retry: rq's Retry(max=JOB_RETRIES) (embedding is idempotent: a job whose worker died is retried rather
        than lost); a spread request's parts go without (a part's failure fails its request).
    Raises whatever a request cannot be encoded with (the caller's own fault, before any I/O)."""
    rq = Queue(queue, connection=_RECORDER, serializer=MsgpackSerializer)
    rq.redis_server_version = _RQ_VERSION
    pipe = _RECORDER.pipeline()
    rq.enqueue_many([_job_data(r, retry) for r in requests], pipeline=pipe)
    fields: dict[str, list] = {r.id: [] for r in requests}
    for args, _ in pipe.command_stack:
        if args[0] == "HSET" and args[1].startswith(keys.RQ_JOB_PREFIX):
            fields[args[1][len(keys.RQ_JOB_PREFIX):]].extend(_text(a) for a in args[2:])
    argv: list = ["1" if at_front else "0", max_depth or 0, keys.JOB_TTL]
    for request in requests:
        # the reply stream beside rq's fields too: an answer reaches its waiter even when `data` is unreadable
        pairs = [*fields[request.id], *(("reply_to", request.reply_to) if request.reply_to else ())]
        argv += [request.id, estimate_tokens(request), len(pairs) // 2, *pairs]
    return Enqueue([keys.rq_queue_key(queue), keys.RQ_QUEUES, keys.queued_tokens_key(queue)], argv)


def _job_data(request: EmbedRequest, retry: bool):
    part = request.part_of
    what = f"embed part {part.index + 1} of {part.parts} of {part.parent}" if part else \
        f"embed {len(request.inputs)} input(s) with {request.model}"
    return Queue.prepare_data(
        keys.JOB_FUNC, args=[request.encode()], job_id=request.id, timeout=keys.JOB_TIMEOUT,
        result_ttl=keys.RESULT_TTL, ttl=keys.JOB_TTL, failure_ttl=keys.FAILURE_TTL,
        retry=Retry(max=keys.JOB_RETRIES) if retry else None, description=what)


def _text(value):
    """A field value as rq sends it (enums by value, numbers as they are)."""
    return getattr(value, "value", value)


def enqueue(connection: redis.Redis, work: Enqueue) -> None:
    """Run an enqueue; raises DuplicateRequestError (an id in use) or QueueFull, having written nothing."""
    check_enqueued(scripts.ENQUEUE(connection, work.keys, work.args))


def check_enqueued(reply: list) -> None:
    """Raise what an enqueue script's reply says went wrong (see `enqueue`)."""
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
    """The claim scripts bound to one queue and one worker name; `lease` seconds per claim (keys.py)."""

    def __init__(self, connection: redis.Redis, queue: str, worker_name: str, *, result_ttl: int,
                 lease: float = keys.LEASE_SECONDS):
        self.connection = connection
        self.worker_name = worker_name
        self.result_ttl = result_ttl
        self.lease = lease
        self.queue = queue
        self.queue_key = keys.rq_queue_key(queue)
        self.tokens_key = keys.queued_tokens_key(queue)
        self.wip_key = keys.rq_wip_key(queue)
        self.worker_keys = [keys.rq_worker_key(worker_name), keys.rq_worker_executions_key(worker_name),
                            keys.RQ_SUSPENDED]
        self.level_keys = [self.queue_key, self.wip_key, keys.rq_canceled_key(queue), self.tokens_key]
        self.finish_keys = [self.queue_key, self.wip_key, keys.rq_finished_key(queue), keys.rq_failed_key(queue),
                            keys.rq_worker_key(worker_name), keys.rq_worker_executions_key(worker_name)]

    def take(self, max_jobs: int, block: float | None, before=None, max_tokens: int = 0) -> tuple[bool, list[Taken]]:
        """(suspended, taken ids) from this queue alone; see `take_from`."""
        return take_from([self], max_jobs, block, before, max_tokens)

    def finish(self, answers: list[Answer], working_seconds: float) -> Finished:
        """One script run for the whole list."""
        stamp = datetime.now(timezone.utc)
        args: list = [self.worker_name, f"{stamp.timestamp():.6f}", rq_time(stamp), f"{working_seconds:.6f}",
                      self.result_ttl]
        for answer in answers:
            taken = answer.taken
            if answer.outcome is Outcome.FINISHED:  # no rq result stream (finish.lua says why)
                payload, exc_info = b"", b""
                ttl = taken.result_ttl or self.result_ttl  # rq's 0 / -1 are not honoured (see BatchWorker)
            else:
                payload = b64encode(zlib.compress(answer.reason.encode()))
                exc_info = zlib.compress(answer.reason.encode())
                ttl = taken.failure_ttl or keys.FAILURE_TTL
            args += [taken.id, taken.execution, answer.outcome.value, answer.blob,
                     answer.reply_to if keys.is_reply_stream_key(answer.reply_to) else "", payload, exc_info, ttl,
                     "1" if answer.only_if_absent else "0", taken.started]
        reply = scripts.FINISH(self.connection, self.finish_keys, args)
        return Finished(*(int(n) for n in reply[:4]), [(_str(i), _str(why)) for i, why in reply[4:]])

    def refresh(self, held: list[Taken]) -> int:
        """Renew the lease of each job still held; returns how many were."""
        stamp = datetime.now(timezone.utc)
        args: list = [f"{stamp.timestamp():.6f}", rq_time(stamp), keys.LEASE_GRACE]
        for taken in held:
            args += [taken.id, taken.execution, self.lease]
        return int(scripts.REFRESH(self.connection, [self.wip_key], args))

    def recover(self, limit: int = keys.RECOVER_LIMIT) -> list[Recovered]:
        """Requeue, at the queue's head, up to `limit` jobs whose lease lapsed (any worker's)."""
        args = [keys.LEASE_GRACE, limit, rq_time(datetime.now(timezone.utc))]
        keys_ = [self.queue_key, self.wip_key, self.tokens_key]
        return [Recovered(_str(i), float(overdue), _str(owner))
                for i, overdue, owner in scripts.RECOVER(self.connection, keys_, args)]

    def give_back(self, jobs: list[Taken]) -> int:
        """Return jobs this worker took but never started to the head of the queue, in their order."""
        if not jobs:
            return 0
        args: list = [rq_time(datetime.now(timezone.utc))]
        for taken in jobs:
            args += [taken.id, taken.execution]
        keys_ = [self.queue_key, self.wip_key, keys.rq_worker_executions_key(self.worker_name), self.tokens_key]
        return int(scripts.GIVE_BACK(self.connection, keys_, args))


def take_from(schemas: list[RqSchema], max_jobs: int, block: float | None, before=None,
              max_tokens: int = 0) -> tuple[bool, list[Taken]]:
    """(suspended, taken ids): up to `max_jobs` from the schemas' queues in their order (the first queue is
    emptied before the next is read), and no more jobs once their estimated tokens reach `max_tokens` (0: no
    limit; at least one job is taken), in one atomic script. With `block` seconds, first wait until the
    first queue has an id, without taking it (BLMOVE of the queue onto itself, LEFT to LEFT, moves
    nothing), then take in the same round trip. `before(pipe)` may queue commands ahead (the worker's rq
    heartbeat). The schemas share one connection and worker name."""
    first = schemas[0]
    stamp = datetime.now(timezone.utc)
    args = [max_jobs, first.worker_name, f"{stamp.timestamp():.6f}", rq_time(stamp), uuid4().hex[:24],
            keys.JOB_TIMEOUT, first.lease, keys.LEASE_GRACE, keys.CANCELED_TTL, max(0, int(max_tokens))]
    keys_ = first.worker_keys + [key for schema in schemas for key in schema.level_keys]
    try:
        suspended, entries, _ = _take(first, keys_, args, block, before)
    except redis.exceptions.NoScriptError:  # the server lost its scripts (a restart): take again by source
        suspended, entries, _ = _take(first, keys_, args, None, before, by_source=True)
    return bool(suspended), [_taken(entry, args[2], schemas) for entry in entries]


def _take(first: RqSchema, keys_: list[str], args: list, block: float | None, before, by_source=False) -> list:
    with first.connection.pipeline(transaction=False) as pipe:  # MULTI would not block
        if before is not None:
            before(pipe)
        if block is not None:
            pipe.blmove(first.queue_key, first.queue_key, block, "LEFT", "LEFT")
        scripts.TAKE.queue(pipe, keys_, args, by_source)
        return pipe.execute()[-1]


def _taken(entry: list, started: str, schemas: list[RqSchema]) -> Taken:
    queue = schemas[int(entry[0]) - 1].queue
    job_id, kind = _str(entry[1]), Kind(_str(entry[2]))
    if kind is Kind.CANCELED:  # a reply stream to wake
        return Taken(job_id, kind, data=entry[4], queue=queue, reply_to=_reply_stream(entry[5]))
    if not (kind is Kind.STARTED or kind is Kind.BAD):
        return Taken(job_id, kind, queue=queue)
    _, _, _, execution, data, timeout, result_ttl, failure_ttl, deliveries, lapses, reason, reply_to = entry
    return Taken(job_id, kind, _str(execution), data, float(timeout),
                 _ttl(result_ttl, 0, keys.RESULT_TTL_BOUND) or None,
                 _ttl(failure_ttl, keys.FAILURE_TTL, keys.FAILURE_TTL), started, int(deliveries), int(lapses),
                 queue, _str(reason), _reply_stream(reply_to))


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
    await scripts.SAVE_OPTIONS.run_async(connection, [keys.job_options_key(request_id), keys.result_key(request_id)],
                                         [options, keys.JOB_TTL + keys.RESULT_TTL])


def withdraw(connection: redis.Redis, model: str, worker_name: str, oldest_beat: float) -> bool:
    """A worker leaves its model's workers; True if it was the last live one (the capabilities went)."""
    return bool(scripts.WITHDRAW(connection, [keys.model_key(model), keys.model_workers_key(model)],
                                 [worker_name, oldest_beat]))


def inflight_attach(connection: redis.Redis, markers: list[str], leaders: list[str], ttl: int) -> list[str]:
    """Per marker: '' (the request given leads it now) or the id of the request it follows."""
    return [_str(leader) for leader in scripts.INFLIGHT_ATTACH(connection, markers, [ttl, *leaders])]


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
