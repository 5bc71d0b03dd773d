"""The `embedfleet` command: up, worker, gateway, embed (bulk file), status."""

from __future__ import annotations

import contextlib
import os
import sys

from embedfleet.common import console
from embedfleet.common.errors import StartupError

USAGE = """usage: embedfleet {up,worker,gateway,embed,status,failed,health} [options]

  up       embedded Redis + worker(s) + gateway in one command (Ctrl-C stops all)
  worker   serve one model from a Redis queue        (embedfleet worker --help)
  gateway  HTTP gateway: /v1/embeddings, /pooling   (embedfleet gateway --help)
  embed    embed a file (txt, json, jsonl, csv, parquet, OpenAI batch) into .npy/.parquet/.jsonl, resumable
  status   models, queues per priority, workers, failures (--json for scripts, --watch to refresh)
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
        module = "embedfleet.worker" if command == "worker" else "embedfleet.producer.gateway"
        os.execv(sys.executable, [sys.executable, "-m", module, *rest])
    commands = {"up": _up, "embed": embed_file, "status": status, "failed": _failed, "health": _health}
    if command not in commands:
        console.fail(f"unknown command {command!r}; the commands are {', '.join(['worker', 'gateway', *commands])}"
                     " (embedfleet --help)")
        return console.EXIT_USAGE
    return console.run(commands[command], rest)


def _up(argv: list[str]) -> int:
    from embedfleet.producer.cli import up  # noqa: PLC0415 - only `up` needs the process supervisor

    return up.run(up.UpSettings.from_args(argv, "embedfleet up", up.__doc__))


def _failed(argv: list[str]) -> int:
    from embedfleet.producer.cli import failed  # noqa: PLC0415 - rq and friends load after the command is known

    return failed.run(argv)


def _health(argv: list[str]) -> int:
    from embedfleet.producer.cli import health  # noqa: PLC0415 - only `health` needs it

    parser = health.HealthSettings.parser("embedfleet health", health.__doc__)
    settings = health.HealthSettings.from_values(parser, vars(parser.parse_args(argv)))
    if settings.worker == settings.gateway:
        parser.error("pass exactly one of --worker and --gateway")
    return health.run(settings)


# -- status and embed: the [cli] extra's tables, progress bar and Parquet ---------------------------

def status(argv: list[str]) -> int:
    with _cli_extra("status"):
        from embedfleet.producer.cli import statusview  # noqa: PLC0415 - rich loads only for `status`

        return statusview.main(argv)


def embed_file(argv: list[str]) -> int:
    with _cli_extra("embed"):
        from embedfleet.producer.cli import bulk  # noqa: PLC0415 - its readers and writers load only for `embed`

        return bulk.main(argv)


@contextlib.contextmanager
def _cli_extra(command: str):
    """A missing rich or pyarrow (a client-only install) is one line that says what to install."""
    try:
        yield
    except ModuleNotFoundError as exc:
        if exc.name not in ("rich", "pyarrow"):
            raise
        raise StartupError(f"`embedfleet {command}` needs the {exc.name} package; install it with "
                           "pip install 'embedfleet[cli]'") from exc

