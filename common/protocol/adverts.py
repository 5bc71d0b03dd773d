"""Adverts: which models the fleet serves and which workers serve them (worker/serving/advertise.py writes them,
producers and the gateway read them), and a worker's withdrawal (scripts/withdraw.lua).

    embedfleet:models               names of every model ever advertised; never pruned: a name without a live
                                    worker is answered 503 no_worker (known model, none serving now), a name
                                    never seen 404 unknown model
    embedfleet:model:<name>         ModelCapabilities (msgpack), refreshed every HEARTBEAT_INTERVAL by each
                                    worker serving <name>
    embedfleet:model:<name>:workers worker name -> time of its last heartbeat
    embedfleet:worker:<worker>      one worker's own facts (msgpack: model, device, dtype, batch budget and where
                                    it came from; and what changes, rewritten at each heartbeat: state, the round
                                    on its device, texts/s over the last minute, 10 minutes of 10-s buckets;
                                    worker/serving/livestats.py)
"""

from __future__ import annotations

import redis
import redis.cluster

from embedfleet.common.protocol import keys, scripts


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
