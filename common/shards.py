"""Which Redis holds which model: a fleet grows past one Redis by giving models Redis shards of their own, and
one model past one Redis by giving it several (its partitions).

A shard map names the Redis URLs of each mapped model; a model not in the map lives on the default Redis
(--redis-url). Everything of a model lives on its shard: its rq queue and jobs, its requests' results,
notify lists and reply-stream entries, its adverts (embedfleet:models, embedfleet:model:<name>...) and its
workers. Producers, the gateway and `embedfleet status` read the map; a worker serving a mapped model
connects to that model's shard.

A model mapped to several URLs is partitioned: each partition is a full copy of the model's key layout on its
own Redis (the same key names; nothing of one partition refers to another). A producer places each request on
one partition (round robin, skipping one that just refused a connection; producer/client/placement.py), a
worker serves every partition of its model (one engine process per partition), and reads of the model
(status, metrics, queue depth) sum over them. A request id is found on the Redis its producer sent it to
(remembered), else by asking each Redis of the map (an id is unique across the fleet): so a producer that did
not submit the id, or a map with a partition added since, still finds it.

The map is given as --redis-shards / EMBEDFLEET_REDIS_SHARDS, either inline,

    MODEL=URL[,URL...][;MODEL=URL[,URL...]...]      (`;` or whitespace between entries)

where a model's URLs are split only at a comma followed by a URL scheme (`,redis://`, `,rediss://`, ...): a
comma followed by anything else stays inside the URL (a query, or `redis+cluster://h1:p1,h2:p2`); or as @FILE:
a JSON object {"MODEL": "URL" or ["URL", ...], ...}, or a text file of MODEL=URL[,URL...] lines (# comments).

Every URL is checked as it is read (redisurls.check_url), a comma before a host:port without a scheme
(`m=redis://a:6379/0,b:6379`, which would read as one URL) is refused, and so is one Redis named twice among a
model's partitions, however spelled (redis://localhost:6379/0 and redis://127.0.0.1:6379: redisurls.identity).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from embedfleet.common.redisurls import RedisURLError, check_url, identity, is_cluster, is_sentinel, redact

ENV_REDIS_SHARDS = "EMBEDFLEET_REDIS_SHARDS"
_ENTRY_SPLIT = re.compile(r"[;\s]+")
_URL_SPLIT = re.compile(r",(?=[a-z][a-z0-9+.-]*://)")  # a comma that starts another URL, not one inside a URL


def resolve_shards(shards: Mapping[str, str | Sequence[str]] | None) -> Mapping[str, str | Sequence[str]]:
    """A client's shard map: the one it was given, else EMBEDFLEET_REDIS_SHARDS's, as every command reads it (a
    Producer() beside `embedfleet worker` and `status` in one environment sees the same partitions)."""
    if shards is not None:
        return shards
    try:
        return parse_shards(os.environ.get(ENV_REDIS_SHARDS))
    except RedisURLError as exc:
        raise RedisURLError(f"{ENV_REDIS_SHARDS}: {exc}") from None


def parse_shards(text: str | None) -> dict[str, list[str]]:
    """{model: [url, ...]} from the inline or @FILE form (see the module docstring); RedisURLError (a ValueError)
    if malformed, in one line that never holds a password."""
    if not text or not text.strip():
        return {}
    text = text.strip()
    if text.startswith("@"):
        path = Path(text[1:])
        try:
            body = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise RedisURLError(f"cannot read the shard map {path}: {exc.strerror}") from None
        if body.lstrip().startswith("{"):
            return _checked(_from_json(body, path), f"{path}: ")
        lines = [line.split("#", 1)[0] for line in body.splitlines()]
        return _checked(_pairs([e for line in lines for e in _ENTRY_SPLIT.split(line.strip()) if e]), f"{path}: ")
    return _checked(_pairs([e for e in _ENTRY_SPLIT.split(text) if e]), "")


def _from_json(body: str, path: Path) -> dict[str, list[str]]:
    try:
        loaded = json.loads(body)
    except json.JSONDecodeError as exc:
        raise RedisURLError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg})") from None
    out = {}
    for model, urls in loaded.items():
        if isinstance(urls, str):
            urls = [urls]
        if not isinstance(urls, list) or not urls or not all(isinstance(u, str) for u in urls):
            raise RedisURLError(f"{path}: a JSON shard map maps model names to a URL string or a non-empty list "
                                f"of them; {model!r} maps to {_kind(urls)}")
        out[model] = urls
    return out


def _pairs(entries: list[str]) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for entry in entries:
        model, sep, urls = entry.partition("=")
        if not sep or not model or not urls:
            raise RedisURLError(f"shard map entry '{redact(entry)}' is not MODEL=URL[,URL...]")
        if model in found:
            raise RedisURLError(f"model {model!r} is mapped twice in the shard map (list its partitions in one entry: "
                             "MODEL=URL1,URL2)")
        found[model] = _URL_SPLIT.split(urls)
    return found


def _kind(value) -> str:
    """What a JSON value is, in words (never the value: it may hold a password)."""
    if isinstance(value, list):
        return "an empty list" if not value else "a list of other things than URL strings"
    return f"a JSON {type(value).__name__}"


def _checked(shards: dict[str, list[str]], where: str) -> dict[str, list[str]]:
    """`shards` if each URL is well formed and no model names one Redis twice; else RedisURLError (`where`: the
    start of its message)."""
    for model, urls in shards.items():
        seen: dict[tuple, str] = {}
        for index, url in enumerate(urls, 1):
            which = f"{where}model {model!r}" + (f", partition {index}" if len(urls) > 1 else "")
            _one_redis(url, model, which)
            check_url(url, which)
            first = seen.setdefault(identity(url), url)
            if len(seen) < index:
                spelled = "" if first == url else f": {redact(first)} and {redact(url)} are one Redis"
                raise RedisURLError(f"{where}model {model!r} names a Redis twice among its partitions{spelled}; "
                                    "list each Redis once")
    return shards


def _one_redis(url: str, model: str, which: str) -> None:
    """Refuse a comma past the hosts of a URL that names one Redis: `redis://a:6379/0,b:6379` (a second partition
    written without its scheme) would read as one URL."""
    if is_cluster(url) or is_sentinel(url):  # their commas separate seed hosts
        return
    past_credentials = url.partition("://")[2].rpartition("@")[2]
    _, comma, after = past_credentials.split("?", 1)[0].split("#", 1)[0].partition(",")
    if comma:
        raise RedisURLError(f"{which}: after a comma comes {after!r}, which is no URL (it lacks a scheme); write "
                            f"each partition as a whole URL: {model}=redis://HOST1:PORT/0,redis://HOST2:PORT/0")


class ShardMap:
    """The default Redis URL and the models that live elsewhere, each on one Redis or partitioned over several."""

    def __init__(self, default: str, shards: Mapping[str, str | Sequence[str]] | None = None):
        """RedisURLError if a URL is malformed or a model names one Redis twice (a Producer's arguments are checked
        here; a command's, already when its flags were read)."""
        self.default = default if default is None else check_url(default, "redis_url")
        self.shards = _checked({model: [urls] if isinstance(urls, str) else list(urls)
                                for model, urls in (shards or {}).items()}, "shards: ")

    def partitions(self, model: str | None) -> list[str]:
        """The Redis URLs of `model`, in map order (one: the default Redis, or its shard)."""
        return self.shards.get(model, [self.default]) if model is not None else [self.default]

    def url_for(self, model: str | None) -> str:
        """The Redis of `model` (of a partitioned model: its first partition, where its adverts are read first)."""
        return self.partitions(model)[0]

    def urls(self) -> list[str]:
        """Every distinct Redis of the fleet, the default first."""
        return list(dict.fromkeys([self.default, *(u for urls in self.shards.values() for u in urls)]))

    def owns(self, url: str, model: str) -> bool:
        """Whether `model`'s adverts on `url` count (a worker on the wrong shard serves no one)."""
        return url in self.partitions(model)

    def spare(self, url: str) -> bool:
        """Whether the fleet can do without `url` for a while: it is not the default Redis and every model on it
        has another partition (its new requests go there; reads of the model sum the others)."""
        on_it = [urls for urls in self.shards.values() if url in urls]
        return url != self.default and bool(on_it) and all(len(urls) > 1 for urls in on_it)

    def __bool__(self) -> bool:
        return len(self.urls()) > 1
