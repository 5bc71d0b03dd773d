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
    unix://[[user]:password@]/path/to/redis.sock[?db=N]  a local socket (redis-py's form)

`check_url` refuses any other form at parse time (a scheme missing or unknown, a port or DB that is no number in
range, a user or password with an unencoded `/`, `?` or `#`), in one line that never holds the password;
`identity` tells one Redis under two spellings (redis://localhost:6379/0 and redis://127.0.0.1:6379) apart from
two Redis.
"""

from __future__ import annotations

import ipaddress
import os
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit, urlunsplit

import redis.asyncio.cluster as aiocluster
import redis.cluster

from embedfleet.common.errors import StartupError
from embedfleet.common.names import slot_tag

PLAIN_SCHEMES = ("redis", "rediss")
SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")
SCHEMES = (*PLAIN_SCHEMES, "unix", *SENTINEL_SCHEMES, *CLUSTER_SCHEMES)
TLS_QUERY = {"ca": "ssl_ca_certs", "cert": "ssl_certfile", "key": "ssl_keyfile"}
DEFAULT_PORT, SENTINEL_PORT = 6379, 26379
MAX_PORT = 65535
# Far past any real `databases` setting (16 by default): a DB number above it is a typo. One the server lacks
# (/20 on a default Redis) is told at connect (redisclient.access_problem).
MAX_DB = 9999
_LOOPBACK = ("localhost", "127.0.0.1", "::1")  # one Redis under these names (no DNS: other names stay as written)
_FORMS = "redis://[USER:PASSWORD@]HOST:PORT/DB (rediss:// for TLS; redis+sentinel://, redis+cluster://)"


class RedisURLError(StartupError, ValueError):
    """A Redis URL of no form above; the message says what is wrong and never holds the password. A ValueError
    too: a settings validator makes it the usage error of the setting that holds the URL."""


def check_url(url: str, setting: str = "") -> str:
    """`url` if it has a form above, else RedisURLError: one line naming `setting` (when given) and what is wrong."""
    problem = _problem(url)
    if problem:
        raise RedisURLError(f"{setting}: {problem}" if setting else problem)
    return url


def _problem(url) -> str | None:
    if not isinstance(url, str) or not url.strip():
        return f"the Redis URL is empty; write {_FORMS}"
    scheme, sep, rest = url.partition("://")
    if not sep:
        return f"'{redact(url)}' is not a Redis URL (it does not start with a scheme://); write {_FORMS}"
    if scheme.lower() not in SCHEMES:
        return f"{redact(url)} is not a Redis URL: its scheme is none of {', '.join(s + '://' for s in SCHEMES)}"
    if "@" in _past_hosts(rest):
        return (f"the user or password of {redact(url)} holds an unencoded '/', '?' or '#' (or an '@' follows the "
                "host): percent-encode them in the URL (/ as %2F, ? as %3F, # as %23, @ as %40)")
    parts = urlsplit(url)
    hosts = parts.netloc.rpartition("@")[2]
    path = [p for p in parts.path.split("/") if p]
    query = dict(parse_qsl(parts.query))
    if parts.scheme == "unix":
        if hosts:
            return f"{redact(url)} has a host ({hosts!r}); a socket is unix:///PATH/TO/redis.sock (three slashes)"
        return "a unix:// URL needs the socket's path: unix:///PATH/TO/redis.sock" if not path else \
            _db_problem(query.get("db"), url, "?db=N after the path")
    if parts.scheme in PLAIN_SCHEMES and "," in hosts:
        return (f"{redact(url)} names several hosts; a {parts.scheme}:// URL names one Redis (a Redis Cluster is "
                "redis+cluster://H1:P1,H2:P2, Sentinels are redis+sentinel://H1:P1,H2:P2/SERVICE)")
    default = SENTINEL_PORT if parts.scheme in SENTINEL_SCHEMES else DEFAULT_PORT
    for node in _nodes(hosts) or [""]:
        found = _address(node, default)
        if isinstance(found, str):
            return f"{found} in {redact(url)}; write HOST:PORT"
    if parts.scheme in CLUSTER_SCHEMES:
        if not _nodes(hosts) or path not in ([], ["0"]):
            return (f"{redact(url)} is not a Redis Cluster URL; write redis+cluster://[USER:PASSWORD@]HOST:PORT"
                    "[,HOST:PORT...] (a cluster has DB 0 only)")
        return None
    if parts.scheme in SENTINEL_SCHEMES:
        if not _nodes(hosts) or not 1 <= len(path) <= 2:
            return (f"{redact(url)} is not a Sentinel URL; write redis+sentinel://[USER:PASSWORD@]HOST:PORT"
                    "[,HOST:PORT...]/SERVICE[/DB]")
        return _db_problem(path[1] if len(path) == 2 else None, url)
    if len(path) > 1:
        return f"the path of {redact(url)} is not /DB; write {_FORMS}"
    return _db_problem(path[0] if path else None, url) or _db_problem(query.get("db"), url)


def _db_problem(db: str | None, url: str, where: str = "/DB after HOST:PORT") -> str | None:
    if db is None or (db.isascii() and db.isdigit() and int(db) <= MAX_DB):
        return None
    return f"DB {db!r} of {redact(url)} is not a number from 0 to {MAX_DB}; write {where} (DB 0 by default)"


def _past_hosts(rest: str) -> str:
    """What follows the user, password and hosts of a URL (`rest`: the URL past `scheme://`)."""
    ends = [i for i in (rest.find("/"), rest.find("?"), rest.find("#")) if i >= 0]
    return rest[min(ends):] if ends else ""


def _nodes(hosts: str) -> list[str]:
    return [node for node in hosts.split(",") if node]


def _address(node: str, default_port: int) -> tuple[str, int] | str:
    """(host, port) of `node` (HOST, HOST:PORT, [IPv6]:PORT; no host: localhost), or what is wrong with it."""
    if node.startswith("["):
        host, _, port = node[1:].partition("]")
        if port and not port.startswith(":"):
            return f"host {node!r} is not [IPV6]:PORT"
        port = port[1:]
    else:
        host, _, port = node.rpartition(":") if ":" in node else (node, "", "")
    if not port:
        return host.lower() or "localhost", default_port
    if not (port.isascii() and port.isdigit() and 1 <= int(port) <= MAX_PORT):
        return f"port {port!r} is not a number from 1 to {MAX_PORT}"
    return host.lower() or "localhost", int(port)


def identity(url: str) -> tuple:
    """Which Redis and DB `url` (checked) names, whatever the spelling: loopback names as one, default ports and
    DB filled in, a trailing slash, the user, password, TLS and other query arguments left aside (TLS or not, a
    port is one Redis). For telling a Redis named twice; no DNS, so another name of one host is not found."""
    parts = urlsplit(url)
    path = [p for p in parts.path.split("/") if p]
    query = dict(parse_qsl(parts.query))
    if parts.scheme == "unix":
        return "unix", os.path.normpath(unquote(parts.path)), int(query.get("db", 0))
    hosts = parts.netloc.rpartition("@")[2]
    if parts.scheme in CLUSTER_SCHEMES:
        return "cluster", frozenset(_node(n, DEFAULT_PORT) for n in _nodes(hosts)), parts.fragment
    if parts.scheme in SENTINEL_SCHEMES:
        db = int(path[1]) if len(path) == 2 else 0
        return "sentinel", frozenset(_node(n, SENTINEL_PORT) for n in _nodes(hosts)), unquote(path[0]), db
    return "redis", _node(hosts, DEFAULT_PORT), int(query.get("db", path[0] if path else 0))  # as redis-py reads it


def _node(node: str, default_port: int) -> tuple[str, int]:
    host, port = _address(node, default_port)
    try:
        host = ipaddress.ip_address(host).compressed
    except ValueError:
        pass  # a name, not an address
    return ("127.0.0.1" if host in _LOOPBACK else host), port


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
    return slot_tag(model, urlsplit(url).fragment) if is_cluster(url) else ""


def parse_cluster(url: str) -> tuple[list[tuple[str, int]], dict]:
    """(seed nodes, connection kwargs) of a redis+cluster:// URL; a cluster has one database (no /DB)."""
    check_url(url)
    parts = urlsplit(url)
    nodes = [_address(node, DEFAULT_PORT) for node in _nodes(parts.netloc.rpartition("@")[2])]
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
    check_url(url)
    parts = urlsplit(url)
    hosts = [_address(host, SENTINEL_PORT) for host in _nodes(parts.netloc.rpartition("@")[2])]
    path = [p for p in parts.path.split("/") if p]
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
    """`url` fit for logs: the password (and a sentinel password in the query) replaced by ***. Of a malformed
    URL whose password holds an unencoded `/`, `?` or `#`, all before its last `@` is ***."""
    scheme, sep, rest = url.partition("://")
    if "@" in (_past_hosts(rest) if sep else url):
        url = f"{scheme}{sep}***@{rest.rpartition('@')[2]}" if sep else f"***@{url.rpartition('@')[2]}"
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
