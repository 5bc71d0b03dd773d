"""Every Redis fault a client can meet, said as the clients' own error: UnavailableError (code redis_unavailable, the
gateway's 503 with Retry-After), its message quoting what Redis answered and saying what to do; never a bare
redis-py exception, nor a hang. The request is not at fault in any of them: the same request, sent again once
the fault has passed, is the remedy. The table is docs/reliability.md#redis-faults.

A fault is known by the word that starts Redis's error reply (redis-py keeps it as `status_code`, and strips it
from the message of the errors it has a class for). Waits and listeners ride out an `outage` (a Redis that is
unreachable, or there but serving nothing for now) as they ride out a restart; other faults fail them.
"""

from __future__ import annotations

import contextlib

import redis
from redis import exceptions as rx

from embedfleet.common.errors import UnavailableError
from embedfleet.common.protocol import slotmoves
from embedfleet.common.redisclient import access_problem

# Redis's error word -> (what it means, what to do)
REFUSALS = {
    "OOM": ("Redis is full (maxmemory reached) and refuses new requests",
            "retry later, or ask the operator to free memory"),
    "READONLY": ("Redis is a read-only replica (after a failover?) and refuses new requests",
                 "retry later, or point the fleet at the primary"),
    "MISCONF": ("Redis cannot persist to disk and refuses writes",
                "retry later, or ask the operator to fix its disk (stop-writes-on-bgsave-error)"),
    "NOREPLICAS": ("Redis has fewer replicas in sync than its min-replicas-to-write and refuses writes",
                   "retry later, or ask the operator to bring its replicas back"),
    "LOADING": ("Redis is loading its dataset (AOF or RDB) into memory after a start and serves no command until "
                "it is done", "retry in a few seconds"),
    "BUSY": ("Redis is running a script past its busy-reply-threshold (lua-time-limit) and serves no other command "
             "until it ends", "retry later, or ask the operator to end it (SCRIPT KILL or FUNCTION KILL)"),
    "CLUSTERDOWN": ("the Redis Cluster is down: a hash slot has no master (one died without a replica to take "
                    "over) or its nodes cannot agree", "retry later, or ask the operator to bring the master "
                    "back or fail it over"),
    "MASTERDOWN": ("the Redis replica lost its link to its master and serves no stale data "
                   "(replica-serve-stale-data no)", "retry later, or ask the operator to bring the master back"),
}
OUTAGE_WORDS = {"LOADING", "BUSY", "CLUSTERDOWN", "MASTERDOWN"}  # serving nothing for now, writes or reads
# redis-py's classes of the errors it strips the word from (a pipeline's error can lose `status_code` on the way)
_CLASS_WORDS = ((rx.MasterDownError, "MASTERDOWN"), (rx.ClusterDownError, "CLUSTERDOWN"),
                (rx.BusyLoadingError, "LOADING"), (rx.OutOfMemoryError, "OOM"), (rx.ReadOnlyError, "READONLY"))
# a Redis Cluster none of whose nodes answers, or that no longer covers a slot: redis-py's own classes, not RedisError
_CLUSTER_GONE = (rx.SlotNotCoveredError, rx.RedisClusterUnreachableError)
_CLUSTER_GONE_TEXT = ("cannot be connected", "not covered")  # the same, raised as a bare RedisClusterException
# The outages an `except` can name (a listener's): BUSY and a bare RedisClusterException only `outage` knows
OUTAGES = (redis.ConnectionError, redis.TimeoutError, rx.ClusterDownError, *_CLUSTER_GONE)


def fault_word(exc: BaseException) -> str | None:
    """The word of Redis's error reply that `exc` (or the error it stands for: its __cause__) carries."""
    for err in (exc, exc.__cause__):
        if not isinstance(err, redis.RedisError):
            continue
        word = getattr(err, "status_code", None) or next((w for cls, w in _CLASS_WORDS if isinstance(err, cls)),
                                                         None)
        if word is None and isinstance(err, redis.ResponseError):
            word = str(err).split(" ", 1)[0]
        if word in REFUSALS:
            return word
    return None


def _cluster_gone(exc: BaseException) -> bool:
    return isinstance(exc, _CLUSTER_GONE) or (isinstance(exc, rx.RedisClusterException)
                                              and any(text in str(exc) for text in _CLUSTER_GONE_TEXT))


def outage(exc: BaseException) -> bool:
    """Whether `exc` says Redis is unreachable, or there but serving nothing for now (loading its data, running a
    long script, a Redis Cluster down): a wait rides it out as it rides out a restart."""
    return isinstance(exc, OUTAGES) or _cluster_gone(exc) or fault_word(exc) in OUTAGE_WORDS


def unavailable(exc: BaseException) -> UnavailableError | None:
    """The UnavailableError that says the Redis fault `exc`; None for anything else (a bug of ours, or input)."""
    problem = access_problem(exc)  # a wrong password, an ACL without what we need, TLS: docs/security.md's line
    if problem is not None:
        return UnavailableError(problem)
    word = fault_word(exc)
    if word is not None:
        what, remedy = REFUSALS[word]
        said = str(exc) if str(exc).startswith(word) else f"{word} {exc}"
        return UnavailableError(f"{what} (Redis answered: {said}); {remedy}")
    if isinstance(exc, (redis.ConnectionError, redis.TimeoutError)):
        return UnavailableError(f"Redis is unreachable: {exc}")
    if _cluster_gone(exc):
        return UnavailableError(f"the Redis Cluster cannot serve this request ({exc}): its nodes are unreachable, or "
                                "none serves the request's hash slot (a master died without a replica); retry "
                                "later, or ask the operator to bring the master back")
    if isinstance(exc, redis.RedisError) and slotmoves.slot_moving(exc):  # still moving after MOVING_WAIT
        return UnavailableError(f"the Redis Cluster slot of this request is being moved (resharding) and did not "
                                f"settle within {slotmoves.MOVING_WAIT:g} s: {exc}; retry later")
    return None


@contextlib.contextmanager
def redis_errors():
    """Within it, a Redis fault (`unavailable`) is raised as UnavailableError; any other error as it was."""
    try:
        yield
    except (redis.RedisError, rx.RedisClusterException) as exc:
        error = unavailable(exc)
        if error is None:
            raise
        raise error from exc
