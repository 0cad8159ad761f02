"""--preload with real processes: the handler's module is imported once, in the forkserver, and children
share its pages; an import error still exits 3; a reload imports changed code through a new forkserver."""

from __future__ import annotations

import signal

import psutil
import pytest
from conftest import wait_for_status, wait_until
from support.intake_helpers import status as status_of

from supervisor import exitcodes

MODEL_MB = 96
MiB = 2**20


def forkservers(daemon) -> list[int]:
    """Pids of the daemon's forkserver processes (its direct children running multiprocessing's forkserver)."""
    out = []
    for proc in psutil.Process(daemon.proc.pid).children():
        try:
            if "forkserver" in " ".join(proc.cmdline()):
                out.append(proc.pid)
        except psutil.Error:
            pass
    return out


@pytest.mark.timeout(90)
def test_preloaded_children_share_the_model_and_run_jobs(dev_server, daemon_factory, tmp_path):
    imports = tmp_path / "imports"
    d = daemon_factory("preload", handler="tests.support.handlers_memory:handle", procs=2, args=["--preload"],
                       env={"MEMORY_MODEL_MB": str(MODEL_MB), "MEMORY_IMPORT_LOG": str(imports)}).wait_ready(60)
    ids = [dev_server.enqueue("preload", {"do": "model"}) for _ in range(6)]
    jobs = wait_for_status(dev_server, ids, timeout=60)
    expected = sum(b"0123456789abcdef"[i % 16] for i in range(0, MODEL_MB * MiB, 4096))
    assert all(j["result"]["model_mb"] == MODEL_MB and j["result"]["sum"] == expected for j in jobs), jobs
    children = d.child_pids()
    assert len(children) == 2
    # Imported once, by the forkserver: not by the parent, not by each child.
    importers = imports.read_text().split()
    assert len(importers) == 1 and int(importers[0]) in forkservers(d) and int(importers[0]) not in children
    for pid in children:
        uss = psutil.Process(pid).memory_full_info().uss
        assert uss < MODEL_MB * MiB * 0.25, f"child {pid} holds {uss // MiB} MiB of its own"
    assert psutil.Process(d.proc.pid).memory_info().rss < MODEL_MB * MiB  # the parent never imports the handler


@pytest.mark.timeout(60)
@pytest.mark.parametrize("handler,env", [
    ("tests.no_such_module:handle", {}),
    ("tests.support.handlers_chaos:handle", {"CHAOS_BOOT_FAIL_FLAG": "__file__"}),  # raises RuntimeError at import
])
def test_an_import_error_under_preload_exits_3(dev_server, daemon_factory, tmp_path, handler, env):
    if env.get("CHAOS_BOOT_FAIL_FLAG") == "__file__":
        flag = tmp_path / "fail"
        flag.write_text("1")
        env = {"CHAOS_BOOT_FAIL_FLAG": str(flag)}
    d = daemon_factory("preload-bad", handler=handler, procs=2, args=["--preload"], env=env)
    assert d.wait(45) == exitcodes.HANDLER_IMPORT
    errors = [r for r in d.records() if str(r.get("msg")).startswith(f"cannot import handler {handler}")]
    assert errors and errors[0]["level"] == "error", d.records()[-5:]


@pytest.mark.timeout(120)
def test_a_reload_under_preload_imports_changed_code_through_a_new_forkserver(dev_server, daemon_factory, tmp_path):
    version = tmp_path / "version"
    version.write_text("one")
    d = daemon_factory("preload-reload", handler="tests.support.handlers_memory:handle", procs=2, args=["--preload"],
                       env={"MEMORY_VERSION_FILE": str(version)}).wait_ready(60)
    first = wait_for_status(dev_server, [dev_server.enqueue("preload-reload", {"do": "version"})], timeout=30)[0]
    assert first["result"]["version"] == "one"
    before = set(d.child_pids())
    [old_server] = forkservers(d)

    version.write_text("two")
    d.signal(signal.SIGHUP)
    wait_until(lambda: not (set(d.child_pids()) & before) and len(d.child_pids()) == 2, timeout=60,
               what="both children replaced")
    jobs = wait_for_status(dev_server, [dev_server.enqueue("preload-reload", {"do": "version"}) for _ in range(4)],
                           timeout=30)
    assert {j["result"]["version"] for j in jobs} == {"two"}
    wait_until(lambda: forkservers(d) and old_server not in forkservers(d) and len(forkservers(d)) == 1,
               timeout=20, what="the old forkserver retired once its children were gone")
    d.signal(signal.SIGTERM)
    assert d.wait(30) == 0


@pytest.mark.timeout(90)
def test_the_loop_keeps_turning_while_the_forkserver_imports_a_slow_model(dev_server, daemon_factory, tmp_path):
    version = tmp_path / "version"
    version.write_text("one")
    d = daemon_factory("preload-slow", handler="tests.support.handlers_memory:handle", procs=1,
                       args=["--preload", "--health-port", "0"],
                       env={"MEMORY_IMPORT_SECS": "5", "MEMORY_VERSION_FILE": str(version)})
    port = d.health_port
    ages = []

    def up():
        try:
            snap = status_of(port)
        except Exception:
            return False
        ages.append(snap["loop_age_secs"])
        return any(c["state"] == "idle" for c in snap["children"])

    wait_until(up, timeout=40, interval=0.2, what="a child, after the 5 s import")
    assert len(ages) > 10 and max(ages) < 3, ages  # /healthz would fail a loop stalled for 10 s
    version.write_text("two")
    d.signal(signal.SIGHUP)  # the new forkserver imports for 5 s too: the old child works on meanwhile
    job = wait_for_status(dev_server, [dev_server.enqueue("preload-slow", {"do": "version"})], timeout=10)[0]
    assert job["result"]["version"] == "one"
    ages.clear()
    wait_until(lambda: up() and wait_for_status(dev_server, [dev_server.enqueue("preload-slow", {"do": "version"})],
                                                timeout=10)[0]["result"]["version"] == "two",
               timeout=40, interval=0.5, what="the reloaded child")
    assert max(ages) < 3, ages


@pytest.mark.timeout(90)
def test_two_reloads_in_a_row_leave_one_forkserver_and_never_stall_the_loop(dev_server, daemon_factory, tmp_path):
    version = tmp_path / "version"
    version.write_text("one")
    d = daemon_factory("preload-twice", handler="tests.support.handlers_memory:handle", procs=1,
                       args=["--preload", "--health-port", "0"],
                       env={"MEMORY_IMPORT_SECS": "3", "MEMORY_VERSION_FILE": str(version)}).wait_ready(60)
    port = d.health_port
    version.write_text("two")
    d.signal(signal.SIGHUP)
    wait_until(lambda: len(forkservers(d)) == 2, timeout=10, what="the first reload's forkserver")
    version.write_text("three")
    d.signal(signal.SIGHUP)  # while the first reload's forkserver is still importing
    ages = []

    def settled():
        ages.append(status_of(port)["loop_age_secs"])
        return len(forkservers(d)) == 1 and d.child_pids() and wait_for_status(
            dev_server, [dev_server.enqueue("preload-twice", {"do": "version"})], timeout=10)[0]["result"]["version"]

    assert wait_until(settled, timeout=60, interval=0.3, what="one forkserver, serving the newest code") == "three"
    assert max(ages) < 3, ages
