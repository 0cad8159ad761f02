"""What a job starts, however it detached it (`&`, nohup, setsid, a double fork with or without a session
of its own), is counted in its child's memory cap and stopped with the job; what a child's start-up started
lives as long as that child; what the handler's module started at import in the forkserver (--preload) does
not outlive the daemon. Real processes: the handler detaches real ones and the test reads /proc."""

from __future__ import annotations

import os
import signal

import pytest
from conftest import Daemon, wait_for_status, wait_until

HANDLER = "tests.support.handlers_detach:detach"


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


def read_pid(path) -> int:
    return int(wait_until(lambda: path.exists() and path.read_text(), timeout=20, what=f"{path} written"))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["amp", "nohup", "setsid", "double_fork", "double_fork_setsid"])
def test_nothing_a_job_started_outlives_the_job(dev_server, daemon_factory, tmp_path, how):
    d = daemon_factory(f"q-detach-{how}", handler=HANDLER, procs=1, worker_id=f"w-detach-{how}").wait_ready()
    pidfile = tmp_path / "hog.pid"
    job = dev_server.enqueue(d.queue, {"how": how, "mb": 1, "pidfile": str(pidfile)}, max_retries=0)
    done = wait_for_status(dev_server, [job], ("completed", "deadletter"), timeout=30)[0]
    assert done["status"] == "completed", done.get("last_error")
    pid = done["result"]["pid"]
    wait_until(lambda: not alive(pid), timeout=10, what=f"the {how} process of the finished job gone")
    assert d.proc.poll() is None
    # the child lives on and runs the next job
    again = dev_server.enqueue(d.queue, {"how": "amp", "mb": 1, "pidfile": str(tmp_path / "again.pid")})
    assert wait_for_status(dev_server, [again], ("completed",), timeout=30)[0]["status"] == "completed"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["amp", "nohup", "double_fork", "setsid"])
def test_a_detached_big_process_counts_in_the_cap(dev_server, daemon_factory, tmp_path, how):
    d = daemon_factory(f"q-detach-cap-{how}", handler=HANDLER, procs=1, worker_id=f"w-detach-cap-{how}",
                       args=["--max-memory-per-child", "150"]).wait_ready()
    pidfile = tmp_path / "hog.pid"
    job = dev_server.enqueue(d.queue, {"how": how, "mb": 300, "pidfile": str(pidfile), "hold": 30},
                             max_retries=0)
    pid = read_pid(pidfile)
    done = wait_for_status(dev_server, [job], ("completed", "deadletter"), timeout=40)[0]
    assert done["status"] == "deadletter" and done["last_error"].startswith("MemoryLimitExceeded"), done
    wait_until(lambda: not alive(pid), timeout=10, what="the detached process stopped with the job")


@pytest.mark.timeout(120)
def test_what_a_childs_start_up_started_lives_as_long_as_that_child(dev_server, tmp_path):
    pidfile = tmp_path / "startup.pid"
    d = Daemon(dev_server, "q-detach-startup", handler=HANDLER, procs=1, worker_id="w-detach-startup",
               env={"DETACH_IMPORT_PIDFILE": str(pidfile)}).start()
    try:
        d.wait_ready()
        pid = read_pid(pidfile)
        job = dev_server.enqueue(d.queue, {"how": "amp", "mb": 1, "pidfile": str(tmp_path / "job.pid")})
        assert wait_for_status(dev_server, [job], ("completed",), timeout=30)[0]["status"] == "completed"
        assert alive(pid)  # the start-up's process outlives the job...
        child = d.child_pids()[0]
        os.kill(child, signal.SIGKILL)  # ...not its child
        wait_until(lambda: not alive(pid), timeout=15, what="the start-up's process gone with its child")
        d.signal(signal.SIGTERM)
        assert d.wait(30) == 0
    finally:
        d.stop()


@pytest.mark.timeout(120)
def test_what_the_module_started_at_import_under_preload_does_not_outlive_the_daemon(dev_server, tmp_path):
    pidfile = tmp_path / "import.pid"
    d = Daemon(dev_server, "q-detach-preload", handler=HANDLER, procs=1, worker_id="w-detach-preload",
               args=["--preload"], env={"DETACH_IMPORT_PIDFILE": str(pidfile)}).start()
    try:
        d.wait_ready()
        pid = read_pid(pidfile)
        assert alive(pid)
        d.signal(signal.SIGTERM)
        assert d.wait(30) == 0
        wait_until(lambda: not alive(pid), timeout=10, what="the import's process gone with the daemon")
    finally:
        d.stop()


@pytest.mark.timeout(60)
def test_a_handler_that_cannot_be_imported_names_no_keeper_as_an_escaped_process(dev_server, daemon_factory):
    for attempt in range(3):
        d = Daemon(dev_server, "q-nope", handler="tests.support.handlers_detach:nope", procs=2,
                   worker_id=f"w-nope-{attempt}").start()
        try:
            code = d.wait(30)
        finally:
            d.stop()
        assert code != 0
        warned = [r for r in d.records() if r.get("level") == "warning" and "process" in r.get("msg", "")]
        assert not warned, [(r["msg"], r.get("processes")) for r in warned]


@pytest.mark.timeout(60)
def test_multiprocessings_resource_tracker_a_job_started_serves_the_next_jobs(dev_server, daemon_factory):
    """The tracker is multiprocessing's own server for the child, started lazily by a job: it is not the job's
    to stop, or each later job would relaunch it with a warning that resources might leak."""
    d = daemon_factory("q-tracker", handler="tests.support.handlers_detach:tracked", procs=1,
                       worker_id="w-tracker").wait_ready()
    first = dev_server.enqueue("q-tracker", {})
    (done,) = wait_for_status(dev_server, [first], timeout=30)
    tracker = done["result"]["tracker"]
    assert isinstance(tracker, int)
    later = [dev_server.enqueue("q-tracker", {}) for _ in range(2)]
    assert [j["result"]["tracker"] for j in wait_for_status(dev_server, later, timeout=30)] == [tracker, tracker]
    assert not [line for line in d.out.lines if "resource_tracker" in line or "relaunching" in line]
