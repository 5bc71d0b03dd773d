"""The Redis ACL users docs/security.md documents for producers and workers, read from the page itself."""

from __future__ import annotations

from pathlib import Path

ACL_RECIPE = Path(__file__).resolve().parents[1] / "docs" / "security.md"  # the documented ACL users


def documented_acl(passwords: dict[str, str]) -> list[list[str]]:
    """The ACL SETUSER lines of docs/security.md, as commands, with the passwords filled in."""
    lines = [line for line in ACL_RECIPE.read_text().splitlines() if line.startswith("ACL SETUSER ")]
    assert len(lines) == 2, "the documented ACL recipe has moved: keep this test reading it"
    return [[word.replace("PRODUCER_PASSWORD", passwords["producer"]).replace("WORKER_PASSWORD", passwords["worker"])
             for word in line.split()] for line in lines]
