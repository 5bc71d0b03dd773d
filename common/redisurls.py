"""Redis URLs: which form a URL has, what a client is built from, and the URL as logs may print it.

URLs (every entry point takes one, in --redis-url or EMBEDFLEET_REDIS_URL; each shard takes one too):

    redis://[[user]:password@]host:port/db             plain TCP; `user` is an ACL user (default: "default")
    rediss://[[user]:password@]host:port/db            TLS; --redis-tls-ca/--redis-tls-cert/--redis-tls-key
                                                       (env EMBEDFLEET_REDIS_TLS_*) add `ssl_ca_certs`,
                                                       `ssl_certfile`, `ssl_keyfile` to the URL's query
    redis+sentinel://[[user]:password@]h1:26379,h2:26379/service[/db]
                                                       the master of `service` as the sentinels name it;
                                                       the credentials are the master's (sentinels that
                                                       need their own: `?sentinel_password=...`);
                                                       `rediss+sentinel://` for a TLS master
    redis+cluster://[[user]:password@]h1:p1[,h2:p2...][#partition]
                                                       a Redis Cluster, the nodes given as seeds (redis-py's
                                                       RedisCluster finds the rest); `rediss+cluster://`
                                                       for TLS. Keys are laid out for it (keys.py: hash tags);
                                                       `#partition` names one partition of a model on it
                                                       (its own tag, so its own slot: cluster_tag)
"""

from __future__ import annotations

from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit, urlunsplit

import redis.asyncio.cluster as aiocluster
import redis.cluster

from embedfleet.common.protocol import keys

SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")
TLS_QUERY = {"ca": "ssl_ca_certs", "cert": "ssl_certfile", "key": "ssl_keyfile"}


def is_sentinel(url: str) -> bool:
    return urlsplit(url).scheme in SENTINEL_SCHEMES


def is_cluster(url: str) -> bool:
    return urlsplit(url).scheme in CLUSTER_SCHEMES


def is_cluster_client(connection) -> bool:
    """Whether `connection` (sync or asyncio) talks to a Redis Cluster."""
    return isinstance(connection, (redis.cluster.RedisCluster, aiocluster.RedisCluster))


def cluster_tag(url: str, model: str) -> str:
    """The hash tag of `model`'s keys at `url`: '' on a plain Redis; on a Redis Cluster the model's, or its
    partition's when the URL names one (`#partition`: a model may have several partitions on one cluster)."""
    return keys.slot_tag(model, urlsplit(url).fragment) if is_cluster(url) else ""


def parse_cluster(url: str) -> tuple[list[tuple[str, int]], dict]:
    """(seed nodes, connection kwargs) of a redis+cluster:// URL; a cluster has one database (no /DB)."""
    parts = urlsplit(url)
    netloc = parts.netloc.rpartition("@")[2]
    nodes = []
    for node in filter(None, netloc.split(",")):
        host, _, port = node.rpartition(":") if ":" in node else (node, "", "6379")
        if not port.isdigit():
            raise ValueError(f"not a Redis Cluster URL: {redact(url)}; write redis+cluster://[user:password@]"
                             "host:port[,host:port...]")
        nodes.append((host or node, int(port)))
    if not nodes or parts.path.strip("/") not in ("", "0"):
        raise ValueError(f"not a Redis Cluster URL: {redact(url)}; write redis+cluster://[user:password@]"
                         "host:port[,host:port...] (a cluster has database 0 only)")
    kwargs: dict = dict(parse_qsl(parts.query))
    user, password = _credentials(parts)
    if user:
        kwargs["username"] = user
    if password:
        kwargs["password"] = password
    if parts.scheme == "rediss+cluster":
        kwargs["ssl"] = True
    return nodes, kwargs


def parse_sentinel(url: str) -> tuple[list[tuple[str, int]], str, dict, dict]:
    """(sentinel hosts, service name, the master's connection kwargs, the sentinels' own kwargs)."""
    parts = urlsplit(url)
    netloc = parts.netloc.rpartition("@")[2]
    hosts = []
    for host in filter(None, netloc.split(",")):
        name, _, port = host.rpartition(":") if ":" in host else (host, "", "26379")
        hosts.append((name or host, int(port)))
    path = [p for p in parts.path.split("/") if p]
    if not hosts or not path or len(path) > 2 or (len(path) == 2 and not path[1].isdigit()):
        raise ValueError(f"not a Sentinel URL: {redact(url)}; write redis+sentinel://[user:password@]"
                         "host:port[,host:port...]/SERVICE[/DB]")
    kwargs: dict = {"db": int(path[1]) if len(path) == 2 else 0}
    user, password = _credentials(parts)
    if user:
        kwargs["username"] = user
    if password:
        kwargs["password"] = password
    sentinel_kwargs: dict = {}  # (the caller adds its timeouts)
    for name, value in parse_qsl(parts.query):
        if name == "sentinel_password":
            sentinel_kwargs["password"] = value
        else:
            kwargs[name] = value
    if parts.scheme == "rediss+sentinel":
        kwargs["ssl"] = True
    return hosts, unquote(path[0]), kwargs, sentinel_kwargs


def _credentials(parts) -> tuple[str | None, str | None]:
    user = unquote(parts.username) if parts.username else None
    password = unquote(parts.password) if parts.password else None
    return user, password


def with_tls(url: str, ca: str | None = None, cert: str | None = None, key: str | None = None) -> str:
    """`url` with the TLS files as query arguments (redis-py reads them there); only TLS URLs take them."""
    given = {TLS_QUERY[k]: v for k, v in {"ca": ca, "cert": cert, "key": key}.items() if v}
    if not given:
        return url
    parts = urlsplit(url)
    if parts.scheme not in ("rediss", "rediss+sentinel", "rediss+cluster"):
        raise ValueError(f"--redis-tls-ca/--redis-tls-cert/--redis-tls-key need a TLS URL (rediss://, "
                         f"rediss+sentinel:// or rediss+cluster://), not {parts.scheme}://")
    if bool(cert) != bool(key):
        raise ValueError("--redis-tls-cert and --redis-tls-key go together (the client certificate and its key)")
    query = dict(parse_qsl(parts.query))
    query.update(given)
    return urlunsplit(parts._replace(query=urlencode(query)))


def redact(url: str) -> str:
    """`url` fit for logs: the password (and a sentinel password in the query) replaced by ***."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, hosts = netloc.rpartition("@")
        user = userinfo.split(":", 1)[0]
        netloc = f"{user}:***@{hosts}" if ":" in userinfo else f"{userinfo}@{hosts}"
    query = [(k, "***" if "password" in k else v) for k, v in parse_qsl(parts.query)]
    return urlunsplit(parts._replace(netloc=netloc, query=urlencode(query, safe="/*", quote_via=quote)))


def user_of(url: str) -> str:
    parts = urlsplit(url)
    return unquote(parts.username) if parts.username else "default"
