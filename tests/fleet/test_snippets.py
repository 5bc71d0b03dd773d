"""Snippets a new user copies run as printed: docs/python.md's AsyncProducer block, and the README's Batch API
block with the requests.jsonl line it shows, against a real worker (and gateway) on the bundled MiniLM."""

from __future__ import annotations

import json
import re
import time

import openai
import pytest

from tests import gatewayserver
from tests.commands import ROOT
from worker.engine.engine import Engine
from worker.engine.models.loader import load_model

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


def test_the_batch_api_block_of_the_readme_runs_on_the_requests_line_it_shows(made_up, tmp_path, monkeypatch):
    block = python_block("README.md", "client.batches.create")
    comment = " ".join(line.lstrip("# ") for line in block.splitlines() if line.startswith("#"))
    line = json.loads(comment.split(":", 1)[1])  # "requests.jsonl, a line per request: {...}"
    second = {**line, "custom_id": "doc-2", "body": {**line["body"], "input": "second text"}}
    monkeypatch.chdir(tmp_path)
    (tmp_path / "requests.jsonl").write_text(json.dumps(line) + "\n" + json.dumps(second) + "\n")
    server = gatewayserver.Server(gatewayserver.settings(made_up, batch_poll_seconds=0.2))
    try:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused")
        *steps, last = [line for line in block.splitlines() if line and not line.startswith("#")]
        scope = {"client": client}
        exec("\n".join(steps), scope)  # upload, create, retrieve, as printed
        deadline = time.monotonic() + 120
        while scope["batch"].status != "completed":  # "when completed:"
            assert scope["batch"].status in ("validating", "in_progress", "finalizing"), scope["batch"]
            assert time.monotonic() < deadline, scope["batch"]
            time.sleep(0.2)
            scope["batch"] = client.batches.retrieve(scope["batch"].id)
        answers = [json.loads(row) for row in eval(last.split("#")[0], scope).splitlines()]
    finally:
        server.stop()
    assert [a["custom_id"] for a in sorted(answers, key=lambda a: a["custom_id"])] == ["doc-1", "doc-2"]
    for answer in answers:
        assert answer["response"]["status_code"] == 200, answer
        assert len(answer["response"]["body"]["data"][0]["embedding"]) == 384
