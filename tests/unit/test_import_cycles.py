"""worker/engine's modules form no import loop: neither through module-level imports nor through the imports
inside functions (a loop dodged by importing late is still a loop), and each module imports on its own, first,
in a fresh interpreter state (a loop that only works in one import order fails here)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "worker" / "engine"


def _module_name(path: Path) -> str:
    parts = ("embedfleet", *path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _type_checking_lines(tree: ast.AST) -> set[int]:
    """Line numbers inside `if TYPE_CHECKING:` blocks (imports for annotations only: never run)."""
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The worker.engine modules `name` imports anywhere in its file, functions included."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skipped = _type_checking_lines(tree)
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in skipped:
            continue
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


def test_worker_engine_has_no_import_cycle():
    graph = _graph()
    def siblings(module: str) -> set[str]:
        return {m for m in graph[module] if m.startswith("embedfleet.worker.engine.models")}

    # the shared pieces: a leaf but for the folder checks, themselves a leaf (base.py's docstring)
    assert "embedfleet.worker.engine.models.loader" in graph
    assert siblings("embedfleet.worker.engine.models.base") <= {"embedfleet.worker.engine.models.folderchecks"}
    assert not siblings("embedfleet.worker.engine.models.folderchecks")
    assert _cycle(graph) is None, " -> ".join(_cycle(graph))


def test_the_cycle_check_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_every_module_imports_first_and_alone():
    """Each module imported first in a state with no worker/common module loaded (torch stays loaded: the check
    is about our modules' order, and reloading torch per module would cost minutes)."""
    names = sorted(_modules())
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
