"""The fleet's vector cache: what the forward pass computed for an input, keyed by content, in Redis.

What is cached is the forward pass's output for one input: the pooled (and Dense-projected) float32
vector, before the Matryoshka cut, normalisation and the output cast. The key is the model's identity
(worker/engine/identity.py) plus a digest of the input as the model sees it: its token ids (prompt, special tokens
and truncation already applied) and the prompt length left out of pooling. So a hit runs the very same
post-processing as a fresh vector and gives the same bytes in every `dimensions` and `embed_dtype` (int8 /
uint8 ranges are computed over the request's rows, which a cache of final bytes per input could not keep).

A round looks up all its cacheable inputs in one MGET before the forward pass and writes its misses back in
one pipeline. A worker prepares its next round while the current one is on the device, before the current
one's vectors reach Redis: so the forward stage also keeps the vectors it computed lately in memory (bounded
by RECENT_BYTES) and takes the next round's misses from there when it can. The cache is an optimisation: an
unreachable or full cache Redis costs misses, never a request. What it returns is input: a value of the
wrong size or with a non-finite number is a miss.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np
import redis
from redis.cluster import RedisCluster

from embedfleet.common.errors import StartupError
from embedfleet.common.policy import CACHE_TTL
from embedfleet.common.protocol import keys
from embedfleet.common.redisclient import check_access, connect

log = logging.getLogger(__name__)

MEMORY_CHECK_SECONDS = 5.0  # how often writes look at the cache Redis's memory use
WARN_EVERY = 60.0  # seconds between two warnings about the same cache trouble
RECENT_BYTES = 64 << 20  # vectors the forward stage keeps in memory for the rounds right behind it


@dataclass
class Lookup:
    """One round's cacheable inputs: request -> its inputs' cache keys, and request -> {row: vector} found
    (the hits: handed to the engine's forward pass as known rows, not computed)."""

    keys: dict[int, list[str]] = field(default_factory=dict)
    hits: dict[int, dict[int, np.ndarray]] = field(default_factory=dict)


class VectorCache:
    """Pooled float32 vectors of one model in a Redis (keys.cache_key), around the engine's steps
    (worker/serving/steps.py: `lookup` and `store` in Redis, `recall` and `remember` in memory).

    connection: the cache's Redis (the queue's by default).
    identity: the model identity (worker/engine/identity.py model_identity).
    width: the vector width the model's forward pass returns.
    ttl: seconds an entry lives.
    max_memory: writes pause while the Redis uses more than this fraction of its maxmemory (when it has
        one), so that the cache never fills the queue's Redis up to its limit.
    """

    def __init__(self, connection: redis.Redis, identity: str, width: int, *, ttl: int = CACHE_TTL,
                 max_memory: float = 0.8):
        self.connection = connection
        self.identity = identity
        self.width = width
        self.ttl = ttl
        self.max_memory = max_memory
        self.hits = 0
        self.misses = 0
        self.invalid = 0  # entries that were no vector of this model (counted as misses too)
        self.written = 0
        self._paused = False
        self._checked_at = float("-inf")
        self._warned: dict[str, float] = {}
        self._recent: OrderedDict[str, np.ndarray] = OrderedDict()  # the forward stage's own, newest last
        self._recent_max = max(1, RECENT_BYTES // (4 * width))

    def key(self, token_ids, prompt_length: int) -> str:
        digest = hashlib.blake2b(np.asarray(token_ids, dtype="<i8").tobytes(), digest_size=16,
                                 person=b"embedfleet-in", key=str(prompt_length).encode())
        return keys.cache_key(self.identity, digest.hexdigest())

    def stats(self) -> dict:
        """The counters a worker advertises (`embedfleet status`)."""
        return {"cache_hits": self.hits, "cache_misses": self.misses}

    # -- around the engine's steps ---------------------------------------------------------------------

    def lookup(self, work, claim=None) -> Lookup:
        """The cache keys of every cacheable request of `work` (an engine Work: `Work.cacheable`, the embed task's
        pooled rows, a long input's chunks included), and the vectors found.
        `claim`: the round's in-flight claims (worker/serving/inflight.py Claim), sent in the same round trip
        and answered (`sends_claims`: only where the cache is the queue's own Redis)."""
        found = Lookup()
        for index, prep in work.cacheable():
            found.keys[index] = [self.key(ids, prompt_length)
                                 for ids, prompt_length in zip(prep.token_lists, prep.prompt_lengths)]
        wanted = list(dict.fromkeys(k for ks in found.keys.values() for k in ks))
        if claim is not None and claim.markers:
            values = self._claim_and_get(claim, wanted)
        elif not wanted:
            return found
        else:
            try:
                values = dict(zip(wanted, self._mget(wanted)))
            except redis.RedisError as exc:
                self._warn("lookup", f"cache lookup failed ({exc}); computing {len(wanted)} inputs")
                values = {}
        for index, cache_keys in found.keys.items():
            for row, key in enumerate(cache_keys):
                vector = self._decode(values.get(key), key)
                if vector is None:
                    self.misses += 1
                else:
                    self.hits += 1
                    found.hits.setdefault(index, {})[row] = vector
        return found

    def recall(self, found: Lookup) -> None:
        """The forward stage, before its passes: misses that a recent round computed become hits."""
        for index, cache_keys in found.keys.items():
            hits = found.hits.setdefault(index, {})
            for row, key in enumerate(cache_keys):
                if row not in hits and (vector := self._recent.get(key)) is not None:
                    hits[row] = vector
                    self.hits += 1
                    self.misses -= 1

    def remember(self, work, found: Lookup) -> None:
        """The forward stage, after its passes: keep what this round computed for the next rounds."""
        for index, cache_keys in found.keys.items():
            rows, hits = work.computed(index), found.hits.get(index, {})
            if rows is None:
                continue
            for row, key in enumerate(cache_keys):
                if row not in hits:
                    self._recent[key] = rows[row].copy()  # not a view that pins the round's array
                    self._recent.move_to_end(key)
        while len(self._recent) > self._recent_max:
            self._recent.popitem(last=False)

    def store(self, work, found: Lookup) -> None:
        """Write the vectors computed for cacheable requests (not the hits) in one pipeline."""
        entries: dict[str, bytes] = {}
        for index, cache_keys in found.keys.items():
            rows = work.computed(index)
            if rows is None:
                continue
            hits = found.hits.get(index, {})
            for row, key in enumerate(cache_keys):
                if row not in hits:
                    entries[key] = np.asarray(rows[row], dtype="<f4").tobytes()
        if not entries or not self._room():
            return
        try:
            with self.connection.pipeline(transaction=False) as pipe:
                for key, value in entries.items():
                    pipe.set(key, value, ex=self.ttl)
                pipe.execute()
            self.written += len(entries)
        except redis.RedisError as exc:  # e.g. OOM on a full noeviction Redis: later lookups miss
            self._warn("store", f"cache write of {len(entries)} vectors failed ({exc})")

    def uncount(self, found: Lookup) -> None:
        """A lookup made again without some of its requests (worker/serving/take.py): its hits and misses are
        counted by the new one."""
        hits = sum(len(rows) for rows in found.hits.values())
        self.hits -= hits
        self.misses -= sum(len(keys_) for keys_ in found.keys.values()) - hits

    def sends_claims(self, connection) -> bool:
        """Whether a round's in-flight claims (on `connection`, the queue's Redis) can go with its lookup:
        the cache is on that very client, and it is no Redis Cluster (whose lookup is one MGET per slot)."""
        return self.connection is connection and not isinstance(connection, RedisCluster)

    # -- internals ----------------------------------------------------------------------------------

    def _claim_and_get(self, claim, wanted: list[str]) -> dict[str, bytes]:
        """The claim's script and the MGET in one pipeline (one round trip); the claim answered, the values
        found. Redis unreachable: no dedup this round and all misses, as each alone would have it."""
        try:
            with self.connection.pipeline(transaction=False) as pipe:
                pipe.execute_command(*claim.command())
                if wanted:
                    pipe.execute_command("MGET", *wanted)
                replies = pipe.execute(raise_on_error=False)
        except redis.RedisError as exc:
            claim.answer(exc, self.connection)
            self._warn("lookup", f"cache lookup failed ({exc}); computing {len(wanted)} inputs")
            return {}
        claim.answer(replies[0], self.connection)
        if not wanted:
            return {}
        if isinstance(replies[1], Exception):
            self._warn("lookup", f"cache lookup failed ({replies[1]}); computing {len(wanted)} inputs")
            return {}
        return dict(zip(wanted, replies[1]))

    def _mget(self, wanted: list[str]) -> list:
        """One MGET; on a Redis Cluster one per slot (redis-py's mget_nonatomic: the keys lie in many)."""
        if isinstance(self.connection, RedisCluster):
            return self.connection.mget_nonatomic(wanted)
        return self.connection.mget(wanted)

    def _decode(self, raw, key: str) -> np.ndarray | None:
        if raw is None:
            return None
        if not isinstance(raw, bytes) or len(raw) != 4 * self.width:
            self.invalid += 1
            self._warn("invalid", f"cache entry {key} holds {len(raw)} bytes, not a {self.width}-float32 vector; "
                                  "ignored (recomputed and overwritten)")
            return None
        vector = np.frombuffer(raw, dtype="<f4").astype(np.float32)
        if not np.isfinite(vector).all():
            self.invalid += 1
            self._warn("invalid", f"cache entry {key} holds a non-finite number; ignored (recomputed)")
            return None
        return vector

    def _room(self) -> bool:
        """False while the cache Redis is past `max_memory` of its maxmemory (checked every few seconds)."""
        now = time.monotonic()
        if now - self._checked_at >= MEMORY_CHECK_SECONDS:
            self._checked_at = now
            try:
                memory = self.connection.info("memory")
                limit = int(memory.get("maxmemory", 0) or 0)
                used = int(memory.get("used_memory", 0) or 0)
            except (redis.RedisError, ValueError, TypeError):
                return not self._paused  # the write that follows will tell
            paused = bool(limit) and used > self.max_memory * limit
            if paused and not self._paused:
                log.warning("cache Redis uses %d of its %d bytes (over %.0f%%): cache writes pause until it "
                            "has room", used, limit, 100 * self.max_memory)
            self._paused = paused
        return not self._paused

    def _warn(self, topic: str, message: str) -> None:
        now = time.monotonic()
        if now - self._warned.get(topic, float("-inf")) >= WARN_EVERY:
            self._warned[topic] = now
            log.warning("%s", message)


def eviction_policy(connection: redis.Redis) -> tuple[str, str]:
    """(maxmemory-policy, run_id) of a Redis, from INFO (readable where CONFIG is renamed or not allowed). A
    Redis Cluster: the policy of the master that evicts most (allkeys-*, then volatile-*), its masters' run ids."""
    if isinstance(connection, RedisCluster):
        infos = list(connection.info(target_nodes=RedisCluster.PRIMARIES).values())
    else:
        infos = [connection.info()]
    policies = [str(info.get("maxmemory_policy", "noeviction")) for info in infos]
    policy = next((p for prefix in ("allkeys-", "volatile-") for p in policies if p.startswith(prefix)), policies[0])
    return policy, ",".join(sorted(str(info.get("run_id", "")) for info in infos))


def cache_store(url: str | None) -> redis.Redis | None:
    """The cache's own Redis (--cache-url), its access checked like the queue's; None: the queue's Redis."""
    if not url:  # empty (compose passes unset variables as "") counts as unset
        return None
    store = connect(url)
    check_access(store, url)
    return store


def check_placement(queue: redis.Redis, cache: redis.Redis | None) -> str:
    """Refuse (StartupError) a cache on the queue's Redis when that Redis evicts any key; returns a warning
    to log, or "". `cache` None means the queue's own Redis; a separate URL that reaches the same server
    (same run_id) counts as the queue's."""
    policy, run_id = eviction_policy(queue)
    shared = cache is None or eviction_policy(cache)[1] == run_id
    if shared and policy.startswith("allkeys-"):
        raise StartupError(
            f"the vector cache would live on the queue's Redis, whose maxmemory-policy is {policy}: when full it "
            "evicts any key, queued jobs and results included, to make room for cached vectors. Give the cache "
            "a Redis of its own (--cache-url; the compose `cache` profile runs one with allkeys-lru), set this "
            "Redis to noeviction or a volatile-* policy, or run with --no-cache")
    if shared and policy.startswith("volatile-"):
        return (f"the queue's Redis evicts keys with a TTL ({policy}) when full: results have one too. Cache "
                "writes pause at --cache-max-memory of maxmemory; a separate --cache-url is safer")
    if not shared:
        cache_policy = eviction_policy(cache)[0]
        if cache_policy == "noeviction":
            return ("the cache Redis does not evict (noeviction): once full, new vectors are not cached "
                    "(set maxmemory-policy allkeys-lru there)")
    return ""
