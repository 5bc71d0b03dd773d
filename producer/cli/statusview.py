"""`embedfleet status`: the fleet snapshot (producer.client.fleetview) as rich tables, as JSON, or refreshed live."""

from __future__ import annotations

import json
import shutil
from typing import NamedTuple

from pydantic import Field
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from embedfleet.common import fleetstate
from embedfleet.common.config import Settings
from embedfleet.common.console import EXIT_INTERRUPTED
from embedfleet.common.errors import NO_WORKER_HINT
from embedfleet.common.redisclient import redact
from embedfleet.producer.cli.ctrlc import CtrlC

DOC = """Served models and their queues per priority (depth, oldest job's age, in progress), live workers (host,
device and its CPU threads, dtype, batch budget, state, the round on the device, texts/s over the last minute,
last beat), failures of the last hour by error code, and the cache hit rate where workers count one. By default
the tables keep to the columns that fit 80 characters (or the terminal's width); --wide shows them all."""

WHOLE_ROWS = 1000  # --wide's width: wider than any row, so that none is folded or cut


class Column(NamedTuple):
    cell: str  # the key of its cell in each row
    header: str
    right: bool = False  # a number's column


MODEL_COLUMNS = (Column("model", "model"), Column("workers", "workers", True),
                 Column("about", "dim / max len / pooling"), Column("priority", "priority"),
                 Column("queued", "queued", True), Column("in_progress", "in progress", True),
                 Column("oldest", "oldest", True), Column("queued_tokens", "queued tokens"),
                 Column("texts_per_s", "texts/s", True), Column("cache_hits", "cache hits", True),
                 Column("failures", "failed (1 h)"))
WORKER_COLUMNS = (Column("worker", "worker"), Column("model", "model"), Column("host", "host"),
                  Column("device_details", "device"), Column("dtype", "dtype"), Column("budget", "batch budget"),
                  Column("state", "state"), Column("on_device", "on device"),
                  Column("texts_per_s", "texts/s (1 min)"), Column("last_beat", "last beat"))
# Within 80 columns for a model's name of up to 22 characters and a worker's of 21 (a longer one folds, whole).
# Left to --wide: a model's shape, queued tokens, throughput (the workers table has it) and cache hits, its failures'
# codes (here their count) and its Redis (the lines above the tables name a shard's); a worker's host (in its
# default name), CPU threads, replica, dtype, batch budget, the round on its device (its state says busy) and last
# beat.
NARROW_MODEL_COLUMNS = (Column("name", "model"), Column("priority", "priority"), Column("queued", "queued", True),
                        Column("in_progress", "in\nprogress", True), Column("oldest", "oldest", True),
                        Column("failed", "failed\n(1 h)", True))
NARROW_WORKER_COLUMNS = (Column("worker", "worker"), Column("model", "model"), Column("device", "device"),
                         Column("state", "state"), Column("texts_per_s", "texts/s\n(1 min)"))


class StatusSettings(Settings):
    watch: float | None = Field(None, gt=0, description="refresh every this many seconds until Ctrl-C")
    wide: bool = Field(False, description="every column, however wide the rows (default: the essential ones, "
                                          "within COLUMNS, else the terminal's width, else 80)")


def main(argv: list[str]) -> int:
    parser = StatusSettings.parser("embedfleet status", DOC)
    # not a settings field: pydantic models have a `json` attribute of their own
    parser.add_argument("--json", action="store_true", help="print the snapshot as JSON, for scripts (the "
                                                            "fields are listed in producer/client/fleetview.py)")
    values = vars(parser.parse_args(argv))
    as_json = values.pop("json")
    return run(StatusSettings.from_values(parser, values), as_json)


def run(settings: StatusSettings, as_json: bool = False) -> int:
    from embedfleet.producer.client.blocking import Producer  # noqa: PLC0415 - rq and friends load after the flags

    with Producer(settings.redis_url, shards=settings.shards.shards) as producer:
        producer.check()
        if as_json:
            print(json.dumps(producer.fleet(), indent=2))
            return 0
        console = Console()  # a terminal's width: COLUMNS where set, else the terminal's
        if settings.wide:  # whole rows: a terminal narrower than them wraps them, `less -S` does not
            console = Console(width=WHOLE_ROWS)
        elif not console.is_terminal:  # a pipe or a file: COLUMNS where set, else 80 (not stdin's terminal's)
            console = Console(width=shutil.get_terminal_size().columns)
        if settings.watch is None:
            console.print(render(producer.fleet(), settings))
            return 0
        # Until Ctrl-C, noted and acted on between refreshes (CtrlC): raised inside a Redis read, Python's
        # KeyboardInterrupt was now and then lost there, and the watch went on
        with CtrlC() as ctrl_c:
            if not console.is_terminal:  # a pipe or a file gets one snapshot after the other
                while not ctrl_c.pressed:
                    console.print(render(producer.fleet(), settings))
                    ctrl_c.sleep(settings.watch)
                return EXIT_INTERRUPTED
            # redrawn in place, so every line must fit the screen: --wide's rows too
            with Live(render(producer.fleet(), settings), console=Console(), auto_refresh=False) as live:
                ctrl_c.sleep(settings.watch)
                while not ctrl_c.pressed:
                    live.update(render(producer.fleet(), settings), refresh=True)
                    ctrl_c.sleep(settings.watch)
            return EXIT_INTERRUPTED


