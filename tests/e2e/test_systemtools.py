"""`make test` without the system tools (docker-compose, openssl, chromium): their tests skip, and the run ends
with one line that names what was not tested and `sudo make tools`; under REQUIRE_TOOLS=1 (CI) they fail."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.commands import ROOT

COMPOSE_TEST = "tests/e2e/test_deploy.py::test_compose_refuses_to_run_redis_without_a_password"


def pytest_run(tmp_path, **env: str) -> subprocess.CompletedProcess:
    """That compose test in a pytest of its own whose PATH holds nothing (so no docker-compose)."""
    base = {k: v for k, v in os.environ.items() if k != "REQUIRE_TOOLS"}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", COMPOSE_TEST],
                          cwd=ROOT, env={**base, "PATH": str(tmp_path), **env}, capture_output=True, text=True,
                          timeout=240)


def test_a_missing_tool_skips_its_tests_loudly(tmp_path):
    done = pytest_run(tmp_path)
    assert done.returncode == 0, done.stdout[-3000:]
    lines = done.stdout.strip().splitlines()
    assert "1 skipped" in lines[-1], lines[-3:]
    summary = lines[-2]
    assert summary.startswith("SKIPPED 1 tests for want of system tools; NOT tested here: docker-compose ("), summary
    assert "`sudo make tools` installs them" in summary, summary


def test_under_require_tools_a_missing_tool_fails(tmp_path):
    done = pytest_run(tmp_path, REQUIRE_TOOLS="1")
    assert done.returncode == 1, done.stdout[-3000:]
    assert "1 failed" in done.stdout and "REQUIRE_TOOLS is set, so this is a failure" in done.stdout
