"""Burst mode: `--until-empty` / SPOOLED_UNTIL_EMPTY runs a queue's backlog, then exits 0.

The daemon claims until a claim finds nothing and no job is in flight, drains, deregisters and exits,
which is what deploy/k8s/job.yaml relies on.
"""

from __future__ import annotations

import time

import pytest
from conftest import wait_for_status

pytestmark = pytest.mark.timeout(90)


def test_a_backlog_of_n_jobs_is_run_then_the_daemon_deregisters_and_exits_0(dev_server, daemon_factory):
    ids = [dev_server.enqueue("batch", {"do": "cpu", "ms": 30}) for _ in range(12)]
    daemon = daemon_factory("batch", procs=2, worker_id="burst-worker", args=["--until-empty"])
    assert daemon.wait(60) == 0, daemon.out.text()[-3000:]
    jobs = wait_for_status(dev_server, ids, timeout=5)
    assert [j["status"] for j in jobs] == ["completed"] * 12
    assert len({j["result"]["pid"] for j in jobs}) >= 1
    worker = dev_server.worker("burst-worker")
    assert worker["status"] == "offline" and worker["jobs_processed"] == 12  # deregistered after the last job
    assert daemon.events("deregistered")
    assert dev_server.stats()["processing"] == 0


def test_an_empty_queue_exits_at_once_not_after_a_poll(dev_server, daemon_factory):
    """The first empty claim ends the run: a 30 s poll interval is never waited out."""
    started = time.monotonic()
    daemon = daemon_factory("nothing-here", procs=1, worker_id="burst-empty",
                            args=["--until-empty", "--poll-interval", "30"])
    assert daemon.wait(25) == 0, daemon.out.text()[-3000:]
    assert time.monotonic() - started < 20  # start-up and shutdown on a loaded machine, no 30 s wait
    assert dev_server.worker("burst-empty")["status"] == "offline"  # it registered, then deregistered
    assert daemon.events("deregistered")


def test_the_environment_variable_turns_it_on(dev_server, daemon_factory):
    ids = [dev_server.enqueue("batch-env", {"do": "echo", "n": i}) for i in range(3)]
    daemon = daemon_factory("batch-env", procs=1, worker_id="burst-env", env={"SPOOLED_UNTIL_EMPTY": "1"})
    assert daemon.wait(30) == 0, daemon.out.text()[-3000:]
    assert [j["status"] for j in wait_for_status(dev_server, ids, timeout=5)] == ["completed"] * 3
    assert dev_server.worker("burst-env")["status"] == "offline"
