"""`embedfleet failed list|show|requeue|purge`: the operator's view of rq's failed registries, with our
reason (poison, a bad message, an internal error whose retries are spent) and each request's summary."""

from __future__ import annotations

import argparse
import zlib
from dataclasses import dataclass

import redis
from pydantic import Field
from rq import Queue

from embedfleet.common.names import untagged
from embedfleet.common.protocol import keys
from embedfleet.common.protocol.jobdata import inflate
from embedfleet.common.protocol.taggedjob import TaggedJob
from embedfleet.common.codec import unpackb
from embedfleet.common.config import Settings
from embedfleet.common.errors import NotFoundError, ValidationError
from embedfleet.common.redisclient import cluster_tag, connect
from embedfleet.common.request import EmbedRequest
from embedfleet.common.serializer import MsgpackSerializer

DOC = """Failed requests, per model queue (rq's failed registry).

  list     one line per failed request: id, model, when, why
  show     one request in full: reason, deliveries, lapses, the request's inputs and parameters
  requeue  put failed requests back at the head of their queue (their stored error answer is removed, so a
           waiter gets the new answer); IDs, or every failed request of --model with --all
  purge    delete failed requests (job, registry entry and error answer) of --model, or all models
"""


class FailedSettings(Settings):
    model: str | None = Field(None, description="served model name; default: every model's queue")


@dataclass
class Failed:
    id: str
    model: str
    ended_at: str
    reason: str
    deliveries: int
    lapses: int
    summary: str


def run(argv: list[str]) -> int:
    parser = FailedSettings.parser("embedfleet failed", DOC)
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("action", choices=["list", "show", "requeue", "purge"])
    parser.add_argument("ids", nargs="*", help="request ids (show, requeue)")
    parser.add_argument("--all", action="store_true", help="requeue: every failed request of --model")
    values = vars(parser.parse_args(argv))
    action, ids, every = values.pop("action"), values.pop("ids"), values.pop("all")
    settings = FailedSettings.from_values(parser, values)
    connection = connect(settings.redis_url)
    try:
        queues = _queues(connection, settings.model, cluster_tag(settings.redis_url, settings.model or ""))
        if action == "list":
            return _list(connection, queues)
        if action == "show":
            if len(ids) != 1:
                raise ValidationError("`failed show` takes one request id; `embedfleet failed list` lists them")
            return _show(connection, queues, ids[0])
        if action == "requeue":
            if not ids and not (every and settings.model):
                raise ValidationError("`failed requeue` takes request ids, or --all with --model M")
            return _requeue(connection, queues, ids)
        return _purge(connection, queues)
    finally:
        connection.close()


def _queues(connection: redis.Redis, model: str | None, tag: str) -> list[Queue]:
    """The model's queue (on a Redis Cluster: `tag`, its hash tag; the URL's #partition's), or every model's.
    TaggedJob: rq's registries read a cluster's jobs (tagged ids) through it."""
    if model:
        names = [keys.queue_name(model, tag=tag)]
    else:
        names = sorted(q.name for q in Queue.all(connection=connection, serializer=MsgpackSerializer)
                       if untagged(q.name).startswith(keys.queue_name("")))
    return [Queue(name, connection=connection, serializer=MsgpackSerializer, job_class=TaggedJob) for name in names]


def _model(queue: Queue) -> str:
    return untagged(queue.name)[len(keys.queue_name("")):]


def _read(connection: redis.Redis, queue: Queue, job_id: str) -> Failed | None:
    fields = connection.hgetall(TaggedJob.key_for(job_id))
    if not fields:
        return None
    text = {k.decode(): v for k, v in fields.items()}
    reason = ""
    if text.get("exc_info"):
        try:
            reason = zlib.decompress(text["exc_info"]).decode("utf-8", "replace")
        except zlib.error:
            reason = text["exc_info"].decode("utf-8", "replace")
    return Failed(job_id, _model(queue), _str(text.get("ended_at")), reason.strip() or "(no reason recorded)",
                  int(text.get("deliveries") or 0), int(text.get("lapses") or 0), _summary(text.get("data")))


def _str(raw: bytes | None) -> str:
    return raw.decode("utf-8", "replace") if raw else "-"


def _summary(data: bytes | None) -> str:
    """What the request asked for, in one line; never the whole input."""
    try:
        _, _, args, _ = unpackb(inflate(data))
        request = EmbedRequest.decode(args[0])
    except Exception as exc:  # noqa: BLE001 - the data is often why it failed: say so, do not crash
        return f"undecodable job data ({type(exc).__name__}, {len(data or b'')} bytes)"
    first = request.inputs[0] if request.inputs else ""
    shown = repr(first[:60] + ("..." if len(first) > 60 else "")) if isinstance(first, str) else \
        f"{len(first)} token ids"
    params = request.params.model_dump(exclude_defaults=True)
    return f"{len(request.inputs)} input(s), first {shown}{f', params {params}' if params else ''}"


def _failed(connection: redis.Redis, queues: list[Queue]):
    for queue in queues:
        for job_id in queue.failed_job_registry.get_job_ids():
            found = _read(connection, queue, job_id)
            if found is not None:
                yield queue, found


def _list(connection: redis.Redis, queues: list[Queue]) -> int:
    count = 0
    for _, failed in _failed(connection, queues):
        print(f"{failed.id}  {failed.model}  {failed.ended_at}  {failed.reason.splitlines()[-1][:160]}")
        count += 1
    print(f"{count} failed request(s)" if count else "no failed requests")
    return 0


def _find(connection: redis.Redis, queues: list[Queue], job_id: str) -> tuple[Queue, Failed]:
    for queue in queues:
        if queue.failed_job_registry.get_job_ids().count(job_id):
            found = _read(connection, queue, job_id)
            if found is not None:
                return queue, found
    raise NotFoundError(f"no failed request {job_id}; `embedfleet failed list` lists them")


def _show(connection: redis.Redis, queues: list[Queue], job_id: str) -> int:
    _, failed = _find(connection, queues, job_id)
    print(f"id          {failed.id}\nmodel       {failed.model}\nfailed at   {failed.ended_at}\n"
          f"deliveries  {failed.deliveries} (workers died holding it: {failed.lapses})\n"
          f"request     {failed.summary}\nreason      {failed.reason}")
    return 0


def _requeue(connection: redis.Redis, queues: list[Queue], ids: list[str]) -> int:
    targets = [_find(connection, queues, i) for i in ids] if ids else list(_failed(connection, queues))
    for queue, failed in targets:
        with connection.pipeline() as pipe:  # a fresh start: no lapses, no stored error to answer with
            pipe.hdel(TaggedJob.key_for(failed.id), "lapses", "deliveries")
            # one DEL of both (one slot: the id's); redis-py's cluster pipeline refuses a delete() of two keys
            pipe.execute_command("DEL", keys.result_key(failed.id), keys.notify_key(failed.id))
            pipe.execute()
        queue.failed_job_registry.requeue(failed.id, at_front=True)
        print(f"requeued {failed.id} at the head of {queue.name}")
    if not targets:
        print("no failed requests")
    return 0


def _purge(connection: redis.Redis, queues: list[Queue]) -> int:
    count = 0
    for _, failed in list(_failed(connection, queues)):
        TaggedJob.fetch(failed.id, connection=connection, serializer=MsgpackSerializer).delete()  # rq's own way
        connection.delete(keys.result_key(failed.id), keys.notify_key(failed.id))
        count += 1
    print(f"purged {count} failed request(s)")
    return 0
