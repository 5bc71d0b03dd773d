"""Batch dequeue for rq queues: take up to N job ids in one round trip, then fetch them in one more.

rq 3.0 moves each dequeued id from `rq:queue:<q>` into `rq:queue:<q>:intermediate` (BLMOVE) so that a worker
dying before the job reaches the started registry (`rq:wip:<q>`) loses nothing: rq's maintenance fails
ids that sit in the intermediate list for over a minute without a started-registry entry. The batch keeps
that invariant for every id it takes: each one is LMOVEd, never LPOPped.
"""

from __future__ import annotations

import logging
from redis import Redis
from rq.job import Job

from worker.bookkeeping import Item

log = logging.getLogger(__name__)

# LMOVE up to ARGV[1] ids from the queue (left) to the intermediate list (right), like rq's BLMOVE.
_TAKE = """
local ids = {}
for i = 1, tonumber(ARGV[1]) do
  local id = redis.call('LMOVE', KEYS[1], KEYS[2], 'LEFT', 'RIGHT')
  if not id then break end
  ids[i] = id
end
return ids
"""


def take_batch(connection: Redis, queue_key: str, intermediate_key: str, max_jobs: int,
               timeout: int | None, before=None) -> list[str]:
    """Move up to `max_jobs` ids into the intermediate list, in one round trip.

    With a `timeout` the first id is awaited with BLMOVE (seconds; 0 is not allowed, as in rq), the rest are
    taken by a Lua loop queued behind it on the same connection; without one nothing blocks. `before(pipe)`
    may queue commands (the worker's heartbeat) ahead of the dequeue in the same round trip.
    """
    with connection.pipeline(transaction=False) as pipe:  # MULTI would turn BLMOVE into a plain LMOVE
        if before is not None:
            before(pipe)
        if timeout is not None:
            pipe.blmove(queue_key, intermediate_key, timeout, "LEFT", "RIGHT")
        pipe.eval(_TAKE, 2, queue_key, intermediate_key, max_jobs - (timeout is not None))
        replies = pipe.execute()
    ids = list(replies[-1])
    if timeout is not None and replies[-2] is not None:
        ids.insert(0, replies[-2])
    return [i.decode() if isinstance(i, bytes) else i for i in ids]


def fetch_jobs(connection: Redis, job_ids: list[str], serializer, job_class: type[Job] = Job) -> list[Item]:
    """Every job hash of the batch, in one round trip."""
    if not job_ids:
        return []
    with connection.pipeline(transaction=False) as pipe:
        for job_id in job_ids:
            pipe.hgetall(job_class.key_for(job_id))
        hashes = pipe.execute()
    return [_restore(connection, job_id, raw, serializer, job_class) for job_id, raw in zip(job_ids, hashes)]


def _restore(connection, job_id, raw, serializer, job_class) -> Item:
    if not raw:  # expired or deleted since it was enqueued: rq's dequeue skips such ids too
        return Item(job_id, None)
    try:
        job = job_class(job_id, connection=connection, serializer=serializer)
    except (TypeError, ValueError) as exc:  # an id no rq enqueue could have written
        return Item(job_id, None, unreadable=f"invalid job id: {exc}")
    try:
        job.restore(raw)
    except Exception as exc:  # e.g. a hash without `data`: still fail it visibly, under its id
        log.warning("job %s: unreadable job hash: %s", job_id, exc)
        return Item(job_id, job, unreadable=f"unreadable rq job hash: {exc!r}")
    return Item(job_id, job)
