"""Settings built once at an entry point: every field is a command-line flag and an EMBEDFLEET_ env var."""

from __future__ import annotations

import argparse
import shutil
import sys
import types
import typing
from typing import ClassVar

from pydantic import Field, PrivateAttr, ValidationInfo, field_validator, model_validator
from pydantic import ValidationError as PydanticValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from embedfleet.common.fleetstate import resolve_redis_url
from embedfleet.common.redisclient import with_tls
from embedfleet.common.redisurls import check_url
from embedfleet.common.shards import ShardMap, parse_shards

ENV_PREFIX = "EMBEDFLEET_"


class Settings(BaseSettings):
    """Base for each entry point's settings; flags override env vars, env vars override defaults."""

    # An empty variable is an unset one, for every setting: docker compose passes a line such as
    # `EMBEDFLEET_THREADS: ${THREADS:-}` as "" when the user set nothing.
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid", env_ignore_empty=True)
    discovers_redis: ClassVar[bool] = True  # False where no URL means something else (`up` starts one)
    # --help's sections, in order: (title, field names); the fields of no section come last, under "options"
    flag_groups: ClassVar[tuple[tuple[str, tuple[str, ...]], ...]] = ()
    # flags a parent process sets on its children: accepted, never listed by --help
    internal_flags: ClassVar[frozenset[str]] = frozenset()

    redis_url: str | None = Field(None, description="the fleet's Redis; default: the running `embedfleet up`'s, "
                                                    "else redis://127.0.0.1:6379/0")
    redis_tls_ca: str | None = Field(None, description="CA file (PEM) of the server's certificate, for rediss:// "
                                                       "URLs")
    redis_tls_cert: str | None = Field(None, description="client certificate (PEM), for a Redis with "
                                                         "tls-auth-clients")
    redis_tls_key: str | None = Field(None, repr=False, description="that certificate's private key (PEM)")
    redis_shards: str | None = Field(None, description="models on a Redis of their own, or partitioned over "
                                                       "several: MODEL=URL[,URL...][;MODEL=...] or @FILE")
    debug: bool = Field(False, description="on an error, print the traceback too")
    _shards: dict[str, list[str]] = PrivateAttr(default_factory=dict)

    @field_validator("*", mode="before")
    @classmethod
    def _comma_list(cls, value, info: ValidationInfo):
        """A list setting given in an env var reads as its flag does (A,B,...), JSON lists too."""
        field = cls.model_fields[info.field_name]
        if isinstance(value, str) and typing.get_origin(_base_type(field.annotation)) is list:
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("redis_url", "cache_url", check_fields=False)
    @classmethod
    def _redis_url(cls, value: str | None) -> str | None:
        """A malformed Redis URL is a usage error of the setting that holds it (exit 2), before anything connects;
        its message never holds the password (common.redisurls.check_url)."""
        return check_url(value) if value else value

    @field_validator("redis_shards")
    @classmethod
    def _shard_map(cls, value: str | None) -> str | None:
        """A malformed shard map (or a URL in it) is a usage error of --redis-shards, before any engine starts."""
        parse_shards(value)  # read again by _find_redis, which adds the TLS files to its rediss:// URLs
        return value

    @model_validator(mode="after")
    def _find_redis(self):
        if self.discovers_redis:
            self.redis_url = resolve_redis_url(self.redis_url)  # see common.fleetstate for the order
        # The TLS files travel inside each URL (redis-py reads them from its query), so every client made
        # from a URL, in this process or a child it starts, gets them.
        tls = {"ca": self.redis_tls_ca, "cert": self.redis_tls_cert, "key": self.redis_tls_key}
        if self.redis_url:
            self.redis_url = with_tls(self.redis_url, **tls)
        self._shards = {model: [with_tls(url, **tls) if url.startswith("rediss") else url for url in urls]
                        for model, urls in parse_shards(self.redis_shards).items()}
        return self

    @property
    def shards(self) -> ShardMap:
        """The default Redis and the models on shards of their own (common.shards)."""
        return ShardMap(self.redis_url, self._shards)

    @classmethod
    def parser(cls, prog: str, description: str) -> argparse.ArgumentParser:
        parser = OneLineParser(prog=prog, description=description, formatter_class=_Formatter,
                               epilog=f"Each flag is also an environment variable: --redis-url URL is {ENV_PREFIX}"
                                      "REDIS_URL=URL (empty: unset; a flag wins over its variable).")
        grouped = {name for _, names in cls.flag_groups for name in names}
        sections = [(parser.add_argument_group(title), names) for title, names in cls.flag_groups]
        rest = parser.add_argument_group("options") if sections else parser
        sections.append((rest, tuple(name for name in cls.model_fields if name not in grouped)))
        for section, names in sections:
            for name in names:
                _add_flag(section, name, cls.model_fields[name], hidden=name in cls.internal_flags)
        return parser

    @classmethod
    def from_args(cls, argv: list[str] | None, prog: str, description: str):
        parser = cls.parser(prog, description)
        return cls.from_values(parser, vars(parser.parse_args(argv)))

    @classmethod
    def from_values(cls, parser: argparse.ArgumentParser, values: dict):
        """The settings from parsed flags (plus env vars); a value they refuse is a usage error."""
        try:
            return cls(**values)
        except PydanticValidationError as exc:  # e.g. --result-ttl 0, or a bad env value
            parser.error(_problems(exc.errors(), given=values))


