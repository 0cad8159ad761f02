"""Claim just ahead of need, end to end: the real dev server and the real daemon.

A job is *reserved* when the daemon holds it (the server says `processing`, assigned to the worker)
and no child runs it yet. The reliable way to get one: a few short jobs teach the daemon a short run
time, then a long job runs on the only child; the daemon takes it for a job about to end and claims
one more for that child, which then waits behind the long job.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from conftest import Daemon, DevServer, parse_ts, wait_for_status, wait_until
from support.intake_helpers import bulk, daemons_fixture, log_records, servers_fixture, status  # noqa: F401 (fixtures)

RECORD = "tests.support.handlers_intake:record"


def train(server: DevServer, queue: str, n: int = 4) -> list[str]:
    """Short jobs first, so the daemon knows its round trip and a short run time."""
    ids = [server.enqueue(queue, {"do": "sleep", "secs": 0.05}) for _ in range(n)]
    wait_for_status(server, ids, timeout=20)
    return ids


def held_by(server: DevServer, worker_id: str, *job_ids: str) -> list[dict] | None:
    jobs = [server.job(j) for j in job_ids]
    ok = all(j["status"] == "processing" and j.get("assigned_worker_id") == worker_id for j in jobs)
    return jobs if ok else None


def reserve_behind_a_long_job(server: DevServer, daemon: Daemon, port: int, long_payload: dict,
                              waiting_payload: dict, **waiting_fields) -> tuple[str, str, dict]:
    """Enqueue a long job and one more; return both ids and the server's record of the second once the
    daemon holds it in reserve (the one child busy with the long job)."""
    long_id = server.enqueue(daemon.queue, long_payload)
    wait_id = server.enqueue(daemon.queue, waiting_payload, **waiting_fields)
    wait_until(lambda: status(port)["reserved"] == 1, timeout=10, what="a job held in reserve")
    jobs = wait_until(lambda: held_by(server, daemon.worker_id, long_id, wait_id), timeout=10,
                      what="both jobs processing for this worker")
    return long_id, wait_id, jobs[1]


# ------------------------------------------------------------------ held like running jobs

def test_a_reserved_job_keeps_its_lease_and_its_timeout_counts_from_its_start(dev_server, daemon_factory):
    """--lease 5 (renewed every 1.7 s) and a 6 s job ahead: the reserved job waits longer than its
    lease, so only renewals keep it; it has timeout_seconds 1, far less than it waits."""
    d = daemon_factory("ca-wait", procs=1, args=["--lease", "5", "--health-port", "0"]).wait_ready()
    port = d.health_port
    train(dev_server, "ca-wait")
    long_id, wait_id, first = reserve_behind_a_long_job(dev_server, d, port, {"do": "sleep", "secs": 6},
                                                        {"do": "sleep", "secs": 0.1}, timeout_seconds=1)
    leased_until = parse_ts(first["lease_expires_at"])

    def renewed():
        j = dev_server.job(wait_id)
        return j if j["status"] == "processing" and parse_ts(j["lease_expires_at"]) > leased_until + 1 else None

    later = wait_until(renewed, timeout=6, interval=0.2, what="the reserved job's lease to be renewed")
    assert later["assigned_worker_id"] == d.worker_id
    assert dev_server.job(long_id)["status"] == "processing"  # renewed while still waiting behind it
    assert status(port)["reserved"] == 1

    jobs = wait_for_status(dev_server, [long_id, wait_id], statuses=("completed", "failed", "deadletter"),
                           timeout=20)
    assert [j["status"] for j in jobs] == ["completed", "completed"]
    assert [j["retry_count"] for j in jobs] == [0, 0]  # first delivery: the lease never lapsed
    assert jobs[1]["result"]["slept"] == 0.1
    assert not d.events("job timed out") and not d.events("lease lost; stopping the job's work")


@pytest.mark.parametrize("drain", ["drain finishes", "drain times out"])
def test_sigterm_with_a_reserved_job_leaves_every_job_completed_or_queued_and_none_processing(
        dev_server, daemon_factory, drain):
    finishes = drain == "drain finishes"
    d = daemon_factory(f"ca-term-{int(finishes)}", procs=1, args=[
        "--health-port", "0", "--drain-timeout", "15" if finishes else "1"]).wait_ready()
    port = d.health_port
    trained = train(dev_server, d.queue)
    long_job = {"do": "sleep", "secs": 1.5 if finishes else 60}
    long_id, wait_id, _ = reserve_behind_a_long_job(dev_server, d, port, long_job, {"do": "sleep", "secs": 0.05})
    d.signal(signal.SIGTERM)
    assert d.wait(30) == 0
    jobs = [dev_server.job(j) for j in (*trained, long_id, wait_id)]
    assert not [j for j in jobs if j["status"] == "processing"]
    assert all(j["retry_count"] == 0 for j in jobs)
    if finishes:  # the reserved job was started during the drain
        assert all(j["status"] == "completed" for j in jobs)
    else:  # the long job was stopped at the drain timeout; the deregister handed both back
        assert [j["status"] for j in jobs[-2:]] == ["pending", "pending"]
        assert d.events("deregistered")


# ------------------------------------------------------------------ --prefetch 0

def claimed_and_started(d: Daemon) -> tuple[int, int, int]:
    """From the daemon's DEBUG log, in event order: (claims that arrived while jobs of an earlier claim were
    still waiting for a child, the largest claim, jobs claimed)."""
    waiting: set[str] = set()
    carried = largest = batch = claimed = 0
    previous = None
    for rec in log_records(d):
        msg = rec.get("msg")
        if msg == "job claimed":
            claimed += 1
            if previous != "job claimed":  # a new claim's answer
                carried += bool(waiting)
                batch = 0
            batch += 1
            largest = max(largest, batch)
            waiting.add(rec["job_id"])
        elif msg == "job started":
            waiting.discard(rec["job_id"])
        else:
            continue
        previous = msg
    return carried, largest, claimed


@pytest.mark.parametrize("prefetch", ["0", "auto"])
def test_prefetch_0_never_holds_a_job_beyond_the_idle_children(servers, daemons, prefetch):
    """20 ms API latency and 10 ms jobs: auto claims ahead (a claim lands while the reserve still holds
    jobs); --prefetch 0 only claims for idle children, which start every job of a claim at once."""
    server = servers("--fault-delay-ms", "20")
    queue = f"ca-pf-{prefetch}"
    bulk(server, queue, [{"do": "sleep", "secs": 0.01}] * 60)
    d = daemons(server, queue, procs=2, args=["--prefetch", prefetch, "--log-level", "DEBUG", "--until-empty"])
    assert d.wait(60) == 0
    carried, largest, claimed = claimed_and_started(d)
    assert claimed == 60
    listed = server.request("GET", f"/api/v1/jobs?queue_name={queue}&limit=100").json()
    assert len(listed) == 60 and all(j["status"] == "completed" and j["retry_count"] == 0 for j in listed)
    if prefetch == "0":
        assert carried == 0 and largest <= 2
    else:
        assert carried > 0 and largest > 2


# ------------------------------------------------------------------ a lost lease on a reserved job

def test_a_reserved_job_whose_lease_ran_out_never_reaches_a_child(dev_server, daemon_factory, tmp_path):
    """The daemon is stopped (SIGSTOP: a VM pause, a swap storm) longer than the lease while one job waits
    in reserve (held by the busy child, or in the parent); the server re-queues it. Neither the child,
    whose job ends after the lease did, nor the daemon on waking may start the stale copy: that
    delivery would run work another worker may already hold."""
    runs = tmp_path / "runs.txt"
    d = daemon_factory("ca-lost", procs=1, handler=RECORD, args=["--lease", "5", "--health-port", "0"])
    port = d.health_port
    d.wait_ready()
    train_ids = [dev_server.enqueue("ca-lost", {"log": str(runs), "secs": 0.05}) for _ in range(4)]
    wait_for_status(dev_server, train_ids, timeout=20)
    long_id, wait_id, _ = reserve_behind_a_long_job(dev_server, d, port, {"log": str(runs), "secs": 7.0},
                                                    {"log": str(runs), "secs": 0.05})
    os.kill(d.proc.pid, signal.SIGSTOP)
    try:
        requeued = wait_for_status(dev_server, [long_id, wait_id], statuses=("pending",), timeout=15)
        assert [j["retry_count"] for j in requeued] == [1, 1]  # the server swept both leases
        r = dev_server.request("POST", "/api/v1/queues/ca-lost/pause", json={})
        assert r.status_code == 200, r.text  # nothing can be claimed again meanwhile
    finally:
        os.kill(d.proc.pid, signal.SIGCONT)
    # the long job's lease is found lost (its renewal refused, or its late result): the daemon has handled it
    lost = ("complete refused: this worker no longer holds the job; outcome dropped",
            "lease lost; stopping the job's work")
    wait_until(lambda: [e for msg in lost for e in d.events(msg) if e.get("job_id") == long_id], timeout=10,
               what="the long job's lost lease noticed")
    assert dev_server.request("POST", "/api/v1/queues/ca-lost/resume", json={}).status_code == 200
    # a resumed queue announces nothing on the events stream: the idle daemon finds it at its safety poll
    # (15 s), then runs the 7 s job again
    jobs = wait_for_status(dev_server, [long_id, wait_id], timeout=45)
    assert [j["retry_count"] for j in jobs] == [1, 1]
    lines = Path(runs).read_text().split()
    deliveries = list(zip(lines[::2], lines[1::2], strict=True))
    assert (wait_id, "0") not in deliveries  # the stale copy never ran
    assert d.wait_events("lease lost; stopping the job's work", job_id=wait_id)
    assert deliveries.count((wait_id, "1")) == 1 and (long_id, "0") in deliveries


# ------------------------------------------------------------------ long jobs: nothing reserved

def test_jobs_far_longer_than_the_round_trip_are_not_reserved(dev_server, daemon_factory):
    """1 s jobs against a loopback API (about a millisecond): a job is claimed for a busy child only
    within a few milliseconds of its end, so a fleet shares long jobs as evenly as without claim-ahead."""
    d = daemon_factory("ca-long", procs=2, args=["--health-port", "0"]).wait_ready()
    port = d.health_port
    ids = [dev_server.enqueue("ca-long", {"do": "sleep", "secs": 1.0}) for _ in range(6)]
    samples: list[int] = []

    def sample():
        snap = status(port)
        samples.append(snap["reserved"])
        return snap["jobs_settled"] >= 6

    wait_until(sample, timeout=30, interval=0.03, what="six 1 s jobs settled")
    jobs = wait_for_status(dev_server, ids, timeout=5)
    assert all(j["retry_count"] == 0 for j in jobs)
    assert len(samples) >= 10  # about 100 on a quiet host (one per 30 ms); a busy one answers /status slower
    assert max(samples) <= 2
    assert sum(1 for s in samples if s) <= 0.1 * len(samples)
    waits = status(port)["reserve_wait_ms"]
    assert waits["p99"] < 500  # held behind a running job it would wait most of a second
    assert d.proc.poll() is None
