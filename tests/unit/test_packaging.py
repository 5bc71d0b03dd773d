"""The distribution installs one import package, `embedfleet`: pyproject.toml lists every package of the tree under
it (a package left out would be missing from the wheel, and only a user would notice), and no module of the
project imports the parts by their folder names (`common`, `producer`, `worker`), which a wheel does not install
(.ci/client-wheel installs the wheel alone and embeds with it)."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PARTS = ("common", "producer", "worker")


def test_pyproject_lists_every_package_of_the_tree_under_embedfleet():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert config["package-dir"] == {"embedfleet": "embedfleet", **{f"embedfleet.{p}": p for p in PARTS}}
    found = {"embedfleet"} | {"embedfleet." + ".".join(init.parent.relative_to(ROOT).parts)
                              for part in PARTS for init in (ROOT / part).rglob("__init__.py")}
    # A folder of data (the Lua scripts, the dashboard) is listed as a package too, with its files in package-data.
    data = config["package-data"]
    for package, patterns in data.items():
        folder = ROOT / package.split(".")[1] / Path(*package.split(".")[2:])
        assert all(any(folder.glob(pattern)) for pattern in patterns), (package, patterns)
    assert set(config["packages"]) == found | set(data)
    assert config["packages"] == sorted(config["packages"])


def test_no_module_imports_a_part_by_its_folder_name():
    wrong = []
    for folder in (*PARTS, "embedfleet", "tests", "bench", "examples"):
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                         else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
                wrong += [f"{path.relative_to(ROOT)}:{node.lineno} {name}" for name in names
                          if name.split(".")[0] in PARTS]
    assert not wrong, wrong


def test_the_package_is_the_checkouts_parts():
    import embedfleet
    import embedfleet.common.errors

    assert Path(embedfleet.common.errors.__file__).resolve() == ROOT / "common" / "errors.py"
    assert sorted(embedfleet.__all__) == ["AsyncProducer", "Producer"]
    from embedfleet import AsyncProducer, Producer
    from embedfleet.producer.client.aio import AsyncProducer as Async
    from embedfleet.producer.client.blocking import Producer as Sync

    assert (Producer, AsyncProducer) == (Sync, Async)
