"""One snapshot of the fleet, read from Redis in three exchanges of one pipeline per Redis (a read of
producer/client/reads.py): models, their queues per priority level, live workers and recent failures.
`embedfleet status` prints it (a table, or `--json`) and the gateway's /dashboard polls it (GET /v1/fleet),
so both show the same facts.

    models[]   name, redis (its Redis or shard, redacted; a partitioned model's partitions, joined by ", ",
               with `partitions`: how many, and every count summed over them), served (a live worker
               advertises it), dim,
               max_model_len, pooling, live_workers, texts_per_s (its workers' sum), cache_hit_rate
               (where workers count cache hits, else null), failures_last_hour {code: count}, queues[]:
                   priority, queue, depth (queued), in_progress (taken by workers), oldest_age_s (the
                   queue head's time since enqueue; null when empty), queued_tokens (the producers'
                   estimate, common.scheduling; null if unreadable)
    workers[]  name, model, host, pid, device, dtype, max_batch_tokens, max_batch_size, max_jobs, state,
               current_requests/current_texts (the round on its device), texts_per_s (last minute),
               texts_history (texts finished per history_bucket_s seconds, oldest first), last_beat_s
               (seconds since its last advert), cache_hits/cache_misses where it counts them; each once,
               however many partitions list it (a model's partitions on one Redis Cluster share its adverts)
    unreachable[]  a partition of a model that could not be reached, left out of the counts above while its
               model's other partitions answer: model, partition (its place in the map, from 1), of (how many),
               url (redacted), error (a Redis that is no such partition and cannot be reached fails the read)

Failures of the last hour are the ids in rq's failed registries whose score (failure time + the job's
failure_ttl, policy.FAILURE_TTL for every job a Producer enqueues) is within the last hour, up to
FAILED_SAMPLE per queue (the newest), grouped by the error code of their stored answer (`unknown` when it
has gone); any more are counted as `more_not_read`.
Everything read is input: an unreadable advert, job or answer is skipped or counted as unknown.
"""

from __future__ import annotations

import time
from datetime import datetime

from rq.utils import utcparse

from embedfleet.common.capabilities import ModelCapabilities
from embedfleet.common.errors import DecodeError
from embedfleet.common.names import PRIORITIES, valid_request_id
from embedfleet.common.policy import ADVERTISE_TTL, FAILURE_TTL
from embedfleet.common.protocol import keys, rqkeys
from embedfleet.common.redisclient import redact
from embedfleet.common.result import Result
from embedfleet.common.shards import ShardMap
from embedfleet.producer.client import reads
from embedfleet.producer.client.core import model_queue, parse_worker_info
from embedfleet.producer.client.reads import Read

FAILURE_WINDOW = 3600  # seconds of failures shown
FAILED_SAMPLE = 1000  # failed ids per queue whose answers are read for their codes (the newest)
UNREAD = "more_not_read"  # the failures past FAILED_SAMPLE, counted under this name


def snapshot(shards: ShardMap, now: float | None = None) -> Read[dict]:
    """The fleet as the module docstring lays it out: a read (producer/client/reads.py) of three exchanges, every
    Redis (shard) in each."""
    now = time.time() if now is None else now
    names, down = yield from reads.advertised(shards)
    names = {url: found for url, found in names.items() if found}
    first = (yield {url: _first(url, found, now) for url, found in names.items()}) if names else {}
    seen: set[tuple[str, bytes]] = set()  # (model, worker): a worker is counted where it is first listed
    plans = {url: _plans(found, iter(map(reads.ok, first[url])), seen) for url, found in names.items()}
    second = (yield {url: _second(plan) for url, plan in plans.items()}) if plans else {}
    models, workers = [], []
    for url, plan in plans.items():
        found_models, found_workers = _parse(url, plan, iter(map(reads.ok, second[url])), now)
        models += [{**model, "redis": redact(url)} for model in found_models]
        workers += found_workers
    return {"time": now, "redis": redact(shards.default), "priorities": list(PRIORITIES),
            "models": sorted(_whole(models, workers), key=lambda m: m["name"]), "workers": workers,
            "unreachable": [{"model": model, "partition": urls.index(url) + 1, "of": len(urls), "url": redact(url),
                             "error": str(error)} for url, error in down.items()
                            for model, urls in sorted(shards.shards.items()) if url in urls]}


def _whole(models: list[dict], workers: list[dict]) -> list[dict]:
    """One row per model: a partitioned model's rows (one per partition, common/shards.py) summed."""
    by_name: dict[str, list[dict]] = {}
    for model in models:
        by_name.setdefault(model["name"], []).append(model)
    return [parts[0] if len(parts) == 1 else _summed(parts, [w for w in workers if w.get("model") == name])
            for name, parts in by_name.items()]


