"""Job outcomes and child restarts in the /metrics of a real daemon, read after real jobs and a killed child."""

from __future__ import annotations

import pytest
from conftest import (
    Daemon,
    metric,
    wait_for_status,
    wait_until,
)

DONE = ("completed", "failed", "deadletter")


# ---------------------------------------------------------------- metrics from a real daemon
@pytest.mark.timeout(90)
def test_outcomes_and_child_restarts_in_metrics_of_a_real_daemon(dev_server, stopped):
    d = Daemon(dev_server, "q-out", procs=2, worker_id="w-out", args=["--health-port", "0"]).start()
    port = d.health_port
    stopped.append(d)
    d.wait_ready()
    cases = {"completed": {"do": "echo"}, "failed": {"do": "raise"}, "timed_out": {"do": "hang"},
             "crashed": {"do": "os_exit", "code": 9}}
    ids = {k: dev_server.enqueue("q-out", p, max_retries=0, timeout_seconds=1) for k, p in cases.items()}
    jobs = dict(zip(ids, wait_for_status(dev_server, list(ids.values()), DONE, timeout=30), strict=False))
    assert jobs["completed"]["status"] == "completed"
    assert jobs["timed_out"]["last_error"].startswith("JobTimeout")
    assert jobs["crashed"]["last_error"].startswith("ChildProcessDied") and "code 9" in jobs["crashed"]["last_error"]
    lost = dev_server.enqueue("q-out", {"do": "sleep", "secs": 30}, max_retries=0, timeout_seconds=60)
    d.busy_child(lost)
    dev_server.steal_lease(lost, "w-thief")
    d.out.wait_for(r"lease lost; stopping the job's work")

    def counts():
        values = {o: metric(port, "jobs_total", queue="q-out", outcome=o)
                  for o in ("completed", "failed", "timed_out", "crashed", "lease_lost")}
        restarts = {r: metric(port, "child_restarts_total", reason=r) for r in ("timeout", "crashed", "lease_lost")}
        return (values, restarts) if all(v == 1 for v in [*values.values(), *restarts.values()]) else None

    wait_until(counts, timeout=30, what="one of each outcome and restart in /metrics")
