"""Capability heartbeat: tells producers which model this worker serves and that it is alive."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from redis import Redis
from redis.cluster import RedisCluster

from embedfleet.common.capabilities import ModelCapabilities
from embedfleet.common.codec import packb
from embedfleet.common.policy import ADVERTISE_TTL
from embedfleet.common.protocol import adverts
from embedfleet.common.protocol.keys import MODELS_KEY, model_key, model_workers_key, worker_info_key

log = logging.getLogger(__name__)

class Advertiser:
    """Writes `caps` under the model's keys for `worker_name` (see common.protocol.keys for the layout)."""

    def __init__(self, connection: Redis, caps: ModelCapabilities, worker_name: str,
                 ttl: int = ADVERTISE_TTL, info: dict | None = None, live: Callable[[], dict] | None = None,
                 stats: Callable[[], dict] | None = None):
        self.connection = connection
        self.caps = caps
        self.worker_name = worker_name
        self.ttl = ttl
        self._blob = caps.encode()
        self._facts = {"model": caps.name, **(info or {})}  # this worker's device, dtype, batch budget
        self._info = packb(self._facts)
        self.live = live  # what changes (state, current round, texts/s), read afresh at each advert
        self._stats = stats  # counters that change (cache hits and misses), read at each advert

    def advertise(self) -> None:
        """One transaction: this worker's beat, capabilities with a TTL, the model name; prunes dead workers."""
        now = time.time()
        name = self.caps.name
        # MULTI: see common/protocol/scripts/withdraw.lua; a Redis Cluster has these keys in several slots
        with self.connection.pipeline(transaction=not isinstance(self.connection, RedisCluster)) as pipe:
            pipe.zadd(model_workers_key(name), {self.worker_name: now})  # before the SET, for readers too
            pipe.set(model_key(name), self._blob, ex=self.ttl)
            pipe.sadd(MODELS_KEY, name)
            pipe.zremrangebyscore(model_workers_key(name), "-inf", now - self.ttl)
            pipe.expire(model_workers_key(name), self.ttl * 2)
            info = self._current_info()
            pipe.set(worker_info_key(self.worker_name), info, ex=self.ttl)
            pipe.execute()

    def publish_live(self) -> None:
        """Between adverts, at each heartbeat: this worker's facts with what changes (state, current round,
        texts/s) read afresh, so that `status` and /dashboard see them within a beat, not an advert."""
        if self.live is not None or self._stats is not None:
            self.connection.set(worker_info_key(self.worker_name), self._current_info(), ex=self.ttl)

    def _current_info(self) -> bytes:
        """The info blob: the fixed facts, plus what changes where this worker reports it."""
        if self.live is None and self._stats is None:
            return self._info
        return packb({**self._facts, **(self.live() if self.live else {}), **(self._stats() if self._stats else {})})

    def withdraw(self) -> bool:
        """Removes this worker; deletes the model's capabilities if no live worker serves it. True if deleted."""
        name = self.caps.name
        deleted = adverts.withdraw(self.connection, name, self.worker_name, time.time() - self.ttl)
        self.connection.delete(worker_info_key(self.worker_name))
        log.info("worker %s: withdrew model %s%s", self.worker_name, name,
                 " (no worker left, capabilities removed)" if deleted else "")
        return bool(deleted)
