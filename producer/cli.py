"""The `embedfleet` command: up, worker, gateway, embed (bulk file), status."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import numpy as np
from pydantic import Field

from common import console, keys
from common.config import Settings
from common.errors import EmbedfleetError, ValidationError
from common.redisclient import redact

USAGE = """usage: embedfleet {up,worker,gateway,embed,status,failed,health} [options]

  up       embedded Redis + worker(s) + gateway in one command (Ctrl-C stops all)
  worker   serve one model from a Redis queue        (embedfleet worker --help)
  gateway  HTTP gateway: /v1/embeddings, /pooling   (embedfleet gateway --help)
  embed    embed a file of texts into a .npy file    (embedfleet embed --help)
  status   served models, live workers, queue depths
  failed   list|show|requeue|purge failed requests  (embedfleet failed --help)
  health   a container healthcheck: --worker (its advert in Redis) or --gateway (its /health)

Without --redis-url, commands use EMBEDFLEET_REDIS_URL, else the running `embedfleet up`, else
redis://127.0.0.1:6379/0. Exit codes: 0 ok, 1 runtime failure, 2 usage error; --debug shows tracebacks.
"""


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE, file=sys.stdout if argv else sys.stderr)
        return 0 if argv else console.EXIT_USAGE
    command, rest = argv[0], argv[1:]
    if command in ("worker", "gateway"):
        # Separate programs, so that this CLI never imports torch or the web stack.
        module = "worker" if command == "worker" else "producer.gateway"
        os.execv(sys.executable, [sys.executable, "-m", module, *rest])
    commands = {"up": _up, "embed": embed_file, "status": status, "failed": _failed, "health": _health}
    if command not in commands:
        console.fail(f"unknown command {command!r}; the commands are {', '.join(['worker', 'gateway', *commands])}"
                     " (embedfleet --help)")
        return console.EXIT_USAGE
    return console.run(commands[command], rest)


def _up(argv: list[str]) -> int:
    from producer import up  # noqa: PLC0415 - only `up` needs the process supervisor

    return up.run(up.UpSettings.from_args(argv, "embedfleet up", up.__doc__))


def _failed(argv: list[str]) -> int:
    from producer import failed  # noqa: PLC0415 - rq and friends load after the command is known

    return failed.run(argv)


def _health(argv: list[str]) -> int:
    from producer import health  # noqa: PLC0415 - only `health` needs it

    parser = health.HealthSettings.parser("embedfleet health", health.__doc__)
    settings = health.HealthSettings.from_values(parser, vars(parser.parse_args(argv)))
    if settings.worker == settings.gateway:
        parser.error("pass exactly one of --worker and --gateway")
    return health.run(settings)


# -- status -------------------------------------------------------------------------------------------

def status(argv: list[str]) -> int:
    """Show the Redis in use, the served models, their live workers and queue depths."""
    settings = Settings.from_args(argv, "embedfleet status", status.__doc__)
    from producer.client import Producer  # noqa: PLC0415 - rq and friends load after the flags

    with Producer(settings.redis_url, shards=settings.shards.shards) as producer:
        producer.check()
        served = producer.models()
        print(f"Redis {redact(settings.redis_url)}")
        for model, url in sorted(settings.shards.shards.items()):
            print(f"shard of {model}: Redis {redact(url)}")
        if not served:
            print("no model is served (no live worker)")
        for name, caps in sorted(served.items()):
            shard = f", on {redact(url)}" if (url := settings.shards.url_for(name)) != settings.redis_url else ""
            print(f"{name}: {producer.live_workers(name)} live worker(s), queue depth "
                  f"{producer.queue_depth(name)}, queue {keys.queue_name(name)}, dim {caps.embedding_size}, "
                  f"max length {caps.max_model_len}, pooling {caps.pooling}{shard}")
            for worker in producer.workers(name):
                print(f"  worker {worker['name']}: {worker.get('device', '?')} {worker.get('dtype', '?')}, "
                      f"batches of {worker.get('max_batch_tokens', '?')} padded tokens / "
                      f"{worker.get('max_batch_size', '?')} rows ({worker.get('budget_source', '?')}), "
                      f"takes {worker.get('max_jobs', '?')} requests at a time, {_cache_counts(worker)}")
    return 0


def _cache_counts(worker: dict) -> str:
    """The worker's vector-cache counters (inputs found / computed since it started), or "cache off"."""
    if "cache_hits" not in worker:
        return "cache off"
    hits, misses = worker["cache_hits"], worker.get("cache_misses", 0)
    rate = f" ({100 * hits / (hits + misses):.0f}% hits)" if hits + misses else ""
    return f"cache {hits} hits / {misses} misses{rate}"


# -- embed: a file of texts into a .npy file ----------------------------------------------------------

