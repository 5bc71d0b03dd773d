"""Redis clients for every entry point: timeouts that suit blocking reads, secured Redis, start-up checks.

URLs: common/redisurls.py (plain, TLS, Sentinel, Cluster; checks and redaction for logs). Every client is made
from a checked URL (`connect`, `connect_async`: redisurls.check_url), so a malformed one is refused before any
connection, in one line without its password.

Commands of plain and Sentinel clients are packed in C (common/packing.py); a Cluster's nodes pack as redis-py does.

Timeouts: redis-py 8 defaults to a 5 s socket timeout, shorter than the blocking reads here would like; a
client without any timeout would hang forever on a dead host. Blocking calls wait at most MAX_BLOCK
seconds per command (then loop), safely inside SOCKET_TIMEOUT.

After a Redis restart every pooled connection is stale, and the first command on each fails with
"Connection closed by server". redis-py's sync client retries that on its own; an asyncio client built on
a pool of its own does not, so `connect_async` asks for one retry, on a fresh connection, of a command
whose connection failed. A timeout is not retried (it would double a wait on a hung Redis). The commands
sent here may safely run twice: reads, SET, DEL, EXPIRE, and RPUSH on a notify list (one more wake-up).

A wrong password, an ACL user without the commands or keys embedfleet needs, a certificate that does
not verify, a DB the server lacks, or a URL of the wrong kind (redis+cluster:// at a plain Redis, redis:// at a
Cluster node) are configuration errors, not outages: `check_access` finds them at start and `access_problem`
says each in one line.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import types
import uuid
from urllib.parse import urlsplit

import redis
import redis.asyncio as aioredis
import redis.asyncio.cluster as aiocluster
import redis.cluster
import redis.asyncio.sentinel as aiosentinel
import redis.sentinel
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from embedfleet.common import fleetstate, packing
from embedfleet.common.errors import StartupError
from embedfleet.common.protocol import keys, rqkeys
# the URL helpers are imported from here by the entry points too (re-exported: hence F401)
from embedfleet.common.redisurls import (CLUSTER_SCHEMES, SENTINEL_SCHEMES, check_url, cluster_tag,  # noqa: F401
                                         identity, is_cluster, is_cluster_client, is_sentinel, parse_cluster,
                                         parse_sentinel, redact, user_of, with_tls)

SOCKET_TIMEOUT = 30.0
CONNECT_TIMEOUT = 5.0
MAX_BLOCK = 10.0
MAX_ASYNC_CONNECTIONS = 64  # per asyncio client; a burst beyond it waits (up to SOCKET_TIMEOUT) for one
CLOSE_TIMEOUT = 2.0  # seconds each step of closing an async client may take (a hung peer cannot stall it)

# What an embedfleet ACL user of any role needs (docs/security.md's worker grant; its producer grant is narrower):
# our keys, rq's keys and worker channels, and the commands rq's worker sends (INFO, CLIENT SETNAME).
ACL_GRANT = "resetkeys resetchannels +@all -@dangerous +info +client|setname +client|getname ~rq:* ~embedfleet:* &rq:*"


def connect(url: str) -> redis.Redis:
    """A client of `url`; RedisURLError (common.redisurls) for a malformed URL. A Cluster's client reads the slot
    map now: AccessError if the URL names a Redis that is not a cluster."""
    check_url(url)
    fleetstate.connecting(url)
    if is_cluster(url):
        nodes, kwargs = parse_cluster(url)
        try:
            client = ClusterClient(startup_nodes=[redis.cluster.ClusterNode(h, p) for h, p in nodes],
                                   **kwargs, **_timeouts())
        except redis.exceptions.RedisClusterException as exc:
            problem = access_problem(exc, url)
            if problem is None:
                raise
            raise AccessError(problem) from exc
        client.partition = urlsplit(url).fragment
        return client
    if is_sentinel(url):
        hosts, service, kwargs, sentinel_kwargs = parse_sentinel(url)
        sentinels = redis.sentinel.Sentinel(hosts, sentinel_kwargs={**_timeouts(), **sentinel_kwargs},
                                              **_timeouts())
        return sentinels.master_for(service, **kwargs, **_timeouts(), redis_connect_func=packing.on_connect)
    return redis.Redis.from_url(url, **_timeouts(), redis_connect_func=packing.on_connect)


class ClusterClient(redis.cluster.RedisCluster):
    """redis-py's RedisCluster as rq uses a client: rq's Worker reads and sets the socket timeout in
    `connection_pool.connection_kwargs`, which a cluster (a pool per node) lacks; here it is the kwargs every
    node's pool is built with. rq's own pipelines run without MULTI on a cluster (redis-py's ClusterPipeline
    sends each node its part): rq's records of a worker (birth, heartbeat, death) are not atomic there; the
    protocol's own writes are scripts, each within one slot (keys.py). `partition`: the URL's #partition
    (redisurls.cluster_tag), for a worker that has the client and not the URL."""

    partition = ""

    @property
    def connection_pool(self):
        return types.SimpleNamespace(connection_kwargs=self.nodes_manager.connection_kwargs)


def connect_async(url: str, max_connections: int = MAX_ASYNC_CONNECTIONS) -> aioredis.Redis:
    """An asyncio client whose pool never holds more than `max_connections` (a command beyond them waits
    up to SOCKET_TIMEOUT for one to be free). Through Sentinel, and on a Redis Cluster (a pool per node), the
    pools are redis-py's own, which have no blocking variant: there the bound is not enforced (exceeding it
    would fail commands with MaxConnectionsError, not queue them)."""
    check_url(url)
    fleetstate.connecting(url)
    retry = Retry(NoBackoff(), 1, (redis.ConnectionError,))
    if is_cluster(url):
        nodes, kwargs = parse_cluster(url)
        return aiocluster.RedisCluster(startup_nodes=[aiocluster.ClusterNode(h, p) for h, p in nodes],
                                       **kwargs, **_timeouts())
    if is_sentinel(url):
        hosts, service, kwargs, sentinel_kwargs = parse_sentinel(url)
        sentinels = aiosentinel.Sentinel(hosts, sentinel_kwargs={**_timeouts(), **sentinel_kwargs},
                                              **_timeouts())
        return sentinels.master_for(service, **kwargs, **_timeouts(), retry=retry,
                                    redis_connect_func=packing.on_connect_async)
    pool = aioredis.BlockingConnectionPool.from_url(
        url, max_connections=max_connections, timeout=SOCKET_TIMEOUT, retry=retry, **_timeouts(),
        redis_connect_func=packing.on_connect_async)
    return aioredis.Redis.from_pool(pool)  # the client owns the pool: aclose() closes it too


def _timeouts() -> dict:
    return {"socket_timeout": SOCKET_TIMEOUT, "socket_connect_timeout": CONNECT_TIMEOUT}


# -- start-up checks ----------------------------------------------------------------------------------

def check_access(connection: redis.Redis, url: str) -> None:
    """Fail now, in one line (AccessError), if `connection` cannot authenticate, verify TLS, or run what
    embedfleet runs on its keys; a Redis that is merely down raises redis.ConnectionError as usual.

    The probe only reads, in one round trip: a result key, the model set, a queue in rq's key space, and a
    script (`EVAL`), so that both of docs/security.md's users pass (its producer user may write few keys) and a
    user without our keys, rq's keys or scripts is told which it lacks. A grant that allows reading a key
    but not writing it is found when the first write is refused (that error is one line too).
    """
    try:
        connection.ping()
        if not is_cluster_client(connection):
            _not_a_cluster_node(_cluster_info(connection), url)
        pipe = connection.pipeline(transaction=False)
        _probe(pipe)
        pipe.execute()
    except (redis.RedisError, redis.exceptions.RedisClusterException, OSError) as exc:
        problem = access_problem(exc, url)
        if problem is None:
            raise
        raise AccessError(problem) from exc


async def check_access_async(connection: aioredis.Redis, url: str) -> None:
    """check_access for an asyncio client."""
    try:
        await connection.ping()
        if not is_cluster_client(connection):
            try:
                info = await connection.info("cluster")
            except redis.ResponseError:  # as _cluster_info
                info = {}
            _not_a_cluster_node(info, url)
        pipe = connection.pipeline(transaction=False)
        _probe(pipe)
        await pipe.execute()
    except (redis.RedisError, redis.exceptions.RedisClusterException, OSError) as exc:
        problem = access_problem(exc, url)
        if problem is None:
            raise
        raise AccessError(problem) from exc


def _cluster_info(connection: redis.Redis) -> dict:
    try:
        return connection.info("cluster")
    except redis.ResponseError:  # an ACL without INFO: the probe's MOVED tells a cluster node instead
        return {}


def _not_a_cluster_node(info: dict, url: str) -> None:
    """AccessError if a plain client (`url` redis:// or a Sentinel's) talks to a node of a Redis Cluster."""
    if info.get("cluster_enabled"):
        raise AccessError(_cluster_node(url))


def _cluster_node(url: str) -> str:
    return (f"Redis at {redact(url)} is a node of a Redis Cluster, which a {urlsplit(url).scheme}:// URL cannot "
            "use; name the cluster as redis+cluster://HOST:PORT[,HOST:PORT...] (rediss+cluster:// for TLS)")


def _probe(pipe) -> None:
    probe_id = f"access-check-{uuid.uuid4().hex}"
    pipe.exists(keys.result_key(probe_id)).smembers(keys.MODELS_KEY)
    pipe.llen(rqkeys.rq_queue_key(keys.queue_name("access-check")))
    pipe.execute_command("EVAL", "return 1", 0)  # may it run scripts (raw: a cluster's pipeline has no eval())


class AccessError(StartupError):
    """Redis refused us for a reason a retry will not fix (credentials, ACL, TLS, a DB it lacks, a URL of the wrong
    kind); the message is one line."""


def access_problem(exc: BaseException, url: str | None = None) -> str | None:
    """One line for an authentication, ACL or TLS failure, a DB the server lacks, or a URL of the wrong kind (a
    Cluster's at a plain Redis, a plain one at a Cluster node) (exc or what caused it); None for anything else."""
    where = f" at {redact(url)}" if url else ""
    user = f"user '{user_of(url)}'" if url else "the URL's user"
    for err in _chain(exc):
        if isinstance(err, redis.exceptions.RedisClusterException) and "Cluster mode is not enabled" in str(err):
            return (f"Redis{where} is not a Redis Cluster (its cluster mode is off), which a redis+cluster:// URL "
                    "needs; name a plain Redis as redis://HOST:PORT/DB (rediss:// for TLS)")
        # (a URL is known at a start-up check; without one, a MOVED is a Cluster client's slot move: slotmoves.py)
        if isinstance(err, redis.exceptions.MovedError) and url and not is_cluster(url):
            return _cluster_node(url)
        if isinstance(err, redis.ResponseError) and "DB index is out of range" in str(err):
            db = f"DB {identity(url)[-1]}" if url and not is_cluster(url) else "the DB"
            return (f"Redis{where} has no {db}: it has as many as its `databases` setting says (16 by default, "
                    "numbered from 0); name one it has in the URL (/0 by default)")
        if isinstance(err, redis.AuthenticationError) or "NOAUTH" in str(err) or "WRONGPASS" in str(err):
            if url and not urlsplit(url).password:
                return (f"Redis{where} needs a password and the URL gives none; put it in --redis-url "
                        "(redis://USER:PASSWORD@HOST:PORT/DB) or EMBEDFLEET_REDIS_URL")
            return (f"Redis{where} refused {user}: {_first_line(err)}; check the user and password in "
                    "--redis-url (redis://USER:PASSWORD@HOST:PORT/DB) or EMBEDFLEET_REDIS_URL")
        if isinstance(err, redis.exceptions.NoPermissionError):
            return (f"Redis{where}: ACL {user} may not do what embedfleet needs ({_first_line(err)}); "
                    f"grant it e.g. `ACL SETUSER {user_of(url) if url else 'USER'} {ACL_GRANT}`")
        if isinstance(err, ssl.SSLError) or (isinstance(err, redis.ConnectionError) and "SSL" in str(err)):
            return (f"TLS with Redis{where} failed ({_first_line(err)}); --redis-tls-ca must name the CA that "
                    "signed the server's certificate, and a server that checks clients needs --redis-tls-cert "
                    "and --redis-tls-key")
    return None


def _chain(exc: BaseException):
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0].rstrip(".") if text else type(exc).__name__


# -- blocking reads and shutdown ----------------------------------------------------------------------

def block_for(seconds_left: float) -> float:
    """How long one blocking command may wait: what is left, within (0.01, MAX_BLOCK]."""
    return min(max(seconds_left, 0.01), MAX_BLOCK)


async def bounded(step, what: str = "") -> None:
    """Await one best-effort step of a shutdown for at most CLOSE_TIMEOUT; a Redis error or a peer that
    does not answer in time ends the step, never the shutdown."""
    with contextlib.suppress(asyncio.TimeoutError, redis.RedisError, OSError):
        await asyncio.wait_for(step, CLOSE_TIMEOUT)


async def close_async(client: aioredis.Redis) -> None:
    """Close an asyncio client and its pool in bounded time. Closing a socket first waits for the peer
    (a TLS close_notify, say); a peer that never answers is left to the transport's own abort."""
    await bounded(client.aclose())
