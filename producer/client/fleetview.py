"""One snapshot of the fleet, read from Redis in two pipelines per Redis: models, their queues per priority
level, live workers and recent failures. `embedfleet status` prints it (a table, or `--json`) and the
gateway's /dashboard polls it (GET /v1/fleet), so both show the same facts.

    models[]   name, redis (its Redis or shard, redacted), served (a live worker advertises it), dim,
               max_model_len, pooling, live_workers, texts_per_s (its workers' sum), cache_hit_rate
               (where workers count cache hits, else null), failures_last_hour {code: count}, queues[]:
                   priority, queue, depth (queued), in_progress (taken by workers), oldest_age_s (the
                   queue head's time since enqueue; null when empty), queued_tokens (the producers'
                   estimate, common.scheduling; null if unreadable)
    workers[]  name, model, host, pid, device, dtype, max_batch_tokens, max_batch_size, max_jobs, state,
               current_requests/current_texts (the round on its device), texts_per_s (last minute),
               texts_history (texts finished per history_bucket_s seconds, oldest first), last_beat_s
               (seconds since its last advert), cache_hits/cache_misses where it counts them

Failures of the last hour are the ids in rq's failed registries whose score (failure time + the job's
failure_ttl, keys.FAILURE_TTL for every job a Producer enqueues) is within the last hour, up to
FAILED_SAMPLE per queue (the newest), grouped by the error code of their stored answer (`unknown` when it
has gone); any more are counted as `more_not_read`.
Everything read is input: an unreadable advert, job or answer is skipped or counted as unknown.
"""

from __future__ import annotations

import time
from datetime import datetime

from rq.registry import FailedJobRegistry, StartedJobRegistry
from rq.queue import Queue
from rq.job import Job
from rq.utils import utcparse

from common.protocol import keys
from common.capabilities import ModelCapabilities
from common.errors import DecodeError
from common.redisclient import redact
from common.result import Result
from producer.client.core import parse_worker_info, redis_errors

FAILURE_WINDOW = 3600  # seconds of failures shown
FAILED_SAMPLE = 1000  # failed ids per queue whose answers are read for their codes (the newest)
UNREAD = "more_not_read"  # the failures past FAILED_SAMPLE, counted under this name


def snapshot(producer) -> dict:
    """The fleet as the module docstring lays it out; `producer` is a Producer (its shard links)."""
    now = time.time()
    models, workers = [], []
    for url, connection in producer.links.items():
        with redis_errors():
            names = sorted(n.decode("utf-8", "replace") for n in connection.smembers(keys.MODELS_KEY))
            names = [n for n in names if producer.shards.owns(url, n)]
            if names:
                found_models, found_workers = _read(connection, names, now)
                models += [{**model, "redis": redact(url)} for model in found_models]
                workers += found_workers
    return {"time": now, "redis": redact(producer.redis_url), "priorities": list(keys.PRIORITIES),
            "models": sorted(models, key=lambda m: m["name"]), "workers": workers}


def _tokens(raw) -> int | None:
    """The queue's queued-tokens counter (producers' estimates, common.scheduling); None if unreadable."""
    try:
        return max(0, int(raw or 0))
    except (TypeError, ValueError):
        return None


