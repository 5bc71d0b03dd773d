"""The project's modules (common/, producer/, worker/ and embedfleet/, as `embedfleet.` + the path) form no import
loop: neither through module-level imports nor through the imports inside functions or `if TYPE_CHECKING:` blocks
(a loop dodged by importing late, or for annotations only, is still a loop: the two modules cannot be read, moved or
tested apart); and each worker/engine module imports on its own, first, in a fresh interpreter state (a loop that
only works in one import order fails here)."""

from __future__ import annotations

import ast
import functools
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PARTS = ("common", "producer", "worker", "embedfleet")  # the folders of the one import package
ENGINE = ROOT / "worker" / "engine"


def _module_name(path: Path) -> str:
    """`embedfleet.` + the path (embedfleet/ itself is the package's own folder)."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    parts = parts if parts[0] == "embedfleet" else ("embedfleet", *parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules(*folders: Path) -> dict[str, Path]:
    folders = folders or tuple(ROOT / part for part in PARTS)
    return {_module_name(path): path for folder in folders for path in sorted(folder.rglob("*.py"))}


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The project's modules `name` imports anywhere in its file: functions and TYPE_CHECKING blocks included."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
            # `from pkg import mod` imports mod (pkg runs first as every submodule's parent does, which is not
            # an edge); `from mod import name` imports mod
            submodules = {f"{base}.{alias.name}" for alias in node.names} & known
            found.update(submodules)
            if len(submodules) < len(node.names):
                found.add(base)
    return {module for module in found if module in known and module != name}


@functools.cache
def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, set(modules)) for name, path in modules.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                return stack[stack.index(target):] + [target]
            if target not in state and (found := visit(target)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_project_has_no_import_cycle():
    graph = _graph()
    def siblings(module: str) -> set[str]:
        return {m for m in graph[module] if m.startswith("embedfleet.worker.engine.models")}

    # every part is in the graph
    assert {"embedfleet", "embedfleet.common.request", "embedfleet.producer.client.blocking",
            "embedfleet.worker.engine.models.loader", "embedfleet.worker.serving.pipeline"} <= graph.keys()
    # the shared pieces: a leaf but for the folder checks (base.py's docstring) and two modules its annotations name,
    # each a leaf itself
    shared = {f"embedfleet.worker.engine.models.{name}" for name in ("folderchecks", "plaintext", "stconfig")}
    assert siblings("embedfleet.worker.engine.models.base") <= shared and not set().union(*map(siblings, shared))
    cycle = _cycle(graph)
    assert cycle is None, "an import loop: " + " -> ".join(cycle)


def test_the_serving_side_reaches_the_engine_through_its_seam():
    """worker/serving takes Work, Prepared and ServingEngine from worker/engine/seam.py: neither Engine's module nor
    its steps (which load the model side's code) anywhere in its files."""
    graph = _graph()
    engine = {name for name in graph if name == "embedfleet.worker.engine.engine"
              or name.startswith("embedfleet.worker.engine.steps")}
    serving = {name: imported for name, imported in graph.items() if name.startswith("embedfleet.worker.serving")}
    assert len(engine) == 5 and len(serving) > 20
    assert not {name: imported & engine for name, imported in serving.items() if imported & engine}


def test_the_cycle_check_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_imports_count_inside_functions_and_type_checking_blocks(tmp_path):
    source = tmp_path / "mod.py"
    source.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from embedfleet.x import y\n"
                      "def f():\n    import embedfleet.z\n    from embedfleet import w\n", encoding="utf-8")
    known = {"embedfleet.x", "embedfleet.x.y", "embedfleet.z", "embedfleet.w", "embedfleet"}
    # `from embedfleet.x import y`, y a submodule: the edge is to y; `from embedfleet import w`: to w
    assert _imports("embedfleet.mod", source, known) == {"embedfleet.x.y", "embedfleet.z", "embedfleet.w"}


def test_every_module_imports_first_and_alone():
    """Each module imported first in a state with no worker/common module loaded (torch stays loaded: the check
    is about our modules' order, and reloading torch per module would cost minutes)."""
    names = sorted(_modules(ENGINE))
    assert {"embedfleet.worker.engine.seam", "embedfleet.worker.engine.steps.forward"} <= set(names)
    script = (
        "import importlib, sys, torch, transformers\n"
        f"for name in {names!r}:\n"
        "    for loaded in [m for m in sys.modules if m.startswith(('embedfleet.worker', 'embedfleet.common'))]:\n"
        "        del sys.modules[loaded]\n"
        "    importlib.import_module(name)\n"
        "print('ok')\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0 and done.stdout.startswith("ok"), done.stderr[-3000:]
