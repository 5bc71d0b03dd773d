"""Onto a model's queues: enqueue (scripts/enqueue.lua), requests -> rq jobs on a queue, each caller's all or none,
each id new, within a depth limit; one script run for the callers of an AsyncProducer's round. Taking jobs off
the queue is claims.py; rq's job hash of each request is rqjobs.py's (rq's own fields, built fast).

A queue's embedfleet:queued_tokens:<queue> counts the estimated tokens of the jobs in rq:queue:<queue>: INCRBY by
the producer in the enqueue script, DECRBY by take (and by cancel), INCRBY by recover / give back; deleted
whenever take finds the queue empty (which heals drift), or the counter holds no whole number. No TTL: one per
queue, like the queue itself.
"""

from __future__ import annotations

from dataclasses import dataclass

import redis

from embedfleet.common.errors import DuplicateRequestError
from embedfleet.common.names import tag_of
from embedfleet.common.protocol import keys, rqjobs, rqkeys, scripts
from embedfleet.common.protocol.records import reply_text
from embedfleet.common.request import EmbedRequest
from embedfleet.common.scheduling import estimate_tokens


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
        listed = rqkeys.RQ_QUEUES if not tag_of(self.queue) else rqkeys.rq_queue_key(self.queue)
        return [rqkeys.rq_queue_key(self.queue), listed, keys.queued_tokens_key(self.queue)]

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
    announce = announce and not tag_of(first.queue)
    args: list = ["1" if first.front else "0", first.max_depth, rqkeys.JOB_KEY_TTL, "1" if announce else "0"]
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
        raise DuplicateRequestError(f"request id {reply_text(reply[1])} is already in use: ids are never reused")
    if code == -1:
        raise QueueFull(int(reply[1]))
