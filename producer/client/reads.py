"""What the clients read from Redis and what it means, with no I/O of its own.

Each read is a generator: it yields an exchange (one round trip) of commands per Redis ({URL: [command, ...]},
a command being what `pipe.execute_command(*command)` sends), is sent the replies ({URL: [reply, ...]}, an
error reply in place of its value) and returns what they mean. Producer runs each exchange as one pipeline per
Redis, AsyncProducer as one asyncio pipeline per Redis, all at once (producer/client/exchanges.py): both clients read
the same keys and make the same sense of them, and only the way the bytes move differs.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import TypeVar

import redis
from rq.job import JobStatus

from embedfleet.common.errors import CancelledError, DecodeError, NotFoundError, echo
from embedfleet.common.names import valid_request_id
from embedfleet.common.policy import ADVERTISE_TTL
from embedfleet.common.protocol import keys, rqkeys
from embedfleet.common.protocol.jobdata import args_reply_to, inflate
from embedfleet.common.redisurls import is_cluster
from embedfleet.common.result import Result
from embedfleet.common.shards import ShardMap
from embedfleet.producer.client.core import (SERIALIZER, job_state, model_of_queue, model_queue, parse_models,
                                             parse_worker_info, read_result, result_state)
from embedfleet.producer.client.remembered import Placements

T = TypeVar("T")
Exchange = dict[str, list[tuple]]
Read = Generator[Exchange, dict[str, list], T]

def ok(reply):
    """A reply, or the error Redis answered in its place raised: for a read that cannot go on without it."""
    if isinstance(reply, Exception):
        raise reply
    return reply


def wrong_type(reply) -> bool:
    """Whether `reply` is Redis's WRONGTYPE refusal: the key holds another type than the command reads (a key
    of ours written by someone else: Redis is input). A read of a record there finds none of ours."""
    return isinstance(reply, redis.ResponseError) and "WRONGTYPE" in str(reply)


def text(raw) -> str:
    """A name read from Redis; what is not UTF-8 keeps its place, replaced (a name is input)."""
    return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)


DOWN = (redis.ConnectionError, redis.TimeoutError)  # what producer/client/exchanges.py answers for a Redis it
# could not reach


def answered(replies: dict[str, list]) -> dict[str, list]:
    """The replies of the Redis that answered an exchange (a partition that is down is left out), or the first
    one's error raised when none did."""
    up = {url: got for url, got in replies.items() if not any(isinstance(r, DOWN) for r in got)}
    if not up:
        ok(next(iter(replies.values()))[0])
    return up


def model_names(shards: ShardMap) -> Read[dict[str, list[str]]]:
    """{URL: the model names advertised there, sorted}, each on its own shard only (a worker on the wrong
    shard serves no one). A partition that is down while its models have others is left out."""
    names, _ = yield from advertised(shards)
    return names


def advertised(shards: ShardMap) -> Read[tuple[dict[str, list[str]], dict[str, Exception]]]:
    """(model_names' {URL: names}, {URL: its error} of each partition left out because it could not be reached).
    Any other Redis that cannot be reached raises its error: the fleet cannot do without it."""
    urls = shards.urls()
    replies = yield {url: [("SMEMBERS", keys.MODELS_KEY)] for url in urls}
    up = answered(replies)
    names = {url: sorted(n for n in map(text, ok(replies[url][0])) if shards.owns(url, n))
             for url in urls if url in up or not shards.spare(url)}
    return names, {url: replies[url][0] for url in urls if url not in names}


def models(shards: ShardMap) -> Read[tuple[dict, set[str]]]:
    """(models served by a live worker -> their capabilities, every model name ever advertised)."""
    names = yield from model_names(shards)
    asked = {url: _mget(url, [keys.model_key(name) for name in found]) for url, found in names.items() if found}
    adverts = (yield asked) if asked else {}
    served, known = {}, set()
    for url, found in names.items():
        if found:
            served.update(parse_models(found, _values(url, adverts[url])))
        known.update(found)
    return served, known


def live_workers(shards: ShardMap, model: str, now: float) -> Read[int]:
    """Live workers of `model` over its partitions that answer, each counted once (`worker_names`)."""
    names = yield from worker_names(shards, model, now)
    return sum(map(len, names.values()))


def worker_names(shards: ShardMap, model: str, now: float) -> Read[dict[str, list[str]]]:
    """{URL: the names of `model`'s live workers first listed there}, over its partitions that answer. A name is
    listed once: partitions on one Redis Cluster (`#p0`, `#p1`) share the model's list of workers (their queues
    have a tag each, its adverts none), so each of them lists every worker of all of them."""
    replies = yield {url: [("ZRANGEBYSCORE", keys.model_workers_key(model), now - ADVERTISE_TTL, "+inf")]
                     for url in shards.partitions(model)}
    seen: set[str] = set()
    names: dict[str, list[str]] = {}
    for url, got in answered(replies).items():
        names[url] = [name for name in map(text, ok(got[0])) if name not in seen]
        seen.update(names[url])
    return names


def workers(shards: ShardMap, model: str, now: float) -> Read[list[dict]]:
    """The live workers of `model` on its partitions that answer, each once (`worker_names`), with what it
    advertised (core.parse_worker_info)."""
    names = yield from worker_names(shards, model, now)
    asked = {url: _mget(url, [keys.worker_info_key(name) for name in found]) for url, found in names.items() if found}
    if not asked:
        return []
    replies = yield asked
    return [info for url in asked for name, blob in zip(names[url], _values(url, replies[url]))
            if (info := parse_worker_info(name, blob)) is not None]


