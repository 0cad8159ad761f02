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


REAL_PROCESSES = {"dev_server", "daemon_factory", "stopped", "servers", "daemons", "spooled_dev_server"}  # fixtures
REAL_NAMES = {"DevServer", "Daemon", "run_jobs"}  # what starts the real dev server or daemon


def real_process_uses(source: str) -> list[str]:
    """The tests of `source` that ask for a real dev server or daemon (a fixture, or the classes and helpers
    that start them)."""
    tree = ast.parse(source)
    found = [f"{node.name}({arg.arg})" for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)
             for arg in node.args.args if arg.arg in REAL_PROCESSES]
    found += sorted({f"{name.rsplit('.', 1)[-1]}" for name in imported_names(source)
                     if name.rsplit(".", 1)[-1] in REAL_NAMES})
    return found


def test_unit_tests_start_no_real_dev_server_or_daemon():
    """unit/ runs in process (seconds for the whole directory); what needs the real processes is in integration/."""
    offenders = {str(p.relative_to(TESTS)): found for p in module_files() if p.parent.name == "unit"
                 if (found := real_process_uses(p.read_text()))}
    assert offenders == {}


def test_the_split_check_catches_a_real_process_in_unit():
    assert real_process_uses("def test_x(dev_server):\n    pass\n") == ["test_x(dev_server)"]
    assert real_process_uses("from supervisor.testing import run_jobs\n") == ["run_jobs"]
    assert real_process_uses("from conftest import DevServer, wait_until\n") == ["DevServer"]
    assert real_process_uses("from conftest import wait_until\ndef test_y(tmp_path):\n    pass\n") == []
