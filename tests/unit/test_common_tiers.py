"""common/ in tiers: the plain value modules (requests, results, scheduling, ...) stand below the Redis protocol
(common/protocol/), never on it, and the names and policy numbers both share are leaves of the stdlib alone
(common/names.py, common/policy.py). Imports are read with ast: functions and TYPE_CHECKING blocks included."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
COMMON = ROOT / "common"
PROTOCOL = "embedfleet.common.protocol"
LEAVES = ("names.py", "policy.py")
# common/ modules outside common/protocol/ that may import the protocol, each with why:
INTENDED = {
    # its startup access check probes the protocol's own keys (a result key, the models set, a queue), so that an
    # ACL that refuses them fails at start rather than on the first request
    "redisclient.py": "access check on the protocol's keys",
}


def _imported(path: Path) -> set[str]:
    """Every module `path` names in an import (`from a import b` names a and a.b), absolute or relative."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the file's own package in embedfleet.common
                package = ["embedfleet", *path.parent.relative_to(ROOT).parts]
                base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def _on_protocol(path: Path) -> bool:
    return any(name == PROTOCOL or name.startswith(PROTOCOL + ".") for name in _imported(path))


def _plain_modules() -> list[Path]:
    return [path for path in sorted(COMMON.rglob("*.py")) if "protocol" not in path.relative_to(COMMON).parts]


def test_no_plain_module_of_common_imports_the_protocol():
    modules = _plain_modules()
    assert len(modules) > 20 and {"request.py", "result.py", "scheduling.py"} <= {p.name for p in modules}
    on_protocol = {str(path.relative_to(COMMON)) for path in modules if _on_protocol(path)}
    assert on_protocol == set(INTENDED), f"common/ modules on the protocol beyond the listed ones: {on_protocol}"


def test_the_leaves_import_the_stdlib_alone():
    for name in LEAVES:
        imported = {module.split(".")[0] for module in _imported(COMMON / name)}
        assert imported and imported <= set(sys.stdlib_module_names) | {"__future__"}, (name, imported)


def test_the_reader_finds_protocol_imports_of_every_form(tmp_path):
    source = tmp_path / "mod.py"
    for line in ("from embedfleet.common.protocol import keys",
                 "from embedfleet.common.protocol.keys import PREFIX",
                 "import embedfleet.common.protocol.rqkeys", "from embedfleet.common import protocol",
                 "def f():\n    from embedfleet.common.protocol import claims",
                 "if TYPE_CHECKING:\n    from embedfleet.common.protocol import keys"):
        source.write_text(line + "\n", encoding="utf-8")
        assert _on_protocol(source), line
    source.write_text("from embedfleet.common.names import slot_tag\nimport embedfleet.common.policy\n",
                      encoding="utf-8")
    assert not _on_protocol(source)