class EmbedFileSettings(Settings):
    model: str | None = Field(None, description="served model name; default: the only one served")
    chunk: int = Field(64, ge=1, description="texts per request")
    timeout: float = Field(600.0, gt=0, description="seconds to wait for each request's result")
    embed_dtype: str = Field("float32", description="output dtype (see PoolingParams)")
    dimensions: int | None = Field(None, description="Matryoshka dimensions")
    truncate_prompt_tokens: int | None = Field(None, description="-1: truncate each text to the model's max "
                                                                 "length; default: a too-long line fails")


EMBED_DOC = """Embed INPUT into OUTPUT (.npy, one row per text, in file order). INPUT holds one text per
line (.txt; blank lines are skipped), a JSON list of texts (.json) or one JSON string per line (.jsonl).
Every line is embedded before anything is written: if any line fails, each failing line is named and
OUTPUT is not written."""
_INPUT_INDEX = re.compile(r"^input (\d+) ")


def embed_file(argv: list[str]) -> int:
    parser = EmbedFileSettings.parser("embedfleet embed", EMBED_DOC)
    parser.add_argument("input", type=Path, help="file of texts (.txt, .json, .jsonl)")
    parser.add_argument("output", type=Path, help="where to write the .npy array")
    values = vars(parser.parse_args(argv))
    source, target = values.pop("input"), values.pop("output")
    settings = EmbedFileSettings.from_values(parser, values)
    lines = _read_texts(source)
    if not lines:
        raise ValidationError(f"{source}: no texts to embed; put one text per line")
    from producer.client import Producer  # noqa: PLC0415 - rq and friends load after the flags

    fields = {k: v for k, v in {"embed_dtype": settings.embed_dtype, "dimensions": settings.dimensions,
                                "truncate_prompt_tokens": settings.truncate_prompt_tokens}.items() if v is not None}
    starts = range(0, len(lines), settings.chunk)
    with Producer(settings.redis_url, shards=settings.shards.shards) as producer:
        producer.check()
        ids = producer.submit_many([[text for _, text in lines[i:i + settings.chunk]] for i in starts],
                                   settings.model, **fields)
        arrays, failed, tokens = [], [], 0
        for start, request_id in zip(starts, ids):
            try:
                result = producer.wait(request_id, settings.timeout)
            except ValidationError as err:  # this chunk's lines are at fault: name them, go on with the rest
                failed.append(_locate(err, lines[start:start + settings.chunk]))
                continue
            arrays.append(result.embeddings)
            tokens += result.usage.prompt_tokens
    if failed:
        raise ValidationError(_failure_summary(failed, target))
    out = np.concatenate(arrays)
    np.save(target, out)
    print(f"embedded {len(lines)} texts ({tokens} tokens) -> {target} {out.shape} {out.dtype}")
    return 0


def _read_texts(path: Path) -> list[tuple[str, str]]:
    """(where, text) pairs; `where` is FILE:LINE (FILE item N for a JSON list), for error messages."""
    raw = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        try:
            texts = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ValidationError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg}); a .json file holds one "
                                  "list of texts") from None
        if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
            raise ValidationError(f"{path}: expected a JSON list of strings; use .txt for one text per line")
        return [(f"{path} item {i}", text) for i, text in enumerate(texts)]
    lines = [(f"{path}:{n}", line) for n, line in enumerate(raw.splitlines(), 1) if line.strip()]
    if path.suffix == ".jsonl":
        return [(where, _json_string(where, line)) for where, line in lines]
    return lines


def _json_string(where: str, line: str) -> str:
    try:
        text = json.loads(line)
    except json.JSONDecodeError:
        text = None
    if not isinstance(text, str):
        raise ValidationError(f"{where}: not a JSON string; each line of a .jsonl file holds one, like \"a text\"")
    return text


def _locate(err: EmbedfleetError, chunk: list[tuple[str, str]]) -> str:
    """The error of one request as `FILE:LINE: what`, the line found from the worker's "input N"."""
    found = _INPUT_INDEX.match(err.message)
    if found and int(found.group(1)) < len(chunk):
        what = err.message[found.end():].split(": shorten it")[0]
        return f"{chunk[int(found.group(1))][0]} {what}"
    return f"{chunk[0][0]} to {chunk[-1][0].rsplit(':', 1)[-1]}: {err.message}"


def _failure_summary(failed: list[str], target: Path) -> str:
    more = f" (and {len(failed) - 3} more)" if len(failed) > 3 else ""
    too_long = any("tokens, more than" in f for f in failed)
    hint = "pass --truncate-prompt-tokens -1 to cut long texts to the model's maximum" if too_long \
        else "fix those lines"
    return f"{'; '.join(failed[:3])}{more}; {target} not written; {hint}"


if __name__ == "__main__":
    sys.exit(main())
