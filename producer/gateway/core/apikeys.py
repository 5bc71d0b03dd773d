"""API keys with a weight and an optional rate: each key's fair share of the gateway (issue #10).

Configured with --api-keys (env EMBEDFLEET_API_KEYS): a JSON object, inline or in a file named `@PATH`,
mapping each key to its options; --api-key KEY stays the one-key shorthand (weight 1, no rate).

    {"sk-web-7f3a": {"name": "web", "weight": 3},
     "sk-batch-91c": {"name": "batch", "weight": 1, "rate": 20, "burst": 40}}

rate   requests per second the key may send (POST /v1/embeddings, /pooling, /v1/jobs), as a token bucket
       of `burst` requests (default: one second's worth); past it: 429 rate_limited with Retry-After
       saying when the next request fits. Counted per gateway process: with N replicas, N times the rate.
weight the key's share of --max-in-flight (the requests this gateway holds waiting for their results):
       while the gateway holds fewer, any key gets in; once it is full, a key is admitted only while it
       holds less than weight / (sum of weights) of it, so a busy key cannot take a quiet key's turn.
       Without keys, a full gateway refuses every new request (429 rate_limited) until one is answered.
name   what metrics and logs call the key (never the key itself); default key1, key2, ... in file order.
"""

from __future__ import annotations

import contextlib
import json
import math
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from embedfleet.producer.gateway.core.errors import RateLimitedError

_OPTIONS = {"name", "weight", "rate", "burst"}


@dataclass(frozen=True)
class ApiKey:
    name: str
    weight: float = 1.0
    rate: float | None = None  # requests per second; None: unlimited
    burst: float | None = None  # bucket size; default max(1, rate)

    @property
    def bucket(self) -> float:
        return self.burst if self.burst is not None else max(1.0, self.rate or 1.0)


def parse_api_keys(text: str | None, single: str | None = None) -> dict[str, ApiKey]:
    """{key: ApiKey} from --api-keys (inline JSON or @FILE) plus --api-key; ValueError saying what is wrong."""
    found: dict[str, ApiKey] = {}
    if single:
        found[single] = ApiKey("default")
    if not text or not text.strip():
        return found
    text, where = text.strip(), "--api-keys"
    if text.startswith("@"):
        where = text[1:]
        try:
            text = Path(where).read_text(encoding="utf-8")
        except OSError as exc:
            raise ValueError(f"cannot read the API keys file {where}: {exc.strerror}") from None
    try:
        loaded = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where}: not valid JSON ({exc.msg} at line {exc.lineno}); expected an object "
                         '{"KEY": {"name": ..., "weight": 1, "rate": 10, "burst": 20}, ...}') from None
    if not isinstance(loaded, dict) or not loaded:
        raise ValueError(f"{where}: expected a non-empty JSON object mapping each API key to its options")
    for index, (key, options) in enumerate(loaded.items(), start=1):
        found[key] = _key(key, options, f"key{index}", where)
    names = [k.name for k in found.values()]
    if len(set(names)) != len(names):
        raise ValueError(f"{where}: two keys share a name ({sorted(n for n in names if names.count(n) > 1)[0]!r}); "
                         "names label metrics, give each key its own")
    return found


def _key(key, options, default_name: str, where: str) -> ApiKey:
    what = f"{where}: key #{default_name.removeprefix('key')}"
    if not isinstance(key, str) or not key.strip() or key != key.strip() or not key.isprintable():
        raise ValueError(f"{what}: a key must be non-empty printable text without surrounding spaces")
    if options is None:
        options = {}
    if not isinstance(options, dict) or set(options) - _OPTIONS:
        unknown = sorted(set(options) - _OPTIONS) if isinstance(options, dict) else options
        raise ValueError(f"{what}: options must be an object with {sorted(_OPTIONS)}; got {unknown!r}")
    name = options.get("name", default_name)
    if not isinstance(name, str) or not name:
        raise ValueError(f"{what}: `name` must be non-empty text")
    values = {}
    for field in ("weight", "rate", "burst"):
        value = options.get(field)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not math.isfinite(value) or value <= 0):
            raise ValueError(f"{what} ({name}): `{field}` must be a positive number, got {value!r}")
        values[field] = value
    if values["burst"] is not None and values["rate"] is None:
        raise ValueError(f"{what} ({name}): `burst` needs a `rate`")
    if values["burst"] is not None and values["burst"] < 1:
        raise ValueError(f"{what} ({name}): `burst` must be at least 1 request, got {values['burst']}")
    return ApiKey(name, float(values["weight"] or 1.0), values["rate"], values["burst"])


class KeyLimiter:
    """Token buckets and in-flight counts per key, for one gateway process (thread-safe)."""

    def __init__(self, keys: dict[str, ApiKey], max_in_flight: int | None = None, clock=time.monotonic):
        self.keys = {key.name: key for key in keys.values()}
        self.max_in_flight = max_in_flight
        self.clock = clock
        total = sum(key.weight for key in self.keys.values()) or 1.0
        self.share = {name: max(1, math.floor((max_in_flight or 0) * key.weight / total))
                      for name, key in self.keys.items()}
        self._tokens = {name: key.bucket for name, key in self.keys.items()}
        self._stamp = {name: clock() for name in self.keys}
        self._in_flight = dict.fromkeys(self.keys, 0)
        self._total = 0
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def admit(self, name: str | None):
        """Hold one request of key `name` (None: no keys configured) until the block ends; raises
        RateLimitedError over the key's rate, or when the gateway is full and the key holds its share
        (without keys: when the gateway is full)."""
        with self._lock:
            if name is None:
                self._check_total()
            else:
                self._check_share(name)
                self._take_token(name)
                self._in_flight[name] += 1
            self._total += 1
        try:
            yield
        finally:
            with self._lock:
                self._total -= 1
                if name is not None:
                    self._in_flight[name] -= 1

    def _take_token(self, name: str) -> None:
        key = self.keys[name]
        if key.rate is None:
            return
        now = self.clock()
        tokens = min(key.bucket, self._tokens[name] + (now - self._stamp[name]) * key.rate)
        self._stamp[name] = now
        if tokens < 1:
            self._tokens[name] = tokens
            wait = (1 - tokens) / key.rate
            raise RateLimitedError(f"API key '{name}' is over its rate of {key.rate:g} requests/s (burst "
                                   f"{key.bucket:g}); retry in {wait:.2f} s", retry_after=max(1, math.ceil(wait)))
        self._tokens[name] = tokens - 1

    def _check_total(self) -> None:
        """Without keys, nobody has a share to keep: a full gateway refuses every new request."""
        if self.max_in_flight is not None and self._total >= self.max_in_flight:
            raise RateLimitedError(
                f"the gateway holds {self._total} requests waiting for results (--max-in-flight "
                f"{self.max_in_flight}); retry when earlier requests have been answered", retry_after=1)

    def _check_share(self, name: str) -> None:
        if self.max_in_flight is None or self._total < self.max_in_flight:
            return
        if self._in_flight[name] >= self.share[name]:
            raise RateLimitedError(
                f"the gateway holds {self._total} requests (--max-in-flight {self.max_in_flight}) and API key "
                f"'{name}' holds {self._in_flight[name]}, its weighted share ({self.share[name]}); retry when its "
                "earlier requests have been answered", retry_after=1)
