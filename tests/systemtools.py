"""The programs some tests run besides Python: docker-compose (docker-compose.yml), openssl (the TLS tests' CA),
chromium + chromedriver (the /dashboard test). `make tools` installs them (apt, as root); `make test` does not.

Where one is missing, its tests skip with a reason that starts with MISSING_TOOL, and the end of the run
repeats them in one summary line (tests/conftest.py) with the command that installs them. With
REQUIRE_TOOLS=1 (CI: `.ci/run`) a missing tool fails its tests instead: CI runs the suite with no skips.
"""

from __future__ import annotations

import os
import re
import shutil

import pytest

MISSING_TOOL = "MISSING TOOL"
INSTALL = "sudo make tools"  # the Makefile's target: apt-get install of the Debian packages
_REASON = re.compile(rf"{MISSING_TOOL} (.+?): (.+?) NOT tested")


def required() -> bool:
    return os.environ.get("REQUIRE_TOOLS", "").lower() not in ("", "0", "false", "no")


def need(command: str, *alternatives: str, untested: str) -> str:
    """The path of `command` (or of the first alternative on PATH); else the test skips (fails under
    REQUIRE_TOOLS) saying what goes `untested`."""
    for name in (command, *alternatives):
        path = shutil.which(name)
        if path:
            return path
    missing(command, untested)
    raise AssertionError("unreachable")  # missing() always raises


def missing(what: str, untested: str) -> None:
    """Skip (fail under REQUIRE_TOOLS): `what` is not here, so `untested` is not tested."""
    reason = f"{MISSING_TOOL} {what}: {untested} NOT tested (`{INSTALL}` installs it)"
    if required():
        pytest.fail(f"{reason}; REQUIRE_TOOLS is set, so this is a failure", pytrace=False)
    pytest.skip(reason)


def untested(report) -> str | None:
    """`tool (what)` for a test report skipped by missing(), else None."""
    found = _REASON.search(str(getattr(report, "longrepr", "")))
    return f"{found.group(1)} ({found.group(2)})" if found else None
