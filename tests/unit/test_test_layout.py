"""The layout of tests/ itself: test modules live in unit/ or integration/, and none imports another. What
two test modules share is a helper in support/, so running, moving or renaming one test module never changes
another's collection."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(60)

TESTS = Path(__file__).resolve().parents[1]


def module_files() -> list[Path]:
    return sorted(p for p in TESTS.rglob("test_*.py") if "schemas" not in p.relative_to(TESTS).parts)


def imported_names(source: str) -> list[str]:
    """Every dotted name an `import` or `from ... import` brings in, wherever it stands (`from a import b` gives
    both a and a.b; a relative import keeps its leading dots)."""
    names = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = "." * node.level + (node.module or "")
            names.append(base)
            names += [f"{base}.{alias.name}" if node.module else base + alias.name for alias in node.names]
    return names


def imports_of_test_modules(source: str, stems: set[str]) -> list[str]:
    """The test modules of `stems` that `source` imports, by any path."""
    return sorted({part for name in imported_names(source) for part in name.lstrip(".").split(".") if part in stems})


def test_every_test_module_is_in_unit_or_integration():
    modules = module_files()
    assert len(modules) > 50
    misplaced = [str(p.relative_to(TESTS)) for p in modules if p.parent.name not in ("unit", "integration")
                 or p.parent.parent != TESTS]
    assert misplaced == []


def test_no_test_module_or_helper_imports_a_test_module():
    stems = {p.stem for p in module_files()}
    offenders = {}
    for path in sorted(TESTS.rglob("*.py")):
        found = imports_of_test_modules(path.read_text(), stems)
        if found:
            offenders[str(path.relative_to(TESTS))] = found
    assert offenders == {}, "move what they share into tests/support/"


def test_the_check_catches_each_way_of_importing_a_test_module():
    stems = {"test_arbiter", "test_loophttp"}
    for source in ("from test_arbiter import Rig", "import test_loophttp", "from unit.test_arbiter import T0",
                   "from tests.integration import test_loophttp", "from . import test_arbiter",
                   "from .test_arbiter import Rig", "def f():\n    import test_arbiter as a\n"):
        assert imports_of_test_modules(source, stems), source
    for source in ("from support.arbiter_rig import Rig", "from conftest import Daemon",
                   "from supervisor import testing", "import pytest"):
        assert imports_of_test_modules(source, stems) == [], source