def render(fleet: dict, settings: StatusSettings) -> Group:
    from embedfleet.producer.client.core import looked_at  # noqa: PLC0415 - as Producer above: after the flags

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
    else:
        parts += [_models(fleet, settings.wide), _workers(fleet, settings.wide)]
    return Group(*parts, *_unreachable(fleet))


def _unreachable(fleet: dict) -> list[Text]:
    """A line per partition's Redis that did not answer (the snapshot's `unreachable`), named as a 503 names it
    (producer/client/placement.py): what is above is its model's other partitions'."""
    by_url: dict[str, list[dict]] = {}
    for entry in fleet.get("unreachable", []):
        by_url.setdefault(entry["url"], []).append(entry)
    lines = []
    for url, entries in by_url.items():
        named = ", ".join(f"partition {e['partition']} of {e['of']} of model '{e['model']}'" for e in entries)
        lines.append(Text(f"{named} (Redis {url}) is unreachable ({entries[0]['error'].rstrip('.')}); the counts "
                          "above are the other partitions'", style="yellow"))
    return lines


def _models(fleet: dict, wide: bool) -> Table:
    rows = []
    for model in fleet["models"]:
        failures = model["failures_last_hour"]
        where = f" (on {model['redis']})" if model["redis"] != fleet["redis"] else ""
        whole = {"name": model["name"], "model": model["name"] + where,
                 "workers": str(model["live_workers"]),
                 "about": f"{model['dim']} / {model['max_model_len']} / {model['pooling']}" if model["dim"] else "-",
                 "texts_per_s": f"{model['texts_per_s']:.1f}",
                 "cache_hits": "-" if model["cache_hit_rate"] is None else f"{model['cache_hit_rate']:.0%}",
                 "failures": ", ".join(f"{code} {count}" for code, count in failures.items()) or "-",
                 "failed": str(sum(failures.values())) if failures else "-"}
        for i, queue in enumerate(model["queues"]):  # the model's own cells on its first queue's row
            rows.append({**(whole if i == 0 else dict.fromkeys(whole, "")), "priority": queue["priority"],
                         "queued": str(queue["depth"]), "in_progress": str(queue["in_progress"]),
                         "oldest": _seconds(queue["oldest_age_s"]),
                         "queued_tokens": "-" if queue["queued_tokens"] is None else str(queue["queued_tokens"])})
    return _table("models and queues", MODEL_COLUMNS if wide else NARROW_MODEL_COLUMNS, rows)


def _workers(fleet: dict, wide: bool) -> Table:
    rows = []
    for worker in fleet["workers"]:
        budget = f"{worker.get('max_batch_tokens', '?')} tok / {worker.get('max_batch_size', '?')} rows"
        if "pass_tokens_per_s" in worker:  # the learned shape's measured rate
            budget += f" @ {worker['pass_tokens_per_s']:,.0f} tok/s"
        device = details = worker.get("device", "?")
        if "threads" in worker:  # the CPU threads of its forward pass and why that many (worker/engine/cpus.py)
            count = worker["threads"]
            details += f", {count} thread{'s' * (count != 1)} ({worker.get('threads_source', '?')})"
        if worker.get("replica", "1/1") != "1/1":  # one of several engines on this device (--replicas)
            details += f" (replica {worker['replica']})"
        rows.append({"worker": worker["name"], "model": worker.get("model", "?"), "host": worker.get("host", "?"),
                     "device": device, "device_details": details,
                     "dtype": worker.get("dtype", "?") + (" packed" if worker.get("forward") == "packed" else ""),
                     "budget": budget, "state": worker.get("state", "?"),
                     "on_device": f"{worker['current_texts']} texts" if worker.get("current_texts") else "-",
                     "texts_per_s": f"{worker['texts_per_s']:.1f}" if "texts_per_s" in worker else "?",
                     "last_beat": _seconds(worker["last_beat_s"]) + " ago"})
    return _table("workers", WORKER_COLUMNS if wide else NARROW_WORKER_COLUMNS, rows)


def _table(title: str, columns: tuple[Column, ...], rows: list[dict]) -> Table:
    table = Table(title=title, title_justify="left")
    for column in columns:  # a cell too wide for its column folds onto more lines, whole, rather than being cut
        table.add_column(column.header, justify="right" if column.right else "left", overflow="fold")
    for row in rows:
        table.add_row(*(row[column.cell] for column in columns))
    return table


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    if value < 120:
        return f"{value:.1f} s"
    return f"{value / 60:.0f} min" if value < 7200 else f"{value / 3600:.1f} h"
