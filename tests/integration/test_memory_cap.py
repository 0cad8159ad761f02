"""--max-memory-per-child counts the job's whole process tree: a handler whose subprocess allocates past
the cap has its job failed with the cap error, and nothing of the tree is left behind."""

from __future__ import annotations

import time

import psutil
import pytest
from conftest import wait_for_status, wait_until
from support.intake_helpers import status as status_of

DONE = ("completed", "deadletter", "failed")


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.timeout(90)
def test_a_subprocess_past_the_cap_fails_the_job_and_leaves_no_process_behind(dev_server, daemon_factory, tmp_path):
    d = daemon_factory("cap", handler="tests.support.handlers_memory:handle", procs=1,
                       args=["--max-memory-per-child", "120", "--health-port", "0"]).wait_ready(60)
    port = d.health_port
    pidfile = tmp_path / "sub.pid"
    started = time.monotonic()
    job_id = dev_server.enqueue("cap", {"do": "sub_alloc", "mb": 200, "secs": 60, "pidfile": str(pidfile)},
                                max_retries=0)
    child = d.busy_child(job_id)
    sub = wait_until(lambda: pidfile.exists() and pidfile.read_text() and int(pidfile.read_text()), timeout=20,
                     what="the handler's subprocess")
    job = wait_for_status(dev_server, [job_id], DONE, timeout=40)[0]
    assert job["status"] == "deadletter", job
    assert job["last_error"].startswith("MemoryLimitExceeded: the job used "), job
    assert "MiB over the cap of 120 MiB (child and 1 subprocess); its processes were stopped" in job["last_error"]
    assert time.monotonic() - started < 40  # well before the subprocess's 60 s end by itself
    wait_until(lambda: gone(child) and gone(sub), timeout=10, what="the child and its subprocess gone")
    d.wait_events("a job's processes stayed over the memory cap; stopping the child and its group", pid=child,
                  subprocesses=1)

    # A new child replaces it and works; /status shows each child's memory.
    ok = wait_for_status(dev_server, [dev_server.enqueue("cap", {"do": "version"})], timeout=30)[0]
    assert ok["result"]["pid"] != child
    wait_until(lambda: all(c["memory_bytes"] for c in status_of(port)["children"]), timeout=10,
               what="children's memory in /status")
    assert status_of(port)["children"][0]["memory_bytes"] < 120 * 2**20
