"""Which Redis holds which model: a fleet grows past one Redis by giving models Redis shards of their own.

A shard map names a Redis URL per served model name; a model not in the map lives on the default Redis
(--redis-url). Everything of a model lives on its shard: its rq queue and jobs, its requests' results,
notify lists and reply-stream entries, its adverts (embedfleet:models, embedfleet:model:<name>...) and its
workers. Producers, the gateway and `embedfleet status` read the map; a worker serving a mapped model
connects to that model's shard. A request id is found on the shard its producer sent it to (remembered),
else by asking each shard (an id is unique across the fleet).

The map is given as --redis-shards / EMBEDFLEET_REDIS_SHARDS, either inline,

    MODEL=URL[;MODEL=URL...]        (`;` or whitespace between entries; URLs may hold commas)

or as @FILE: a JSON object {"MODEL": "URL", ...}, or a text file of MODEL=URL lines (# comments).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path

_ENTRY_SPLIT = re.compile(r"[;\s]+")


def parse_shards(text: str | None) -> dict[str, str]:
    """{model: url} from the inline or @FILE form (see the module docstring); ValueError if malformed."""
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
            try:
                loaded = json.loads(body)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg})") from None
            if not all(isinstance(k, str) and isinstance(v, str) for k, v in loaded.items()):
                raise ValueError(f"{path}: a JSON shard map maps model names to URL strings")
            return _checked(loaded, str(path))
        lines = [line.split("#", 1)[0] for line in body.splitlines()]
        return _checked(_pairs([e for line in lines for e in _ENTRY_SPLIT.split(line.strip()) if e]), str(path))
    return _checked(_pairs([e for e in _ENTRY_SPLIT.split(text) if e]), "--redis-shards")


def _pairs(entries: list[str]) -> dict[str, str]:
    found: dict[str, str] = {}
    for entry in entries:
        model, sep, url = entry.partition("=")
        if not sep or not model or not url:
            raise ValueError(f"shard map entry {entry!r} is not MODEL=URL")
        if model in found:
            raise ValueError(f"model {model!r} is mapped twice in the shard map")
        found[model] = url
    return found


def _checked(shards: dict[str, str], where: str) -> dict[str, str]:
    for model, url in shards.items():
        if "://" not in url:
            raise ValueError(f"{where}: the shard of model {model!r} is {url!r}, not a Redis URL")
    return shards


class ShardMap:
    """The default Redis URL and the models that live elsewhere."""

    def __init__(self, default: str, shards: Mapping[str, str] | None = None):
        self.default = default
        self.shards = dict(shards or {})

    def url_for(self, model: str | None) -> str:
        return self.shards.get(model, self.default) if model is not None else self.default

    def urls(self) -> list[str]:
        """Every distinct Redis of the fleet, the default first."""
        return list(dict.fromkeys([self.default, *self.shards.values()]))

    def owns(self, url: str, model: str) -> bool:
        """Whether `model`'s adverts on `url` count (a worker on the wrong shard serves no one)."""
        return self.url_for(model) == url

    def __bool__(self) -> bool:
        return len(self.urls()) > 1
