"""Every way a lease is lost, end to end: the real daemon, the real dev server told to lose
the lease on demand (POST /_dev/leases/{id}/expire | steal), and the outcome read back from the server.

In each case: the child running the lost copy is stopped (or, if it had finished, its result dropped),
nothing more is sent under the lost lease (the server's request log), the lease_lost metric and the log
line say why, and the job ends completed exactly once.
"""

from __future__ import annotations

import psutil
import pytest
from conftest import Daemon, DevServer, metric, wait_for_status, wait_until

HANDLER = "tests.support.handlers_chaos:handle"
LOST = "lease lost; stopping the job's work"


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def counted(port: int, name: str, **labels) -> None:
    """Wait until /metrics counts at least one of `name` with `labels`. The daemon counts a completion when the
    server's answer reaches it, a moment after the server shows the job completed, and a restart when it reaps
    the child, a moment after the child is gone: read once, either may not be there yet."""
    wait_until(lambda: metric(port, name, **labels) >= 1, timeout=10, what=f"{name} {labels} in /metrics")


@pytest.fixture
def server(tmp_path):
    s = DevServer(str(tmp_path / "dev.db"), extra=["--lease-sweep-interval", "0.2"]).start()
    yield s
    s.stop()


def start(server: DevServer, queue: str, procs: int, lease: int) -> tuple[Daemon, int]:
    d = Daemon(server, queue, handler=HANDLER, procs=procs, worker_id="w-" + queue,
               args=["--lease", str(lease), "--health-port", "0"]).start().wait_ready()
    port = d.health_port
    return d, port


def job_requests(server: DevServer, job_id: str) -> list[dict]:
    """What the daemon sent for this job (POSTs to its job routes), as the server saw them, oldest first."""
    prefix = f"/api/v1/jobs/{job_id}/"
    return [e for e in server.requests_seen() if e["method"] == "POST" and e["path"].startswith(prefix)]


def check_completed_once(server: DevServer, job_id: str, lost_lease: str, worker_id: str) -> dict:
    """The job completed on its second delivery; exactly one accepted complete, and none under the lost lease."""
    job = wait_for_status(server, [job_id], ("completed", "failed", "deadletter"), timeout=40)[0]
    assert job["status"] == "completed" and job["retry_count"] == 1, job
    assert job["result"]["retry_count"] == 1 and job["result"]["lease_id"] != lost_lease
    sent = job_requests(server, job_id)
    completes = [e for e in sent if e["path"].endswith("/complete") and e["status"] == 200]
    assert len(completes) == 1 and completes[0]["lease_id"] == job["result"]["lease_id"], sent
    assert server.worker(worker_id)["jobs_processed"] == 1
    return job


@pytest.mark.timeout(90)
def test_renewal_answered_409_stops_the_child_and_the_job_completes_once(server):
    d, port = start(server, "lost409", procs=1, lease=6)  # renewals every 2 s
    try:
        job_id = server.enqueue("lost409", {"do": "sleep_first", "secs": 60}, max_retries=3, timeout_seconds=120)
        victim = d.busy_child(job_id)
        lease = server.job(job_id)["lease_id"]
        # Re-issued to this same worker id under a new 5 s lease (as after a restart): our renewal names the
        # old lease and meets 409 LEASE_EXPIRED; once the new lease lapses the sweep hands the job out again.
        server.steal_lease(job_id, "w-lost409", secs=5)
        line = wait_until(lambda: d.events(LOST), timeout=15, what="the lease-lost line")[0]
        assert line["job_id"] == job_id and line["pid"] == victim and "409" in line["error"], line
        assert "LEASE_EXPIRED" in line["error"]
        wait_until(lambda: gone(victim), timeout=10, what="the child running the lost copy to be stopped")
        job = check_completed_once(server, job_id, lease, "w-lost409")
        assert job["result"]["pid"] != victim
        sent = job_requests(server, job_id)
        refused = [i for i, e in enumerate(sent) if e["lease_id"] == lease and e["status"] == 409]
        assert len(refused) == 1 and sent[refused[0]]["path"].endswith("/heartbeat"), sent
        assert all(e["lease_id"] != lease for e in sent[refused[0] + 1:]), sent  # nothing more under that lease
        counted(port, "jobs_total", queue="lost409", outcome="completed")
        assert metric(port, "jobs_total", queue="lost409", outcome="lease_lost") == 1
        assert metric(port, "jobs_total", queue="lost409", outcome="completed") == 1
        assert metric(port, "lease_renewals_total", outcome="lost") == 1
        assert metric(port, "child_restarts_total", reason="lease_lost") == 1
    finally:
        d.stop()


