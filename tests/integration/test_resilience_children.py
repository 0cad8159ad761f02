"""Children that die or misbehave: crashes, boot loops, runaway handlers, recycling, parent SIGKILL.

Every test runs the real daemon against the real dev server and reads the outcome back from the
server (job status, last_error, retry_count, worker row) and from the daemon's JSON log lines.
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter

import psutil
import pytest
from conftest import Daemon, DevServer, wait_for_status, wait_until

DONE = ("completed", "failed", "deadletter")




def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.timeout(60)
def test_child_crashes_fail_the_job_at_once_with_the_cause(dev_server, daemon_factory):
    d = daemon_factory("crash", procs=2).wait_ready()
    # A long job on one child: it must carry on, untouched, while the other child dies again and again.
    steady = dev_server.enqueue("crash", {"do": "sleep", "secs": 5}, max_retries=0)
    steady_pid = d.busy_child(steady)

    cases = [
        ({"do": "os_exit", "code": 7}, "exited with code 7"),
        ({"do": "segfault"}, "killed by SIGSEGV"),
        ({"do": "kill9"}, "killed by signal 9 (not by the daemon)"),
    ]
    for payload, cause in cases:
        started = time.monotonic()
        job_id = dev_server.enqueue("crash", payload, max_retries=0)
        job = wait_for_status(dev_server, [job_id], DONE, timeout=20)[0]
        assert job["status"] == "deadletter", job
        assert job["last_error"].startswith("ChildProcessDied: the child process running this job (pid "), job
        assert cause in job["last_error"], job["last_error"]
        assert time.monotonic() - started < 20  # at once, not after the 30 s lease

    # A SIGKILL from outside mid-job, not counted as an OOM kill: named as such.
    victim_job = dev_server.enqueue("crash", {"do": "sleep", "secs": 60}, max_retries=0)
    victim = d.busy_child(victim_job)
    assert victim != steady_pid
    killed_at = time.monotonic()
    os.kill(victim, signal.SIGKILL)
    job = wait_for_status(dev_server, [victim_job], DONE, timeout=20)[0]
    assert time.monotonic() - killed_at < 20  # at once, not after the 30 s lease
    assert job["status"] == "deadletter"
    assert f"(pid {victim}) killed by signal 9 (not by the daemon)" in job["last_error"]

    # The other child carried on and finished its job; the dead ones were replaced.
    done = wait_for_status(dev_server, [steady], ("completed",), timeout=15)[0]
    assert done["result"]["pid"] == steady_pid and done["retry_count"] == 0
    wait_until(lambda: len(d.child_pids()) == 2, timeout=10, what="two children again")
    assert steady_pid in d.child_pids() and victim not in d.child_pids()
    replaced = d.wait_events("child exited; starting a new one", 4)
    assert all(e["reason"] == "crashed" for e in replaced), replaced
    died = d.wait_events("child died during a job", job_id=victim_job) + d.events("child died during a job")
    assert {e["job_id"] for e in died} >= {victim_job}
    assert dev_server.worker("test-worker")["jobs_failed"] >= 4
    # ...and the daemon still works.
    after = dev_server.enqueue("crash", {"do": "echo"})
    assert wait_for_status(dev_server, [after], timeout=10)[0]["status"] == "completed"
    assert d.proc.poll() is None


@pytest.mark.timeout(60)
def test_sys_exit_hang_and_blocked_signals_end_within_the_job_timeout(dev_server, daemon_factory):
    d = daemon_factory("unruly", procs=2).wait_ready()
    exit_job = dev_server.enqueue("unruly", {"do": "exit", "code": 3}, max_retries=0)
    job = wait_for_status(dev_server, [exit_job], DONE, timeout=10)[0]
    assert job["status"] == "deadletter"
    assert job["last_error"] == "SystemExit: handler called sys.exit(3)"

    started = time.monotonic()
    hang = dev_server.enqueue("unruly", {"do": "hang"}, max_retries=0, timeout_seconds=1)
    blocker = dev_server.enqueue("unruly", {"do": "block_signals"}, max_retries=0, timeout_seconds=1)
    blocker_pid = d.busy_child(blocker)
    jobs = wait_for_status(dev_server, [hang, blocker], DONE, timeout=25)
    elapsed = time.monotonic() - started
    assert elapsed < 25, elapsed  # a 1 s timeout, then SIGTERM, then SIGKILL after the 1 s grace (not the 30 s lease)
    for job in jobs:
        assert job["status"] == "deadletter"
        assert job["last_error"].startswith("JobTimeout: the job ran past its timeout of 1 s"), job["last_error"]
    # The child that blocked SIGTERM got SIGKILL after --kill-grace and is gone.
    wait_until(lambda: gone(blocker_pid), timeout=5, what="the signal-blocking child to die")
    d.wait_events("child ignored SIGTERM; sending SIGKILL", pid=blocker_pid)
    assert len(d.wait_events("job timed out; stopping its child", 2)) == 2

    wait_until(lambda: len(d.child_pids()) == 2, timeout=10, what="two children again")
    ok = dev_server.enqueue("unruly", {"do": "echo"})
    assert wait_for_status(dev_server, [ok], timeout=10)[0]["status"] == "completed"
    assert d.proc.poll() is None


@pytest.mark.timeout(60)
def test_children_dying_while_starting_back_off_and_report_degraded(tmp_path):
    server = DevServer(str(tmp_path / "dev.db"), extra=["--heartbeat-interval", "1"]).start()
    flag = tmp_path / "boot-fail"
    starts = tmp_path / "starts"
    d = Daemon(server, "boot", handler="tests.support.handlers_chaos:handle", procs=1,
               env={"CHAOS_BOOT_FAIL_FLAG": str(flag), "CHAOS_BOOT_LOG": str(starts)}).start()
    try:
        d.wait_ready()
        wait_until(lambda: server.worker("test-worker"), timeout=15, what="the worker row")
        flag.write_text("fail")
        parent = psutil.Process(d.proc.pid)
        cpu_before = sum(parent.cpu_times()[:2])
        os.kill(d.child_pids()[0], signal.SIGKILL)
        events = wait_until(lambda: (lambda ev: ev if len(ev) >= 4 else None)(
            d.events("child failed while starting; backing off")), timeout=15, what="four boot failures")
        assert [e["failures"] for e in events[:4]] == [1, 2, 3, 4]
        assert all("boot failure requested" in e["error"] and e["level"] == "error" for e in events[:4])
        # Exponential back-off with jitter in [d/2, d], d = 0.5 s * 2^(n-1), as the children's own start
        # times show it: the gap after the n-th failed start is at least d/2 (and not minutes).
        times = [float(t) for t in starts.read_text().split()]
        failed = times[1:]  # after the first child's start: its successor's, then each retry's
        gaps = [b - a for a, b in zip(failed, failed[1:], strict=False)]
        assert len(gaps) >= 3, times
        for n, gap in enumerate(gaps[:4], start=1):
            nominal = 0.5 * 2 ** (n - 1)
            assert nominal / 2 - 0.01 <= gap <= nominal + 5, (n, gaps)
        # Not spinning: the parent used little CPU while its children kept failing.
        assert sum(parent.cpu_times()[:2]) - cpu_before < 1.0
        wait_until(lambda: server.worker("test-worker")["status"] == "degraded", timeout=15,
                   what="heartbeat status degraded")
        assert d.proc.poll() is None  # the daemon never exits because a child cannot start

        flag.unlink()
        job = server.enqueue("boot", {"do": "echo"})
        assert wait_for_status(server, [job], timeout=40)[0]["status"] == "completed"
        assert d.proc.poll() is None
        d.stop()
        assert d.proc.returncode == 0
    finally:
        d.stop()
        server.stop()


@pytest.mark.timeout(30)
def test_a_handler_that_never_imports_exits_3_not_0(dev_server, daemon_factory):
    d = daemon_factory("noimport", handler="supervisor.demo_handlers:no_such_function", procs=2)
    assert d.wait(20) == 3
    assert "cannot import handler supervisor.demo_handlers:no_such_function" in d.out.text()


@pytest.mark.timeout(60)
def test_max_jobs_per_child_recycles_children(dev_server, daemon_factory):
    d = daemon_factory("recycle", procs=1, args=["--max-jobs-per-child", "3"]).wait_ready()
    ids = [dev_server.enqueue("recycle", {"do": "echo", "n": i}) for i in range(9)]
    jobs = wait_for_status(dev_server, ids, timeout=30)
    per_pid = Counter(j["result"]["pid"] for j in jobs)
    # 3 plus 10% jitter rounds down to exactly 3 jobs per child.
    assert sorted(per_pid.values()) == [3, 3, 3], per_pid
    recycled = d.wait_events("replacing child", 2, reason="max_jobs")
    assert all(e["jobs_done"] == 3 for e in recycled)
    assert all(j["retry_count"] == 0 for j in jobs)


@pytest.mark.timeout(60)
def test_max_memory_per_child_replaces_after_the_job_or_stops_a_runaway(dev_server, daemon_factory):
    d = daemon_factory("memory", handler="tests.support.handlers_chaos:handle", procs=1,
                       args=["--max-memory-per-child", "100"]).wait_ready()
    # Over the cap after the job: the job completes, then the child is replaced.
    leak = dev_server.enqueue("memory", {"do": "leak", "mb": 150}, max_retries=0)
    job = wait_for_status(dev_server, [leak], DONE, timeout=20)[0]
    assert job["status"] == "completed" and job["result"]["kept_mb"] == 150
    leaker = job["result"]["pid"]
    wait_until(lambda: gone(leaker), timeout=10, what="the child over its cap to be replaced")
    d.wait_events("replacing child", reason="max_memory", pid=leaker)

    # Growing during a job: stopped, and the job failed with a clear error.
    started = time.monotonic()
    grow = dev_server.enqueue("memory", {"do": "grow", "step_mb": 8, "pause": 0.05, "steps": 400}, max_retries=0)
    grower = d.busy_child(grow)
    job = wait_for_status(dev_server, [grow], DONE, timeout=30)[0]
    assert job["status"] == "deadletter"
    assert job["last_error"].startswith("MemoryLimitExceeded: the job used "), job
    assert "over the cap of 100 MiB (the child alone); its processes were stopped" in job["last_error"]
    assert time.monotonic() - started < 30  # well before its 400 steps (20 s) end by themselves
    wait_until(lambda: gone(grower), timeout=5, what="the runaway child to be gone")
    d.wait_events("a job's processes stayed over the memory cap; stopping the child and its group", pid=grower)

    echo = dev_server.enqueue("memory", {"do": "echo"})
    done = wait_for_status(dev_server, [echo], timeout=10)[0]
    assert done["status"] == "completed" and done["result"]["pid"] not in (leaker, grower)
    assert d.proc.poll() is None


@pytest.mark.timeout(60)
def test_parent_sigkill_leaves_no_orphans_and_a_restart_recovers_the_jobs(dev_server, daemon_factory):
    handler = "tests.support.handlers_chaos:handle"
    first = daemon_factory("orphans", procs=2, handler=handler, args=["--lease", "5"]).wait_ready()
    ids = [dev_server.enqueue("orphans", {"do": "slow_first", "ms": 60000}) for _ in range(2)]
    for job_id in ids:
        first.busy_child(job_id)
    tree = [p.pid for p in psutil.Process(first.proc.pid).children(recursive=True)]
    assert len(tree) >= 3  # the forkserver and two children
    os.kill(first.proc.pid, signal.SIGKILL)
    killed_at = time.monotonic()
    # At once (PR_SET_PDEATHSIG), not after the 5 s lease or never (busy orphans burning CPU)
    wait_until(lambda: all(gone(pid) for pid in tree), timeout=5.0, interval=0.02,
               what="every child to be gone after the parent's SIGKILL")
    assert time.monotonic() - killed_at < 5.0
    assert first.wait(5) == -signal.SIGKILL

    second = daemon_factory("orphans", procs=2, handler=handler, args=["--lease", "5"]).wait_ready()
    worker = wait_until(lambda: (lambda w: w if w and w["metadata"]["pid"] == second.proc.pid else None)(
        dev_server.worker("test-worker")), timeout=10, what="the worker registered again by the new process")
    assert worker["status"] == "healthy"
    # The server hands the jobs back once their 5 s lease lapses; the new daemon runs them to completion.
    new_children = set(second.child_pids())
    jobs = wait_for_status(dev_server, ids, DONE, timeout=20)
    for job in jobs:
        assert job["status"] == "completed", job
        assert job["retry_count"] == 1 and job["result"]["retry_count"] == 1
        assert job["result"]["pid"] in new_children and job["assigned_worker_id"] == "test-worker"
    assert second.proc.poll() is None
