"""Answers outside a worker's claim, each one Lua script (scripts/): a worker's own answers go with its claims'
finish (claims.py).

    publish    an answer outside a claim (an abandoned job, a spread request answered from its parts)
    cancel     a queued request out of its queue, answered "cancelled"
    join       one part of a spread request lands; the last one completes it
    save_job_options  the gateway's answer options of an async job

An answer is published by one Lua function (lib.lua `publish`, or its wake-up half `wake` after the blob's SET in
finish's own write), whichever script ends the request, with one wake-up: through the request's `reply_to`
stream (embedfleet:replies:<producer>) when it has one, else through its notify list (embedfleet:notify:<id>:
BLMOVE onto itself or BLPOP wakes its waiters); never both. A waiter that did not submit the request reads the
job's `reply_to` to know which (producer/client/waiters.py, blocking.py).

A gateway job's answer options (embedfleet:job:<id>: JSON of encoding_format, explicit layout, webhook URL, and
with API keys its owner: a fingerprint of the key, producer/gateway/core/owners.py) are kept JOB_TTL + RESULT_TTL
while the job waits; saving them marks the job (`options`), and the answer of a marked job gives them the
result's TTL in the same script (a job taken before its mark keeps them their full time; a job dropped unserved
outlives them by RESULT_TTL).

A spread request's join state (embedfleet:chunks:<id>, worker/serving/spread.py): `plan` (msgpack: the request,
each chunk's input and token count), `parts`, `done`, `part:<k>` (a part's result blob), `failed` (the first
failed part's error blob); deleted once the request is answered.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

import redis
import redis.asyncio as aioredis

from embedfleet.common.policy import JOB_TTL, RESULT_TTL
from embedfleet.common.protocol import keys, rqkeys, scripts
from embedfleet.common.protocol.records import reply_text
from embedfleet.common.result import Result


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
    return ([rqkeys.rq_queue_key(queue), rqkeys.rq_canceled_key(queue), keys.queued_tokens_key(queue)],
            [answer.id, f"{stamp:.6f}", answer.encode(), RESULT_TTL, rqkeys.CANCELED_TTL,
             reply_to if keys.is_reply_stream_key(reply_to) else ""])


async def save_job_options(connection: aioredis.Redis, request_id: str, options: str) -> None:
    """The gateway's answer options of an async job, kept while it waits, then for its result's time."""
    await scripts.SAVE_OPTIONS.run_async(connection, [keys.job_options_key(request_id), keys.result_key(request_id),
                                                      rqkeys.rq_job_key(request_id)],
                                         [options, JOB_TTL + RESULT_TTL])


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
        return Joined(1, {reply_text(k): v for k, v in zip(flat[::2], flat[1::2])})
    if code == 2:
        return Joined(2, error=reply[1], plan=reply[2])
    if code == 3:
        return Joined(3, plan=reply[1], what=reply_text(reply[2]))
    return Joined(code)