def _problems(errors: list[dict], given: dict) -> str:
    """pydantic's errors as `--flag: what` for a flag the user gave, `EMBEDFLEET_VAR: what` for a value that
    came from the environment (the variable is what the user has to find in a compose file)."""
    parts = []
    for err in errors:
        name = str(err["loc"][0]) if err.get("loc") else ""
        text = err.get("msg", "").removeprefix("Value error, ")
        if name:
            where = "--" + name.replace("_", "-") if name in given else ENV_PREFIX + name.upper()
            text = f"{where}: {text}"
        if text not in parts:
            parts.append(text)
    return "; ".join(parts) or "invalid settings"


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line, `embedfleet: <what>; <what to do>`, exit code 2, and
    whose usage line is `prog [options] POSITIONALS` (the flags are listed below it, by section)."""

    def error(self, message: str) -> typing.NoReturn:
        sys.stderr.write(f"embedfleet: {message}; see `{self.prog} --help`\n")
        sys.exit(2)

    def format_help(self) -> str:
        if self.usage is None:
            positionals = [action.metavar or action.dest for action in self._actions if not action.option_strings]
            self.usage = " ".join(["%(prog)s", "[options]", *positionals])
        return super().format_help()


class _Formatter(argparse.HelpFormatter):
    """Flags and their help side by side, within 110 columns."""

    def __init__(self, prog: str):
        super().__init__(prog, max_help_position=34, width=min(shutil.get_terminal_size().columns, 110))


def _add_flag(parser, name: str, field, hidden: bool = False) -> None:
    flag = "--" + name.replace("_", "-")
    help_text = argparse.SUPPRESS if hidden else _help(field)
    kind = _base_type(field.annotation)
    if kind is bool:
        parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS,
                            help=help_text)
    elif typing.get_origin(kind) is list:
        item = typing.get_args(kind)[0]
        parser.add_argument(flag, type=lambda s, item=item: [item(x) for x in s.split(",") if x],
                            default=argparse.SUPPRESS, metavar="A,B,...", help=help_text)
    elif typing.get_origin(kind) is typing.Literal:
        parser.add_argument(flag, choices=typing.get_args(kind), default=argparse.SUPPRESS, help=help_text)
    else:
        parser.add_argument(flag, type=kind, default=argparse.SUPPRESS, help=help_text, metavar=_metavar(name, kind))


def _help(field) -> str:
    """The field's description and its default, where it has one worth saying (not None, not off) and the
    description does not say it already."""
    default = field.default
    if field.is_required():
        said = "required"
    elif default is None or default is False or "default" in (field.description or ""):
        said = ""
    else:
        said = "default: on" if default is True else f"default: {default}"
    return f"{field.description or ''}{f' [{said}]' if said else ''}".strip().replace("%", "%%")


def _metavar(name: str, kind) -> str:
    """SECONDS for a duration, N for a count, else the name's last word: --redis-url URL, --model MODEL."""
    if name.endswith(("seconds", "timeout", "_ttl")):
        return "SECONDS"
    if kind in (int, float):
        return "N" if kind is int else "X"
    return name.rsplit("_", 1)[-1].upper()


def _base_type(annotation):
    """`int | None` -> int; everything else as is."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return args[0]
    return annotation
