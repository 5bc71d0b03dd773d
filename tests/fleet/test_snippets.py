"""Snippets a new user copies run as printed: docs/python.md's AsyncProducer block against a real worker on the
bundled MiniLM (the README's blocks: tests/e2e/test_readme.py)."""

from __future__ import annotations

import re

import pytest

from tests.commands import ROOT
from embedfleet.worker.engine.engine import Engine
from embedfleet.worker.engine.models.loader import load_model

MODEL = "all-MiniLM-L6-v2"  # the name `make up` serves it under, which the snippets use


def python_block(path: str, holding: str) -> str:
    """The one ```python block of `path` that holds `holding`."""
    [block] = [b for b in re.findall(r"```python\n(.*?)```", (ROOT / path).read_text(), re.S) if holding in b]
    return block


@pytest.fixture
def made_up(fleet, minilm_path, monkeypatch):
    """A MiniLM worker served as `make up` serves it, found as after `make up` (here through the variable)."""
    fleet.serve(Engine(load_model(minilm_path, served_name=MODEL)))
    monkeypatch.setenv("EMBEDFLEET_REDIS_URL", fleet.url)
    return fleet.url


def test_the_async_producer_block_of_python_md_runs_as_printed(made_up, capsys):
    exec(python_block("docs/python.md", "AsyncProducer"), {"__name__": "snippet"})  # our own doc, as printed
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == 4 and all(line.endswith(" True (1, 384)") for line in printed[:3]), printed
    assert printed[3] == "(3, 384)"
