"""Settings built once at an entry point: every field is a command-line flag and an EMBEDFLEET_ env var."""

from __future__ import annotations

import argparse
import types
import typing

from pydantic_settings import BaseSettings, SettingsConfigDict

ENV_PREFIX = "EMBEDFLEET_"


class Settings(BaseSettings):
    """Base for each entry point's settings; flags override env vars, env vars override defaults."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid")

    redis_url: str = "redis://127.0.0.1:6379/0"

    @classmethod
    def from_args(cls, argv: list[str] | None, prog: str, description: str):
        parser = argparse.ArgumentParser(prog=prog, description=description)
        for name, field in cls.model_fields.items():
            _add_flag(parser, name, field)
        return cls(**vars(parser.parse_args(argv)))


def _add_flag(parser: argparse.ArgumentParser, name: str, field) -> None:
    flag = "--" + name.replace("_", "-")
    env = ENV_PREFIX + name.upper()
    default = "required" if field.is_required() else f"default {field.default!r}"
    help_text = f"{field.description or ''} [env {env}; {default}]".strip()
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
        parser.add_argument(flag, type=kind, default=argparse.SUPPRESS, help=help_text)


def _base_type(annotation):
    """`int | None` -> int; everything else as is."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return args[0]
    return annotation