def _summed(parts: list[dict], workers: list[dict]) -> dict:
    first = next((p for p in parts if p["dim"] is not None), parts[0])
    queues = []
    for rows in zip(*(p["queues"] for p in parts)):
        ages = [r["oldest_age_s"] for r in rows if r["oldest_age_s"] is not None]
        summed = {k: sum(r[k] or 0 for r in rows) for k in ("depth", "in_progress", "queued_tokens")}
        queues.append({**rows[0], **summed, "oldest_age_s": max(ages, default=None)})
    failures: dict[str, int] = {}
    for part in parts:
        for code, count in part["failures_last_hour"].items():
            failures[code] = failures.get(code, 0) + count
    hits = [(w["cache_hits"], w["cache_misses"]) for w in workers if "cache_hits" in w and "cache_misses" in w]
    looked_up = sum(h + m for h, m in hits)
    return {**first, "served": any(p["served"] for p in parts), "redis": ", ".join(p["redis"] for p in parts),
            "partitions": len(parts), "live_workers": sum(p["live_workers"] for p in parts),
            "texts_per_s": round(sum(p["texts_per_s"] for p in parts), 3),
            "cache_hit_rate": round(sum(h for h, _ in hits) / looked_up, 4) if looked_up else None,
            "queues": queues, "failures_last_hour": dict(sorted(failures.items()))}


def _tokens(raw) -> int | None:
    """The queue's queued-tokens counter (producers' estimates, common.scheduling); None if unreadable."""
    try:
        return max(0, int(raw or 0))
    except (TypeError, ValueError):
        return None


def _first(url: str, names: list[str], now: float) -> list[tuple]:
    """Per model: its advert, its live workers, and per priority level the queue's depth and head, what is
    in progress, the newest failures of the last hour (and how many) and the queued-tokens counter."""
    recent = now - FAILURE_WINDOW + FAILURE_TTL
    commands = []
    for name in names:
        commands += [("GET", keys.model_key(name)),
                     ("ZRANGEBYSCORE", keys.model_workers_key(name), now - ADVERTISE_TTL, "+inf", "WITHSCORES")]
        for priority in PRIORITIES:
            queue = model_queue(url, name, priority)
            commands += [("LLEN", rqkeys.rq_queue_key(queue)), ("LINDEX", rqkeys.rq_queue_key(queue), 0),
                         ("ZCARD", rqkeys.rq_wip_key(queue)),
                         ("ZREVRANGEBYSCORE", rqkeys.rq_failed_key(queue), "+inf", recent, "LIMIT", 0, FAILED_SAMPLE),
                         ("ZCOUNT", rqkeys.rq_failed_key(queue), recent, "+inf"),
                         ("GET", keys.queued_tokens_key(queue))]
    return commands


def _plans(names: list[str], first, seen: set[tuple[str, bytes]]) -> list[tuple]:
    """Per model: its advert, its live workers not `seen` on another partition (then seen), its queues' replies."""
    plans = []
    for name in names:
        caps_raw, beats = next(first), []
        for worker, beat in next(first):
            if (name, worker) not in seen:
                seen.add((name, worker))
                beats.append((worker, float(beat)))
        queues = [(priority, next(first), next(first), next(first), next(first), next(first), next(first))
                  for priority in PRIORITIES]
        plans.append((name, caps_raw, beats, queues))
    return plans


def _second(plans: list[tuple]) -> list[tuple]:
    """The live workers' adverts, the queue heads' enqueue times, the failures' answers."""
    commands = []
    for _, _, beats, queues in plans:
        commands += [("GET", keys.worker_info_key(reads.text(worker))) for worker, _ in beats]
        for _, _, head, _, failed, _, _ in queues:
            if head is not None and valid_request_id(head):
                commands.append(("HGET", rqkeys.rq_job_key(head.decode()), "enqueued_at"))
            commands += [("GET", keys.result_key(i.decode())) for i in failed if valid_request_id(i)]
    return commands


def _parse(url: str, plans: list[tuple], second, now: float) -> tuple[list[dict], list[dict]]:
    models, workers = [], []
    for name, caps_raw, beats, queues in plans:
        live = []
        for worker, beat in beats:
            info = parse_worker_info(reads.text(worker), next(second))
            if info is not None:
                live.append(_worker(info, now - beat))
        rows, failures = [], {}
        for priority, depth, head, in_progress, failed, failed_count, tokens in queues:
            enqueued = next(second) if head is not None and valid_request_id(head) else None
            rows.append({"priority": priority, "queue": model_queue(url, name, priority), "depth": depth,
                         "in_progress": in_progress, "oldest_age_s": _age(enqueued, now) if depth else None,
                         "queued_tokens": _tokens(tokens) if depth else 0})
            for request_id in failed:
                code = _code(next(second)) if valid_request_id(request_id) else "unknown"
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
