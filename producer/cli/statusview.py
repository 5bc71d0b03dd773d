"""`embedfleet status`: the fleet snapshot (producer.client.fleetview) as rich tables, as JSON, or refreshed live."""

from __future__ import annotations

import json
import time

from pydantic import Field
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from common import fleetstate
from common.config import Settings
from common.errors import NO_WORKER_HINT
from common.redisclient import redact

DOC = """Served models and their queues per priority (depth, oldest job's age, in progress), live workers (host,
device and its CPU threads, dtype, batch budget, state, the round on the device, texts/s over the last minute,
last beat), failures of the last hour by error code, and the cache hit rate where workers count one."""


class StatusSettings(Settings):
    watch: float | None = Field(None, gt=0, description="refresh every this many seconds until Ctrl-C")


def main(argv: list[str]) -> int:
    parser = StatusSettings.parser("embedfleet status", DOC)
    # not a settings field: pydantic models have a `json` attribute of their own
    parser.add_argument("--json", action="store_true", help="print the snapshot as JSON, for scripts (the "
                                                            "fields are listed in producer/client/fleetview.py)")
    values = vars(parser.parse_args(argv))
    as_json = values.pop("json")
    return run(StatusSettings.from_values(parser, values), as_json)


def run(settings: StatusSettings, as_json: bool = False) -> int:
    from producer.client.blocking import Producer  # noqa: PLC0415 - rq and friends load after the flags

    with Producer(settings.redis_url, shards=settings.shards.shards) as producer:
        producer.check()
        if as_json:
            print(json.dumps(producer.fleet(), indent=2))
            return 0
        console = Console()
        if not console.is_terminal:  # a pipe or a file: whole rows, for grep, rather than a wrapped table
            console = Console(width=200)
        if settings.watch is None:
            console.print(render(producer.fleet(), settings))
            return 0
        if not console.is_terminal:  # a pipe or a file gets one snapshot after the other
            while True:
                console.print(render(producer.fleet(), settings))
                time.sleep(settings.watch)
        with Live(render(producer.fleet(), settings), console=console, auto_refresh=False) as live:
            while True:
                time.sleep(settings.watch)
                live.update(render(producer.fleet(), settings), refresh=True)


def render(fleet: dict, settings: StatusSettings) -> Group:
    from producer.client.core import looked_at  # noqa: PLC0415 - as Producer above: after the flags

    parts: list = [Text(looked_at([settings.redis_url]) if settings.redis_url else f"Redis {fleet['redis']}")]
    for up in fleetstate.running():  # an `embedfleet up` on this Redis: where its gateway is
        if up.get("redis_url") == settings.redis_url and up.get("gateway_url"):
            parts.append(Text(f"gateway {up['gateway_url']} (`embedfleet up`, pid {up['pid']})"))
    for model, urls in sorted(settings.shards.shards.items()):
        named = ", ".join(redact(url) for url in urls)
        parts.append(Text(f"shard of {model}: Redis {named}" if len(urls) == 1 else
                          f"partitions of {model}: {len(urls)} Redis, {named}"))
    if not fleet["models"]:
        parts.append(Text(f"no model is served there (no live worker): {NO_WORKER_HINT}"))
        return Group(*parts)
    parts += [_models(fleet), _workers(fleet)]
    return Group(*parts)


def _models(fleet: dict) -> Table:
    table = Table(title="models and queues", title_justify="left")
    for column in ("model", "workers", "dim / max len / pooling", "priority", "queued", "in progress",
                   "oldest", "queued tokens", "texts/s", "cache hits", "failed (1 h)"):
        table.add_column(column, justify="right" if column in ("workers", "queued", "in progress", "oldest",
                                                               "texts/s", "cache hits") else "left")
    for model in fleet["models"]:
        about = f"{model['dim']} / {model['max_model_len']} / {model['pooling']}" if model["dim"] else "-"
        failures = ", ".join(f"{code} {count}" for code, count in model["failures_last_hour"].items()) or "-"
        rate = f"{model['cache_hit_rate']:.0%}" if model["cache_hit_rate"] is not None else "-"
        name = model["name"] if model["redis"] == fleet["redis"] else f"{model['name']} (on {model['redis']})"
        for i, queue in enumerate(model["queues"]):
            first = i == 0
            table.add_row(name if first else "", str(model["live_workers"]) if first else "",
                          about if first else "", queue["priority"], str(queue["depth"]), str(queue["in_progress"]),
                          _seconds(queue["oldest_age_s"]), "-" if queue["queued_tokens"] is None else
                          str(queue["queued_tokens"]), f"{model['texts_per_s']:.1f}" if first else "",
                          rate if first else "", failures if first else "")
    return table


def _workers(fleet: dict) -> Table:
    table = Table(title="workers", title_justify="left")
    for column in ("worker", "model", "host", "device", "dtype", "batch budget", "state", "on device",
                   "texts/s (1 min)", "last beat"):
        table.add_column(column)
    for worker in fleet["workers"]:
        budget = f"{worker.get('max_batch_tokens', '?')} tok / {worker.get('max_batch_size', '?')} rows"
        if "pass_tokens_per_s" in worker:  # the learned shape's measured rate
            budget += f" @ {worker['pass_tokens_per_s']:,.0f} tok/s"
        device = worker.get("device", "?")
        if "threads" in worker:  # the CPU threads of its forward pass and why that many (worker/engine/cpus.py)
            count = worker["threads"]
            device += f", {count} thread{'s' * (count != 1)} ({worker.get('threads_source', '?')})"
        current = f"{worker['current_texts']} texts" if worker.get("current_texts") else "-"
        rate = f"{worker['texts_per_s']:.1f}" if "texts_per_s" in worker else "?"
        if worker.get("replica", "1/1") != "1/1":  # one of several engines on this device (--replicas)
            device += f" (replica {worker['replica']})"
        dtype = worker.get("dtype", "?") + (" packed" if worker.get("forward") == "packed" else "")
        table.add_row(worker["name"], worker.get("model", "?"), worker.get("host", "?"), device, dtype, budget,
                      worker.get("state", "?"), current, rate,
                      _seconds(worker["last_beat_s"]) + " ago")
    return table


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    if value < 120:
        return f"{value:.1f} s"
    return f"{value / 60:.0f} min" if value < 7200 else f"{value / 3600:.1f} h"
