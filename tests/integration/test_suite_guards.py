"""The suite's own guards, run on a small project that uses this suite's conftest.py in a nested pytest:
a module skipped at collection fails a CI run like a skipped test does; every process a test starts is
ended when the test ends, even one that left its session; the cores lock is waited for outside a test's
timeout and within a limit of its own."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from conftest import ROOT, wait_until

CONFTEST = ROOT / "tests" / "conftest.py"


def project(tmp_path: Path, tests: dict[str, str], conftest: str | None = None) -> Path:
    """A project whose tests/ holds this suite's conftest.py (or `conftest`) and `tests` (file name -> source)."""
    root = tmp_path / "project"
    (root / "tests").mkdir(parents=True)
    (root / "tests" / "conftest.py").write_text(conftest if conftest is not None else CONFTEST.read_text())
    for name, source in tests.items():
        (root / "tests" / name).write_text(source)
    return root


def pytest_command(root: Path) -> list[str]:
    return [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", "-p", "no:randomly",
            "--basetemp", str(root / "tmp" / "base"), "tests"]


def pytest_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "CI", "PYTEST_XDIST_WORKER")}
    env["PYTHONPATH"] = str(ROOT)
    env.update(extra)
    return env


def run_pytest(root: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(pytest_command(root), cwd=root, env=pytest_env(**env), capture_output=True, text=True,
                          timeout=90)


SKIPPED_MODULE = '''
import pytest

pytest.importorskip("a_module_nobody_installed")


def test_never_collected():
    assert False
'''

PASSING = '''
def test_passes():
    assert 1 + 1 == 2
'''


@pytest.mark.timeout(120)
def test_a_module_skipped_at_collection_fails_a_ci_run_and_is_named(tmp_path):
    root = project(tmp_path, {"test_optional.py": SKIPPED_MODULE, "test_plain.py": PASSING})
    outside_ci = run_pytest(root)
    assert outside_ci.returncode == 0, outside_ci.stdout + outside_ci.stderr
    in_ci = run_pytest(root, CI="true")
    assert in_ci.returncode == 1, in_ci.stdout + in_ci.stderr
    assert "skips not allowed in CI" in in_ci.stdout
    named = [line for line in in_ci.stdout.splitlines() if line.startswith("tests/test_optional.py: ")]
    assert len(named) == 1 and "could not import 'a_module_nobody_installed'" in named[0], in_ci.stdout


LEAVES_A_PROCESS = '''
import subprocess
from pathlib import Path


def start_escaping(name):
    """A process in a session of its own (out of reach of any process group), its pid written to `name`."""
    proc = subprocess.Popen(["setsid", "sleep", "300"])
    Path(__file__).with_name(name).write_text(str(proc.pid))


def test_passes_and_leaves_a_process_behind():
    start_escaping("passed.pid")


def test_fails_and_leaves_a_process_behind():
    start_escaping("failed.pid")
    assert False, "failing on purpose"
'''


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.timeout(120)
def test_a_process_that_left_its_session_is_ended_when_its_test_ends_passed_or_failed(tmp_path):
    root = project(tmp_path, {"test_leaves.py": LEAVES_A_PROCESS})
    done = run_pytest(root)
    assert done.returncode == 1 and "1 failed, 1 passed" in done.stdout, done.stdout + done.stderr
    for name in ("passed.pid", "failed.pid"):
        pid = int((root / "tests" / name).read_text())
        assert gone(pid), f"the process the test left ({name}) still runs"


TIGHT_TIMEOUT = '''
import pytest


@pytest.mark.timeout(1)
def test_with_a_one_second_timeout():
    assert sum([1, 2]) == 3
'''


def hold_cores_lock(shared: Path):
    """Hold the cores lock exclusively, as an `exclusive` test of another worker would."""
    shared.mkdir(parents=True, exist_ok=True)
    fd = os.open(shared / "cores.lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def turnstile_taken(shared: Path) -> bool:
    fd = os.open(shared / "turnstile.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


@pytest.mark.timeout(120)
def test_waiting_for_the_cores_does_not_use_up_the_tests_timeout(tmp_path):
    """The nested run acts as an xdist worker (PYTEST_XDIST_WORKER) whose shared directory is its basetemp's
    parent; this test holds the cores lock there for twice the nested test's 1 s timeout."""
    root = project(tmp_path, {"test_tight.py": TIGHT_TIMEOUT})
    shared = root / "tmp"
    fd = hold_cores_lock(shared)
    try:
        proc = subprocess.Popen(pytest_command(root), cwd=root, env=pytest_env(PYTEST_XDIST_WORKER="gw0"),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        wait_until(lambda: turnstile_taken(shared), timeout=30, what="the nested test to wait for the cores")
        held_since = time.monotonic()
        wait_until(lambda: time.monotonic() - held_since > 2.0, timeout=5, what="twice the nested test's timeout")
    finally:
        os.close(fd)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0 and "1 passed" in out, out


@pytest.mark.timeout(120)
def test_a_test_that_never_gets_the_cores_fails_saying_so(tmp_path):
    conftest = CONFTEST.read_text().replace("CORES_WAIT_SECS = 900.0", "CORES_WAIT_SECS = 1.0")
    assert "CORES_WAIT_SECS = 1.0" in conftest
    root = project(tmp_path, {"test_tight.py": TIGHT_TIMEOUT}, conftest=conftest)
    fd = hold_cores_lock(root / "tmp")
    try:
        done = run_pytest(root, PYTEST_XDIST_WORKER="gw0")
    finally:
        os.close(fd)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "waited 1s for the cores lock (cores.lock)" in done.stdout
