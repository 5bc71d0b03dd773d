"""`embedfleet health --worker | --gateway`: a container healthcheck, exit 0 when healthy, else 1 and why.

--worker: a worker on this host (its advert's `host` fact is this machine's hostname, i.e. this
container's) has beaten within ADVERTISE_TTL, for --model or for any model; --any-host accepts a live
worker anywhere (a fleet-level check). The advert appears once the model has loaded and the batch-shape
probe has run, so a healthcheck wants a start period of a minute or two.
--gateway: the gateway at --url answers GET /health with 200 (Redis reachable and a live worker).
"""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request

import redis
from pydantic import Field

from embedfleet.common.config import Settings
from embedfleet.common.errors import NoWorkerError, StartupError, UnavailableError
from embedfleet.common.policy import ADVERTISE_TTL
from embedfleet.common.protocol import keys
from embedfleet.common.redisclient import connect, redact
from embedfleet.producer.client.core import parse_worker_info
from embedfleet.producer.client.placement import unavailable


class HealthSettings(Settings):
    worker: bool = Field(False, description="check that a worker on this host advertises a model in Redis")
    gateway: bool = Field(False, description="check that the gateway at --url answers /health with 200")
    model: str | None = Field(None, description="--worker: the served model name to look for; default: any")
    any_host: bool = Field(False, description="--worker: a live worker on any host will do")
    url: str = Field("http://127.0.0.1:8000", description="--gateway: the gateway's base URL")
    timeout: float = Field(5.0, gt=0, description="seconds the check may take")


def run(settings: HealthSettings) -> int:
    print(check_worker(settings) if settings.worker else check_gateway(settings.url, settings.timeout))
    return 0


def check_worker(settings: HealthSettings) -> str:
    host = socket.gethostname()
    urls = settings.shards.partitions(settings.model) if settings.model else settings.shards.urls()
    down = []  # partitions that did not answer while their models have others: named if none is healthy
    for url in urls:
        connection = connect(url)
        try:
            found = _live_worker(settings, connection, url, host)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            if not settings.shards.spare(url):
                raise
            down.append(f"; {str(unavailable(settings.shards, url, exc)).rstrip('.')}")
            continue
        finally:
            connection.close()
        if found:
            return found
    where = "anywhere" if settings.any_host else f"on host {host}"
    what = f"model {settings.model}" if settings.model else "any model"
    raise NoWorkerError(f"unhealthy: no live worker {where} advertises {what} (beat within "
                        f"{ADVERTISE_TTL} s){''.join(down)}")


def _live_worker(settings: HealthSettings, connection: redis.Redis, url: str, host: str) -> str | None:
    """The healthy line for a live worker at `url` that the check accepts, else None."""
    horizon = time.time() - ADVERTISE_TTL
    models = [settings.model] if settings.model else sorted(m.decode() for m in connection.smembers(keys.MODELS_KEY))
    for model in models:
        if not settings.shards.owns(url, model):
            continue
        names = connection.zrangebyscore(keys.model_workers_key(model), horizon, "+inf")
        facts = connection.mget([keys.worker_info_key(n.decode()) for n in names]) if names else []
        for name, raw in zip(names, facts):
            info = parse_worker_info(name.decode(), raw)  # an advert is input: garbage reads as absent
            if info is None:
                continue
            if settings.any_host or info.get("host") == host:
                return f"healthy: worker {name.decode()} serves {model} on {redact(url)}"
    return None


def check_gateway(url: str, timeout: float) -> str:
    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}/health", timeout=timeout) as answer:
            body = json.loads(answer.read() or b"{}")
            return f"healthy: gateway {url} ({body.get('status', 'ok')}, models {body.get('models', {})})"
    except urllib.error.HTTPError as exc:
        reason = exc.read().decode("utf-8", "replace")[:300]
        raise UnavailableError(f"unhealthy: gateway {url} answered /health with {exc.code}: {reason}") from None
    except OSError as exc:
        raise StartupError(f"unhealthy: gateway {url} does not answer ({exc})") from None
