"""408 and the 5xx answers other than 503 are retried like a network error and lose no job."""

from __future__ import annotations

import pytest
from conftest import (
    Daemon,
    wait_for_status,
    wait_until,
)

DONE = ("completed", "failed", "deadletter")


# ---------------------------------------------------------------- API failures
@pytest.mark.timeout(90)
@pytest.mark.parametrize("status", [408, 500, 502, 504])
def test_408_and_5xx_other_than_503_are_retried_and_lose_nothing(dev_server, stopped, status):
    d = Daemon(dev_server, "q-5xx", procs=1, worker_id="w-5xx").start()
    stopped.append(d)
    d.wait_ready()
    job_id = dev_server.enqueue("q-5xx", {"do": "sleep", "secs": 1.5})
    d.busy_child(job_id)
    dev_server.set_faults(fail_503=1.0, fail_status=status)  # every API call answered `status`
    try:
        wait_until(lambda: [e for e in d.events("complete not delivered yet; will retry") if str(status) in e["error"]],
                   timeout=20, what=f"the result held back by {status}")
        wait_until(lambda: [e for e in d.events("claim failed") + d.events("heartbeat failed")
                            if str(status) in e["error"]], timeout=20, what=f"claims or heartbeats meeting {status}")
        assert d.proc.poll() is None
    finally:
        dev_server.set_faults(fail_503=0, fail_status=503)
    job = wait_for_status(dev_server, [job_id], DONE, timeout=30)[0]
    assert job["status"] == "completed" and job["retry_count"] == 0 and job["result"]["slept"] == 1.5
    more = dev_server.enqueue("q-5xx", {"do": "echo"})
    assert wait_for_status(dev_server, [more], timeout=20)[0]["status"] == "completed"
