"""The README as a stranger runs it: a fleet started as `make up` starts it (`embedfleet up`, here on free ports), then
every ```python and ```sh block of README.md, top to bottom, as written: the Python blocks in one interpreter (a
later block uses what an earlier one made, as in a notebook), the shell blocks with bash, in a folder that holds the
checkout's `.venv` as a fresh clone does. The one change: the gateway's port for 8000. A block after a
`<!-- not run by tests/e2e/test_readme.py: why -->` line is left out (the commands that start this fleet, the
installs .ci/client-wheel runs, a bge-m3 model's)."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from embedfleet.common.redisserver import free_port
from tests.commands import ROOT, clean_env, wait_for

NOT_RUN = "<!-- not run by tests/e2e/test_readme.py"
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.S | re.M)


def readme_blocks(text: str) -> list[tuple[str, str]]:
    """(language, code) of each ```python / ```sh block of `text` in order, but those marked as not run."""
    found = []
    for match in FENCE.finditer(text):
        before = text[:match.start()].rstrip().rsplit("\n", 1)[-1]
        if match.group(1) in ("python", "sh") and not before.startswith(NOT_RUN):
            found.append((match.group(1), match.group(2)))
    return found


def test_the_block_reader_takes_marked_blocks_out():
    text = f"a\n```python\nx = 1\n```\n{NOT_RUN}: why -->\n```sh\nmake up\n```\n```sh\necho b\n```\n```text\nc\n```\n"
    assert readme_blocks(text) == [("python", "x = 1\n"), ("sh", "echo b\n")]


@pytest.mark.timeout(900)
def test_every_block_of_the_readme_runs_as_written(tmp_path):
    blocks = readme_blocks((ROOT / "README.md").read_text())
    assert {language for language, _ in blocks} == {"python", "sh"} and len(blocks) >= 8
    port = free_port()
    clone = tmp_path / "clone"
    clone.mkdir()
    (clone / ".venv").symlink_to(ROOT / ".venv")
    env = clean_env(tmp_path / "xdg", HF_HUB_DISABLE_TELEMETRY="1")  # Producer() finds `up` by its state file
    log = tmp_path / "up.log"
    with log.open("w") as out:
        up = subprocess.Popen([sys.executable, "-m", "embedfleet.producer.cli", "up", "--port", str(port),
                               "--redis-port", "0", "--data-dir", str(tmp_path / "data")],
                              cwd=clone, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: "Ctrl-C stops everything" in log.read_text() or up.poll() is not None, 300, "the fleet")
        assert up.poll() is None, log.read_text()[-3000:]
        here = {language: [code.replace("127.0.0.1:8000", f"127.0.0.1:{port}") for lang, code in blocks
                           if lang == language] for language in ("python", "sh")}
        script = "\n".join(f"print('--- block {i}', flush=True)\nexec(compile({code!r}, 'README block {i}', 'exec'))"
                           for i, code in enumerate(here["python"]))
        python = subprocess.run([str(clone / ".venv" / "bin" / "python"), "-c", script], cwd=clone, env=env,
                                capture_output=True, text=True, timeout=600)
        assert python.returncode == 0, python.stdout[-2000:] + python.stderr[-4000:]
        answers = [json.loads(line) for line in python.stdout.splitlines() if line.startswith("{")]
        assert [a["custom_id"] for a in sorted(answers, key=lambda a: a["custom_id"])] == ["doc-0", "doc-1"]
        assert all(len(a["response"]["body"]["data"][0]["embedding"]) == 384 for a in answers), answers
        for code in here["sh"]:
            shell = subprocess.run(["bash", "-euo", "pipefail", "-c", code], cwd=clone, env=env,
                                   capture_output=True, text=True, timeout=300)
            assert shell.returncode == 0, (code, shell.stdout[-2000:], shell.stderr[-2000:])
        assert np.load(clone / "out.npy").shape == (2, 384)
    finally:
        up.send_signal(signal.SIGINT)
        began = time.monotonic()
        code = up.wait(120)
    assert code == 130 and time.monotonic() - began < 120, log.read_text()[-2000:]
    assert "embedfleet: stopped" in log.read_text()


def test_the_readme_says_how_many_tests_there_are():
    """The README's counts of the suite and of `make test-fast` (the modules not marked slow) within 15% of what
    pytest collects."""
    text = (ROOT / "README.md").read_text()
    for line, marks in ((r"the suite: ~([\d,]+) tests, about (\d+) min", []),
                        (r"the edit-test loop: ~([\d,]+) tests without the slow modules, about (\d+) min",
                         ["-m", "not slow"])):
        said = re.search(line, text)
        assert said, f"the README's line {line!r}"
        collected = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                                    *marks], cwd=ROOT, capture_output=True, text=True, timeout=600)
        count = int(re.search(r"(\d+)(?:/\d+)? tests? collected", collected.stdout).group(1))
        assert abs(int(said.group(1).replace(",", "")) - count) <= 0.15 * count, (said.group(0), count)
