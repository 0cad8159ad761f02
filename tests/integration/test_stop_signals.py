"""Stop signals on the real daemon: SIGINT drains and a second SIGINT stops at once, children ignore a
terminal's SIGINT and finish their job, SIGTTOU lets a busy child finish before it leaves."""

from __future__ import annotations

import os
import signal

import psutil
import pytest
from conftest import (
    Daemon,
    wait_for_status,
    wait_until,
)
from support.intake_helpers import status as status_of

DONE = ("completed", "failed", "deadletter")


# ---------------------------------------------------------------- signals
@pytest.mark.timeout(60)
def test_sigint_drains_and_a_second_sigint_stops_at_once(dev_server, daemon_factory):
    ids = [dev_server.enqueue("q-int", {"do": "sleep", "secs": 60}, timeout_seconds=120) for _ in range(2)]
    d = daemon_factory("q-int", procs=2, worker_id="w-int", args=["--drain-timeout", "60"])
    wait_for_status(dev_server, ids, statuses=("processing",), timeout=20)
    later = dev_server.enqueue("q-int", {"do": "echo"})
    d.signal(signal.SIGINT)
    d.out.wait_for(r"stop signal: draining")
    wait_until(lambda: dev_server.worker("w-int")["status"] == "draining", timeout=20, what="heartbeat draining")
    assert d.proc.poll() is None  # draining: waiting for the two jobs
    d.signal(signal.SIGINT)
    assert d.wait(30) == 0  # at once, not after the 60 s drain timeout
    assert d.events("second stop signal: stopping at once")
    assert [dev_server.job(i)["status"] for i in ids] == ["pending", "pending"]  # handed back by deregister
    assert dev_server.job(later)["status"] == "pending"  # no claim after the first signal
    assert dev_server.worker("w-int")["status"] == "offline"


@pytest.mark.timeout(60)
def test_children_ignore_a_terminals_sigint_and_finish_their_job(dev_server, daemon_factory):
    """Ctrl-C reaches the whole process group; the children carry on, the parent drains."""
    d = daemon_factory("q-ctrlc", procs=2, worker_id="w-ctrlc", args=["--drain-timeout", "60"]).wait_ready()
    job_id = dev_server.enqueue("q-ctrlc", {"do": "sleep", "secs": 3})
    pid = d.busy_child(job_id)
    group = [p.pid for p in psutil.Process(d.proc.pid).children(recursive=True)]
    os.killpg(d.proc.pid, signal.SIGINT)  # the daemon leads its own group (start_new_session)
    assert d.wait(40) == 0
    job = dev_server.job(job_id)
    assert job["status"] == "completed" and job["retry_count"] == 0, job
    assert job["result"]["pid"] == pid and pid in group  # the child that got SIGINT finished the job
    assert not d.events("child died during a job")


@pytest.mark.timeout(60)
def test_sigttou_lets_a_busy_child_finish_its_job_before_leaving(dev_server, stopped):
    d = Daemon(dev_server, "q-ttou", procs=2, worker_id="w-ttou", args=["--health-port", "0"]).start()
    port = d.health_port
    stopped.append(d)
    d.wait_ready()
    ids = [dev_server.enqueue("q-ttou", {"do": "sleep", "secs": 3}) for _ in range(2)]
    pids = {d.busy_child(job_id) for job_id in ids}
    assert len(pids) == 2  # both children busy
    d.signal(signal.SIGTTOU)
    wait_until(lambda: status_of(port)["procs"] == 1, timeout=10, what="procs 1")
    jobs = wait_for_status(dev_server, ids, DONE, timeout=30)
    for job in jobs:  # neither job was cut short: each finished on the child that started it
        assert job["status"] == "completed" and job["retry_count"] == 0, job
    assert {j["result"]["pid"] for j in jobs} == pids
    wait_until(lambda: len(d.child_pids()) == 1, timeout=10, what="one child left")
    assert set(d.child_pids()) < pids  # the one that stayed is one of the two, not a new one
    assert not d.events("child died during a job")
