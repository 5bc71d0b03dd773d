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
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

ENV_REDIS_SHARDS = "EMBEDFLEET_REDIS_SHARDS"
_ENTRY_SPLIT = re.compile(r"[;\s]+")
_URL_SPLIT = re.compile(r",(?=[a-z][a-z0-9+.-]*://)")  # a comma that starts another URL, not one inside a URL


def resolve_shards(shards: Mapping[str, str | Sequence[str]] | None) -> Mapping[str, str | Sequence[str]]:
    """A client's shard map: the one it was given, else EMBEDFLEET_REDIS_SHARDS's, as every command reads it (a
    Producer() beside `embedfleet worker` and `status` in one environment sees the same partitions)."""
    return parse_shards(os.environ.get(ENV_REDIS_SHARDS)) if shards is None else shards


def parse_shards(text: str | None) -> dict[str, list[str]]:
    """{model: [url, ...]} from the inline or @FILE form (see the module docstring); ValueError if malformed."""
    if not text or not text.strip():
        return {}
    text = text.strip()
    if text.startswith("@"):
        path = Path(text[1:])
        try:
            body = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ValueError(f"cannot read the shard map {path}: {exc.strerror}") from None
        if body.lstrip().startswith("{"):
            return _checked(_from_json(body, path), str(path))
        lines = [line.split("#", 1)[0] for line in body.splitlines()]
        return _checked(_pairs([e for line in lines for e in _ENTRY_SPLIT.split(line.strip()) if e]), str(path))
    return _checked(_pairs([e for e in _ENTRY_SPLIT.split(text) if e]), "--redis-shards")


def _from_json(body: str, path: Path) -> dict[str, list[str]]:
    try:
        loaded = json.loads(body)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg})") from None
    out = {}
    for model, urls in loaded.items():
        if isinstance(urls, str):
            urls = [urls]
        if not isinstance(urls, list) or not urls or not all(isinstance(u, str) for u in urls):
            raise ValueError(f"{path}: a JSON shard map maps model names to a URL string or a non-empty list of "
                             f"them; {model!r} maps to {urls!r}")
        out[model] = urls
    return out


def _pairs(entries: list[str]) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for entry in entries:
        model, sep, urls = entry.partition("=")
        if not sep or not model or not urls:
            raise ValueError(f"shard map entry {entry!r} is not MODEL=URL[,URL...]")
        if model in found:
            raise ValueError(f"model {model!r} is mapped twice in the shard map (list its partitions in one entry: "
                             "MODEL=URL1,URL2)")
        found[model] = _URL_SPLIT.split(urls)
    return found


def _checked(shards: dict[str, list[str]], where: str) -> dict[str, list[str]]:
    for model, urls in shards.items():
        for url in urls:
            if "://" not in url:
                raise ValueError(f"{where}: a shard of model {model!r} is {url!r}, not a Redis URL")
        if len(set(urls)) != len(urls):
            raise ValueError(f"{where}: model {model!r} names a Redis twice among its partitions: {urls}")
    return shards


class ShardMap:
    """The default Redis URL and the models that live elsewhere, each on one Redis or partitioned over several."""

    def __init__(self, default: str, shards: Mapping[str, str | Sequence[str]] | None = None):
        self.default = default
        self.shards = {model: [urls] if isinstance(urls, str) else list(urls) for model, urls in (shards or {}).items()}

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
