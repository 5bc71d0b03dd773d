"""What is queued for a model, per priority level, a read (producer/client/reads.py) of two exchanges: depth,
estimated queued tokens (common.protocol.keys.queued_tokens_key) and the oldest job's age. For the gateway's fleet
gauges and for scripts; everything read is input (a corrupt counter or stamp reads as absent)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime, timezone

from embedfleet.common.names import PRIORITIES, valid_request_id
from embedfleet.common.protocol import keys, rqkeys
from embedfleet.common.shards import ShardMap
from embedfleet.producer.client.core import model_queue
from embedfleet.producer.client.reads import Read, answered

_RQ_TIME = "%Y-%m-%dT%H:%M:%S.%fZ"  # rq's utcformat, as `enqueued_at` is stored


@dataclass(frozen=True)
class LevelStats:
    model: str
    priority: str  # one of common.names.PRIORITIES
    depth: int  # job ids waiting
    queued_tokens: int  # the producers' estimate (common.scheduling.estimate_tokens), 0 when unknown
    oldest_age: float | None  # seconds since the job at the head was (re)queued; None when empty or unknown


def level_stats(shards: ShardMap, model: str, now: float | None = None) -> Read[list[LevelStats]]:
    """One LevelStats per priority level of `model`, highest first (a read of producer/client/reads.py); a
    partitioned model's summed over the partitions that answer (two exchanges, every partition in each)."""
    now = time.time() if now is None else now

    def commands(url: str) -> list[tuple]:  # (on a Redis Cluster each partition's queues carry its tag)
        found = []
        for level in PRIORITIES:
            queue = model_queue(url, model, level)
            found += [("LLEN", rqkeys.rq_queue_key(queue)), ("GET", keys.queued_tokens_key(queue)),
                      ("LINDEX", rqkeys.rq_queue_key(queue), 0)]
        return found

    raws = answered((yield {url: commands(url) for url in shards.partitions(model)}))
    heads = {url: [_text(raw[i + 2]) for i in range(0, len(raw), 3)] for url, raw in raws.items()}
    readable = {url: [h for h in found if h and valid_request_id(h)] for url, found in heads.items()}
    asked = {url: [("HGET", rqkeys.rq_job_key(h), "enqueued_at") for h in found] for url, found in readable.items()
             if found}
    stamps = (yield asked) if asked else {}
    out = []
    for index, level in enumerate(PRIORITIES):
        depth = tokens = 0
        ages = []
        for url, raw in raws.items():
            here = _count(raw[index * 3])
            depth, tokens = depth + here, tokens + (_count(raw[index * 3 + 1]) if here else 0)
            head = heads[url][index]
            enqueued = _unix(dict(zip(readable[url], stamps.get(url, []))).get(head)) if here and head else None
            if enqueued is not None:
                ages.append(max(0.0, now - enqueued))
        out.append(LevelStats(model, level, depth, tokens, max(ages, default=None)))
    return out


def _text(raw) -> str | None:
    return raw.decode("ascii", "replace") if isinstance(raw, bytes) else None


def _count(raw) -> int:
    try:
        return max(0, int(raw))
    except (TypeError, ValueError):  # absent, an error reply (a key of another type), or not a number
        return 0


def _unix(raw) -> float | None:
    try:
        return datetime.strptime(raw.decode(), _RQ_TIME).replace(tzinfo=timezone.utc).timestamp()
    except (AttributeError, UnicodeDecodeError, ValueError):
        return None