def _mget(url: str, wanted: list[str]) -> list[tuple]:
    """The commands that read `wanted` in one round trip: one MGET, or on a Redis Cluster (where keys of several
    models or partitions lie in several slots) one GET each."""
    return [("GET", key) for key in wanted] if is_cluster(url) else [("MGET", *wanted)]


def _values(url: str, replies: list) -> list:
    """The values `_mget`'s commands read, in order."""
    return [ok(reply) for reply in replies] if is_cluster(url) else ok(replies[0])


def queue_depth(shards: ShardMap, model: str) -> Read[int]:
    """Requests queued for `model` at the default priority, summed over its partitions that answer."""
    replies = yield {url: [("LLEN", rqkeys.rq_queue_key(model_queue(url, model)))] for url in shards.partitions(model)}
    return sum(ok(got[0]) for got in answered(replies).values())


def locate(shards: ShardMap, placed: Placements, request_id: str) -> Read[str]:
    """The URL of the shard that holds `request_id`: where it was sent, else whichever has its result or
    job (ids are unique across the fleet), else the default Redis. No exchange at all unless sharded. Not found
    while a Redis is down: that Redis's error (the id may be there)."""
    if not shards:
        return shards.default
    url = placed.get(request_id)
    if url is not None:
        return url
    if valid_request_id(request_id):
        urls = shards.urls()
        replies = yield {u: [("EXISTS", keys.result_key(request_id), rqkeys.rq_job_key(request_id))] for u in urls}
        up = answered(replies)
        for url in up:
            if ok(replies[url][0]):
                placed.remember([request_id], url)
                return url
        for url in urls:
            ok(replies[url][0])  # a Redis that is down may hold it: its error
    return shards.default


def locate_all(shards: ShardMap, placed: Placements, request_ids: list[str]) -> Read[list[str]]:
    """`locate` of each id, in order: no exchange unless sharded, then one per id the client did not send."""
    urls = []
    for request_id in request_ids:
        urls.append((yield from locate(shards, placed, request_id)))
    return urls


def status(shards: ShardMap, placed: Placements, request_id: str) -> Read[str]:
    """queued | started | finished | failed | cancelled | not_found, in one exchange on the request's shard (two
    for a job finished without a result: a spread request's)."""
    url = yield from locate(shards, placed, request_id)
    valid = valid_request_id(request_id)  # no other id is one of ours (and rq refuses to look it up)
    commands = [("GET", keys.result_key(request_id))]
    if valid:
        commands.append(("HGET", rqkeys.rq_job_key(request_id), "status"))
    replies = (yield {url: commands})[url]
    result = read_result(request_id, ok(replies[0]))
    if result is not None:
        return result_state(result)
    if not valid or wrong_type(replies[1]):  # (its job key holding no hash: no job of ours)
        return "not_found"
    raw = ok(replies[1])
    try:
        state = job_state(JobStatus(raw.decode()) if raw else None)
    except (ValueError, UnicodeDecodeError):  # no status rq knows: not an rq job of ours
        return "not_found"
    if state == "finished":  # asked only now: the README's producer ACL grants no chunks key (its ACL LOG stays clean)
        spread = (yield {url: [("EXISTS", keys.chunks_key(request_id))]})[url]
        if ok(spread[0]):
            return "started"  # a long request spread over the fleet: its job is done, its parts still run
    return state


@dataclass(frozen=True)
class Cancel:
    """What a cancel hands to common.protocol.answering.cancel: where, which queue, the answer, its stream."""

    url: str
    queue: str
    answer: Result
    reply_to: str | None


def cancel(shards: ShardMap, placed: Placements, request_id: str) -> Read[Cancel | None]:
    """The cancel of `request_id`, read from its job; None for a request answered already (a served job's hash
    may be gone: its result is its record); NotFoundError for an id with neither."""
    if not valid_request_id(request_id):
        raise NotFoundError(f"no request with id {echo(repr(request_id))}")
    url = yield from locate(shards, placed, request_id)
    # HGETs, not one HMGET: the README's producer ACL grants HGET
    replies = yield {url: [*(("HGET", rqkeys.rq_job_key(request_id), name) for name in ("origin", "reply_to", "data")),
                           ("EXISTS", keys.result_key(request_id))]}
    if wrong_type(replies[url][0]):  # its job key holds no hash: no job of ours
        replies[url][:3] = [None, None, None]
    origin, reply_to, data, answered = map(ok, replies[url])
    if data is None:  # rq's own test for a job (Job.fetch): a hash without data is none
        if answered:
            return None
        raise NotFoundError(f"no request with id {request_id}")
    queue = text(origin or b"")
    answer = Result.failure(request_id, model_of_queue(queue), CancelledError(
        f"request {request_id} was cancelled before a worker took it"))
    return Cancel(url, queue, answer, reply_stream(reply_to, data))


def reply_stream(field, data: bytes) -> str | None:
    """The reply stream a job names: its `reply_to` field (every enqueue writes it), else the one in the
    request inside its data (a job of an older producer); None for anything else (a job is input)."""
    if field is not None and keys.is_reply_stream_key(field):
        return text(field)
    try:
        raw = inflate(data)  # capped: a job is input
    except DecodeError:
        return None
    try:
        job = SERIALIZER.loads(raw)
    except Exception:  # noqa: BLE001 - any undecodable data names no stream
        return None
    return args_reply_to(job[2]) if isinstance(job, list) and len(job) == 4 else None