def _read(connection, names: list[str], now: float) -> tuple[list[dict], list[dict]]:
    recent = now - FAILURE_WINDOW + keys.FAILURE_TTL
    pipe = connection.pipeline(transaction=False)
    for name in names:
        pipe.get(keys.model_key(name))
        pipe.zrangebyscore(keys.model_workers_key(name), now - keys.ADVERTISE_TTL, "+inf", withscores=True)
        for priority in keys.PRIORITIES:
            queue = keys.queue_name(name, priority)
            pipe.llen(Queue.redis_queue_namespace_prefix + queue)
            pipe.lindex(Queue.redis_queue_namespace_prefix + queue, 0)
            pipe.zcard(StartedJobRegistry.key_template.format(queue))
            pipe.zrevrangebyscore(FailedJobRegistry.key_template.format(queue), "+inf", recent, start=0,
                                  num=FAILED_SAMPLE)
            pipe.zcount(FailedJobRegistry.key_template.format(queue), recent, "+inf")
            pipe.get(keys.queued_tokens_key(queue))
    first = iter(pipe.execute())
    plans = []
    for name in names:
        caps_raw, beats = next(first), next(first)
        queues = [(priority, next(first), next(first), next(first), next(first), next(first), next(first))
                  for priority in keys.PRIORITIES]
        plans.append((name, caps_raw, beats, queues))

    # second round trip: the live workers' adverts, the queue heads' enqueue times, the failures' answers
    pipe = connection.pipeline(transaction=False)
    for _, _, beats, queues in plans:
        for worker, _ in beats:
            pipe.get(keys.worker_info_key(worker.decode("utf-8", "replace")))
        for _, _, head, _, failed, _, _ in queues:
            if head is not None and keys.valid_request_id(head):
                pipe.hget(Job.key_for(head.decode()), "enqueued_at")
            for request_id in failed:
                if keys.valid_request_id(request_id):
                    pipe.get(keys.result_key(request_id.decode()))
    second = iter(pipe.execute())
    models, workers = [], []
    for name, caps_raw, beats, queues in plans:
        live = []
        for worker, beat in beats:
            info = parse_worker_info(worker.decode("utf-8", "replace"), next(second))
            if info is not None:
                live.append(_worker(info, now - beat))
        rows, failures = [], {}
        for priority, depth, head, in_progress, failed, failed_count, tokens in queues:
            enqueued = next(second) if head is not None and keys.valid_request_id(head) else None
            rows.append({"priority": priority, "queue": keys.queue_name(name, priority), "depth": depth,
                         "in_progress": in_progress, "oldest_age_s": _age(enqueued, now) if depth else None,
                         "queued_tokens": _tokens(tokens) if depth else 0})
            for request_id in failed:
                code = _code(next(second)) if keys.valid_request_id(request_id) else "unknown"
                failures[code] = failures.get(code, 0) + 1
            if failed_count > len(failed):  # past FAILED_SAMPLE: counted, their codes not read
                failures[UNREAD] = failures.get(UNREAD, 0) + failed_count - len(failed)
        models.append(_model(name, caps_raw, live, rows, failures))
        workers += live
    return models, workers


def _model(name: str, caps_raw: bytes | None, live: list[dict], queues: list[dict], failures: dict) -> dict:
    caps = None
    if caps_raw is not None:
        try:
            caps = ModelCapabilities.decode(caps_raw)
        except DecodeError:
            caps = None
    hits = [(w["cache_hits"], w["cache_misses"]) for w in live if "cache_hits" in w and "cache_misses" in w]
    looked_up = sum(h + m for h, m in hits)
    return {"name": name, "served": caps is not None and bool(live),
            "dim": caps.embedding_size if caps else None, "max_model_len": caps.max_model_len if caps else None,
            "pooling": caps.pooling if caps else None, "live_workers": len(live),
            "texts_per_s": round(sum(w.get("texts_per_s", 0.0) for w in live), 3),
            "cache_hit_rate": round(sum(h for h, _ in hits) / looked_up, 4) if looked_up else None,
            "queues": queues, "failures_last_hour": dict(sorted(failures.items()))}


def _worker(info: dict, beat_age: float) -> dict:
    history = info.get("texts_history")
    if history is not None:  # an advert is input: a history that is not a short list of counts is dropped
        good = isinstance(history, list) and len(history) <= 1000 and \
            all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in history)
        info = {**info, "texts_history": history} if good else {k: v for k, v in info.items() if k != "texts_history"}
    return {**info, "last_beat_s": round(max(0.0, beat_age), 3)}


def _age(enqueued: bytes | None, now: float) -> float | None:
    if enqueued is None:
        return None
    try:
        when: datetime = utcparse(enqueued.decode("ascii"))
    except (ValueError, UnicodeDecodeError):
        return None
    return round(max(0.0, now - when.timestamp()), 3)


def _code(raw: bytes | None) -> str:
    if raw is None:
        return "unknown"
    try:
        result = Result.decode(raw)
    except DecodeError:
        return "unknown"
    return (result.error_code or "unknown") if not result.ok else "unknown"