@pytest.mark.timeout(90)
def test_renewal_answered_404_stops_the_child_and_the_job_completes_once(server):
    d, port = start(server, "lost404", procs=1, lease=6)
    try:
        job_id = server.enqueue("lost404", {"do": "sleep_first", "secs": 60}, max_retries=3, timeout_seconds=120)
        victim = d.busy_child(job_id)
        lease = server.job(job_id)["lease_id"]
        # Another worker holds it now (for 5 s, then the sweep hands it out again): our renewal meets 404.
        server.steal_lease(job_id, "w-thief", secs=5)
        line = wait_until(lambda: d.events(LOST), timeout=15, what="the lease-lost line")[0]
        assert line["job_id"] == job_id and line["pid"] == victim and "404" in line["error"], line
        wait_until(lambda: gone(victim), timeout=10, what="the child running the lost copy to be stopped")
        check_completed_once(server, job_id, lease, "w-lost404")
        sent = job_requests(server, job_id)
        refused = [i for i, e in enumerate(sent) if e["lease_id"] == lease and e["status"] == 404]
        assert len(refused) == 1 and sent[refused[0]]["path"].endswith("/heartbeat"), sent
        assert all(e["lease_id"] != lease for e in sent[refused[0] + 1:]), sent
        counted(port, "jobs_total", queue="lost404", outcome="completed")
        counted(port, "child_restarts_total", reason="lease_lost")
        assert metric(port, "jobs_total", queue="lost404", outcome="lease_lost") == 1
        assert metric(port, "child_restarts_total", reason="lease_lost") == 1
    finally:
        d.stop()


@pytest.mark.timeout(90)
def test_a_result_refused_because_the_job_was_handed_out_again_is_dropped(server):
    d, port = start(server, "refused", procs=1, lease=60)  # first renewal at 20 s: the result goes first
    try:
        job_id = server.enqueue("refused", {"do": "sleep_first", "secs": 3}, max_retries=3, timeout_seconds=120)
        runner = d.busy_child(job_id)
        lease = server.job(job_id)["lease_id"]
        stolen = server.steal_lease(job_id, "w-thief", secs=120)
        line = wait_until(lambda: d.events("complete refused: this worker no longer holds the job; outcome dropped"),
                          timeout=20, what="the refused result")[0]
        assert line["job_id"] == job_id and "404" in line["error"], line
        # The thief finishes it; a later job shows the daemon moved on, and it sent nothing more for the job.
        r = server.request("POST", f"/api/v1/jobs/{job_id}/complete",
                           json={"worker_id": "w-thief", "lease_id": stolen["lease_id"], "result": {"by": "thief"}})
        assert r.status_code == 200, r.text
        after = server.enqueue("refused", {"do": "echo"})
        assert wait_for_status(server, [after], timeout=20)[0]["result"]["pid"] == runner  # the child was not stopped
        job = server.job(job_id)
        assert job["status"] == "completed" and job["result"] == {"by": "thief"} and job["retry_count"] == 0
        sent = job_requests(server, job_id)
        assert [(e["path"].rsplit("/", 1)[1], e["status"], e["lease_id"]) for e in sent] == [
            ("complete", 404, lease), ("complete", 200, stolen["lease_id"])], sent
        assert server.worker("w-refused")["jobs_processed"] == 1  # the echo job only
        counted(port, "jobs_total", queue="refused", outcome="completed")
        assert metric(port, "jobs_total", queue="refused", outcome="lease_lost") == 1
        assert metric(port, "jobs_total", queue="refused", outcome="completed") == 1
        assert not d.events(LOST)
    finally:
        d.stop()


@pytest.mark.timeout(90)
def test_the_same_job_reissued_while_the_old_copy_runs_stops_the_old_copy(server):
    d, port = start(server, "reissued", procs=2, lease=60)  # an idle child claims the job again
    try:
        job_id = server.enqueue("reissued", {"do": "sleep_first", "secs": 60}, max_retries=3, timeout_seconds=120)
        victim = d.busy_child(job_id)
        lease = server.job(job_id)["lease_id"]
        server.expire_lease(job_id)
        line = wait_until(lambda: d.events(LOST), timeout=15, what="the lease-lost line")[0]
        assert line["job_id"] == job_id and line["pid"] == victim, line
        assert line["error"] == "the server handed this job out again under a new lease"
        wait_until(lambda: gone(victim), timeout=10, what="the old copy's child to be stopped")
        job = check_completed_once(server, job_id, lease, "w-reissued")
        assert job["result"]["pid"] != victim
        assert all(e["lease_id"] != lease for e in job_requests(server, job_id))  # not one word under the old lease
        counted(port, "jobs_total", queue="reissued", outcome="completed")
        counted(port, "child_restarts_total", reason="lease_lost")
        assert metric(port, "jobs_total", queue="reissued", outcome="lease_lost") == 1
        assert metric(port, "jobs_total", queue="reissued", outcome="completed") == 1
        assert metric(port, "child_restarts_total", reason="lease_lost") == 1
    finally:
        d.stop()
