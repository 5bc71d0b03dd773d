"""The tests' own layout: no test module imports another (shared helpers live in modules of tests/ named for what they
hold, shared fixtures in tests/conftest.py or the plugins it lists), and workers are built through the harness
(tests/harness.py: as `embedfleet worker` builds them), not by calling BatchWorker in test after test."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
MAX_BATCHWORKER_FILES = 10  # the builder's and the pipeline's own tests may call BatchWorker; the rest use the harness


def _is_test_module(dotted: str) -> bool:
    return any(part.startswith("test_") for part in dotted.split("."))


def imported_test_modules(tree: ast.AST) -> list[str]:
    """The test_* modules a module's code imports, anywhere in it (functions included, relative imports too)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names if _is_test_module(alias.name)]
        elif isinstance(node, ast.ImportFrom):
            base = "." * node.level + (node.module or "")
            if _is_test_module(base):
                found.append(base)
            else:  # `from tests.fleet import test_queue` imports the module itself
                found += [f"{base}.{alias.name}" for alias in node.names if alias.name.startswith("test_")]
        elif isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "pytest_plugins" for t in node.targets):
            found += [value.value for value in ast.walk(node.value)
                      if isinstance(value, ast.Constant) and isinstance(value.value, str) and _is_test_module(
                          value.value)]
    return found


def test_no_test_module_imports_another():
    offenders = {}
    for path in sorted(TESTS.rglob("*.py")):
        imported = imported_test_modules(ast.parse(path.read_text(encoding="utf-8")))
        if imported:
            offenders[str(path.relative_to(TESTS.parent))] = imported
    assert offenders == {}, ("move what these share into a helper module of tests/ (not test_*) or a fixture of "
                             f"tests/conftest.py or its plugins: {offenders}")


def test_the_import_scan_finds_each_form():
    sources = {"from tests.fleet.test_queue import enqueue": ["tests.fleet.test_queue"],
               "import tests.fleet.test_queue": ["tests.fleet.test_queue"],
               "from tests.fleet import test_queue": ["tests.fleet.test_queue"],
               "from .test_queue import enqueue": [".test_queue"],
               "def f():\n    from tests.parity.test_tasks import engine": ["tests.parity.test_tasks"],
               "pytest_plugins = ['tests.tinymodels', 'tests.fleet.test_queue']": ["tests.fleet.test_queue"],
               "from tests.rqjobs import enqueue\nfrom tests import harness": []}
    for source, expected in sources.items():
        assert imported_test_modules(ast.parse(source)) == expected, source


def test_few_test_files_call_batchworker():
    """A test's worker comes from the harness (`harness.worker`, `idle_worker`, `serve`, `burst`, `Fleet.serve`),
    with production's defaults and the test's explicit overrides."""
    calling = sorted(str(path.relative_to(TESTS.parent)) for path in TESTS.rglob("*.py")
                     if path != Path(__file__).resolve() and "BatchWorker(" in path.read_text(encoding="utf-8"))
    assert len(calling) <= MAX_BATCHWORKER_FILES, calling
