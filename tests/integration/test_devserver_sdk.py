"""The official `spooled` SDK (1.6.0) as the client of the dev server: the worker lifecycle end to end."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest
from conftest import DevServer, wait_until
from spooled import SpooledClient
from spooled.errors import ConflictError, NotFoundError, QuotaExceededError, ValidationError

pytestmark = pytest.mark.timeout(60)


def sdk(server: DevServer) -> SpooledClient:
    return SpooledClient(api_key=server.api_key, base_url=server.url)


def test_full_lifecycle_register_claim_heartbeat_complete(dev_server):
    c = sdk(dev_server)
    created = c.jobs.create({"queue_name": "emails", "payload": {"to": "a@b.c", "n": 2**60}, "priority": 5})
    assert created.created is True
    reg = c.workers.register({"queue_name": "emails", "hostname": "host-1", "worker_id": "w-1",
                              "max_concurrency": 3, "metadata": {"pid": 1}})
    assert (reg.id, reg.queue_name, reg.lease_duration_secs, reg.heartbeat_interval_secs) == ("w-1", "emails", 30, 10)

    claimed = c.jobs.claim({"queue_name": "emails", "worker_id": "w-1", "limit": 10}).jobs
    assert [j.id for j in claimed] == [created.id]
    job = claimed[0]
    assert job.payload == {"to": "a@b.c", "n": 2**60}
    assert (job.retry_count, job.max_retries, job.timeout_seconds) == (0, 3, 300)
    assert job.lease_id.endswith("-" + job.id) and len(job.lease_id) == 36 + 1 + 36
    assert 25 < (job.lease_expires_at - datetime.now(UTC)).total_seconds() <= 30.5

    c.jobs.heartbeat(job.id, {"worker_id": "w-1", "lease_id": job.lease_id, "lease_duration_secs": 120})
    renewed = c.jobs.get(job.id)
    assert renewed.status == "processing" and renewed.assigned_worker_id == "w-1"
    assert (renewed.lease_expires_at - datetime.now(UTC)).total_seconds() > 100

    c.workers.heartbeat("w-1", {"current_jobs": 1, "status": "healthy"})
    done = c.jobs.complete(job.id, {"worker_id": "w-1", "lease_id": job.lease_id, "result": {"sent": True}})
    assert done.success is True

    got = c.jobs.get(job.id)
    assert got.status == "completed" and got.result == {"sent": True} and got.completed_at is not None
    worker = c.workers.get("w-1")
    assert (worker.status, worker.current_jobs, worker.jobs_processed, worker.jobs_failed) == ("healthy", 1, 1, 0)
    assert worker.metadata == {"pid": 1} and worker.queue_names == ["emails"]
    listed = {w.id: w for w in c.workers.list()}
    assert listed["w-1"].jobs_processed == 1
    stats = c.jobs.get_stats()
    assert (stats.completed, stats.total) == (1, 1)

    c.workers.deregister("w-1")
    assert c.workers.get("w-1").status == "offline"


def test_fail_retries_with_backoff_then_dead_letters(dev_server):
    c = sdk(dev_server)
    jid = c.jobs.create({"queue_name": "q", "payload": {"x": 1}, "max_retries": 1}).id
    job = c.jobs.claim({"queue_name": "q", "worker_id": "w"}).jobs[0]
    t0 = time.time()
    assert c.jobs.fail(jid, {"worker_id": "w", "lease_id": job.lease_id, "error": "boom"}).success is True
    t1 = time.time()
    got = c.jobs.get(jid)
    assert (got.status, got.retry_count, got.last_error, got.assigned_worker_id) == ("pending", 1, "boom", None)
    # 2^0 s + 0-499 ms jitter from the moment the server handled the fail, which lies in [t0, t1]
    due = got.scheduled_at.timestamp()
    assert t0 + 1.0 - 0.001 <= due <= t1 + 1.5 + 0.001, (due - t0, due - t1)
    asked = time.time()
    jobs = c.jobs.claim({"queue_name": "q", "worker_id": "w"}).jobs
    if asked < due:
        assert jobs == []  # backoff not over yet

    job = wait_until(lambda: (c.jobs.claim({"queue_name": "q", "worker_id": "w"}).jobs or [None])[0],
                     timeout=5, what="retry to become claimable")
    assert job.retry_count == 1
    c.jobs.fail(jid, {"worker_id": "w", "lease_id": job.lease_id, "error": "boom again"})
    got = c.jobs.get(jid)
    assert (got.status, got.retry_count, got.last_error) == ("deadletter", 1, "boom again")
    assert [j.id for j in c.jobs.dlq.list({"queue_name": "q"})] == [jid]
    r = dev_server.request("GET", "/api/v1/workers")
    # the worker never registered, so no counters; a registered one counts every fail report
    assert r.status_code == 200 and r.json() == []


def test_fail_counts_on_registered_worker_and_dlq_retry(dev_server):
    c = sdk(dev_server)
    c.workers.register({"queue_name": "q", "hostname": "h", "worker_id": "wf"})
    jid = c.jobs.create({"queue_name": "q", "payload": 1, "max_retries": 0}).id
    job = c.jobs.claim({"queue_name": "q", "worker_id": "wf"}).jobs[0]
    c.jobs.fail(jid, {"worker_id": "wf", "lease_id": job.lease_id, "error": "fatal"})
    assert c.jobs.get(jid).status == "deadletter"
    assert c.workers.get("wf").jobs_failed == 1
    retried = c.jobs.dlq.retry({"queue_name": "q"})
    assert retried.retried_count == 1 and retried.retried_jobs == [jid]
    got = c.jobs.get(jid)
    assert (got.status, got.retry_count, got.last_error) == ("pending", 0, None)


def test_lease_fencing_outcomes_through_sdk(dev_server):
    c = sdk(dev_server)
    jid = c.jobs.create({"queue_name": "q", "payload": {}}).id
    job = c.jobs.claim({"queue_name": "q", "worker_id": "w1"}).jobs[0]
    with pytest.raises(NotFoundError):
        c.jobs.complete(jid, {"worker_id": "intruder", "lease_id": job.lease_id})
    with pytest.raises(ConflictError) as e:
        c.jobs.complete(jid, {"worker_id": "w1", "lease_id": "not-the-lease"})
    assert e.value.code == "LEASE_EXPIRED"
    with pytest.raises(ValidationError) as e:
        c.jobs.complete(jid, {"worker_id": "w1"})
    assert e.value.status_code == 422
    c.jobs.complete(jid, {"worker_id": "w1", "lease_id": job.lease_id})
    with pytest.raises(ConflictError) as e:
        c.jobs.complete(jid, {"worker_id": "w1", "lease_id": job.lease_id})
    assert e.value.code == "CONFLICT" and "already completed" in e.value.message
    assert c.jobs.get(jid).status == "completed"


def test_deregister_releases_jobs_without_retry_increment(dev_server):
    c = sdk(dev_server)
    ids = {c.jobs.create({"queue_name": "q", "payload": i}).id for i in range(3)}
    c.workers.register({"queue_name": "q", "hostname": "h", "worker_id": "wd"})
    jobs = c.jobs.claim({"queue_name": "q", "worker_id": "wd", "limit": 3}).jobs
    assert {j.id for j in jobs} == ids
    c.workers.deregister("wd")
    for j in jobs:
        got = c.jobs.get(j.id)
        assert (got.status, got.retry_count, got.assigned_worker_id, got.lease_id) == ("pending", 0, None, None)
    with pytest.raises(NotFoundError):
        c.jobs.complete(jobs[0].id, {"worker_id": "wd", "lease_id": jobs[0].lease_id})
    c.workers.deregister("wd")  # idempotent
    again = c.jobs.claim({"queue_name": "q", "worker_id": "other", "limit": 10}).jobs
    assert {j.id for j in again} == ids


def test_idempotency_and_register_upsert(dev_server):
    c = sdk(dev_server)
    a = c.jobs.create({"queue_name": "q", "payload": 1, "idempotency_key": "k1"})
    b = c.jobs.create({"queue_name": "q", "payload": 2, "idempotency_key": "k1"})
    assert a.created is True and b.created is False and a.id == b.id
    assert c.jobs.get(a.id).payload == 1
    c.workers.register({"queue_name": "q", "hostname": "h1", "worker_id": "stable"})
    c.workers.register({"queue_name": "q2", "hostname": "h2", "worker_id": "stable"})
    w = c.workers.get("stable")
    assert (w.queue_name, w.hostname, w.status) == ("q2", "h2", "healthy")
    assert [x.id for x in c.workers.list()] == ["stable"]


def test_worker_cap_quota_error_in_sdk(tmp_path):
    server = DevServer(str(tmp_path / "cap.db"), extra=["--max-workers", "1"]).start()
    try:
        c = sdk(server)
        c.workers.register({"queue_name": "q", "hostname": "h", "worker_id": "one"})
        c.workers.register({"queue_name": "q", "hostname": "h", "worker_id": "one"})  # not charged again
        with pytest.raises(QuotaExceededError):
            c.workers.register({"queue_name": "q", "hostname": "h", "worker_id": "two"})
        c.workers.deregister("one")
        c.workers.register({"queue_name": "q", "hostname": "h", "worker_id": "two"})
        assert {w.id: w.status for w in c.workers.list()} == {"one": "offline", "two": "healthy"}
    finally:
        server.stop()


def test_expired_leases_are_recovered_or_fenced(tmp_path):
    """One lease wait covers: sweep -> pending retry_count+1; sweep -> DLQ at max; no sweep -> 409 LEASE_EXPIRED."""
    fast = DevServer(str(tmp_path / "fast.db"), extra=["--lease-sweep-interval", "0.2"]).start()
    slow = DevServer(str(tmp_path / "slow.db"), extra=["--lease-sweep-interval", "600"]).start()
    try:
        cf, cs = sdk(fast), sdk(slow)
        retry_id = cf.jobs.create({"queue_name": "q", "payload": 1}).id
        dead_id = cf.jobs.create({"queue_name": "q", "payload": 2, "max_retries": 0}).id
        fenced_id = cs.jobs.create({"queue_name": "q", "payload": 3}).id
        held = {j.id: j for j in cf.jobs.claim({"queue_name": "q", "worker_id": "w", "limit": 2,
                                                "lease_duration_secs": 5}).jobs}
        fenced = cs.jobs.claim({"queue_name": "q", "worker_id": "w", "lease_duration_secs": 5}).jobs[0]
        assert set(held) == {retry_id, dead_id} and fenced.id == fenced_id

        wait_until(lambda: cf.jobs.get(retry_id).status == "pending", timeout=8, what="lease recovery")
        got = cf.jobs.get(retry_id)
        assert (got.retry_count, got.last_error, got.assigned_worker_id) == (1, "Lease expired (worker timeout)", None)
        dead = wait_until(lambda: (lambda j: j if j.status == "deadletter" else None)(cf.jobs.get(dead_id)), timeout=3)
        assert dead.last_error == "Max retries exceeded after lease expiration"
        assert [j.id for j in cf.jobs.dlq.list()] == [dead_id]
        with pytest.raises(NotFoundError):  # sweep cleared the assignee
            cf.jobs.complete(retry_id, {"worker_id": "w", "lease_id": held[retry_id].lease_id})

        with pytest.raises(ConflictError) as e:  # expired but not yet swept
            cs.jobs.complete(fenced_id, {"worker_id": "w", "lease_id": fenced.lease_id})
        assert e.value.code == "LEASE_EXPIRED" and e.value.message == "Job lease expired before completion"
        with pytest.raises(ConflictError):
            cs.jobs.heartbeat(fenced_id, {"worker_id": "w", "lease_id": fenced.lease_id})
        assert cs.jobs.get(fenced_id).status == "processing"
    finally:
        fast.stop()
        slow.stop()


@pytest.mark.timeout(90)
def test_official_sdk_worker_runs_unchanged_against_the_server(dev_server):
    """SpooledWorker, in a process of its own as an application runs it: register, claim, job heartbeats,
    complete, fail, worker heartbeat, and on SIGTERM its drain and deregister."""
    import os
    import signal
    import subprocess
    import sys

    from conftest import ROOT, OutputPump

    c = sdk(dev_server)
    ok = [c.jobs.create({"queue_name": "sdkw", "payload": {"n": i}}).id for i in range(6)]
    slow = c.jobs.create({"queue_name": "sdkw", "payload": {"sleep": 1.3}}).id
    bad = c.jobs.create({"queue_name": "sdkw", "payload": {"fail": True}, "max_retries": 0}).id
    env = {**os.environ, "SPOOLED_API_KEY": dev_server.api_key}
    proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "support" / "sdk_worker_proc.py"), dev_server.url],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = OutputPump(proc.stdout)

    def finished() -> bool:
        assert proc.poll() is None, "\n".join(out.lines)
        stats = c.jobs.get_stats()
        return stats.completed == 7 and stats.deadletter == 1

    try:
        try:
            wait_until(finished, timeout=45, interval=0.1, what="SDK worker to finish every job")
        except AssertionError as exc:
            jobs = [(j["id"][:8], j["status"], j["retry_count"], j.get("last_error"))
                    for j in dev_server.request("GET", "/api/v1/jobs?queue_name=sdkw&limit=100").json()]
            raise AssertionError(f"{exc}; the jobs: {jobs}; the worker said: {out.lines[-20:]}") from None
        assert dev_server.worker("sdk-worker")["status"] == "healthy"
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(20)
    assert code == 0, "\n".join(out.lines)
    assert not [line for line in out.lines if line.startswith("event: error")], out.lines
    assert [c.jobs.get(j).result for j in ok] == [{"double": i * 2} for i in range(6)]
    assert c.jobs.get(slow).status == "completed"
    dead = c.jobs.get(bad)
    assert (dead.status, dead.last_error) == ("deadletter", "handler exploded")
    w = c.workers.get("sdk-worker")
    assert (w.status, w.jobs_processed, w.jobs_failed, w.hostname) == ("offline", 7, 1, "sdk-host")
