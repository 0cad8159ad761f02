"""A busy child holds its next job: it starts it the moment its own ends, without waiting for the parent.

End to end: the real dev server and the real daemon (in process, the child's job loop and the jobs wing's
bookkeeping: tests/unit/test_held_jobs_in_process.py). A job is *held* when the daemon has sent it to a busy
child (/status `held`); the reliable way to get one, as in the claim-ahead tests: a few short jobs teach the
daemon a short run time, then a long job runs on the only child and the next job is sent to it ahead.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from conftest import DevServer, wait_for_status, wait_until
from support.intake_helpers import bulk, daemons_fixture, log_records, servers_fixture, status  # noqa: F401 (fixtures)

from supervisor.parent.jobs.intake import HISTORY_MIN_JOBS

RECORD = "tests.support.handlers_intake:record"


def train(server: DevServer, queue: str, n: int = 4) -> None:
    """Short jobs first, so the daemon knows its round trip and a short run time."""
    ids = [server.enqueue(queue, {"do": "sleep", "secs": 0.05}) for _ in range(n)]
    wait_for_status(server, ids, timeout=20)


def events_of(d, msg: str, job_id: str) -> list[dict]:
    return [e for e in d.events(msg) if e.get("job_id") == job_id]


def hold_behind(server: DevServer, d, port: int, long_payload: dict, next_payload: dict, **fields) -> tuple[str, str]:
    """A long job on the only child and the next job held by that child; both ids."""
    long_id = server.enqueue(d.queue, long_payload)
    next_id = server.enqueue(d.queue, next_payload, **fields)
    # Both: a held count alone may still be an earlier job's (the long one, held for a moment behind the last
    # one before it) while the next job is not even claimed yet.
    wait_until(lambda: status(port)["held"] == 1 and server.job(next_id)["status"] == "processing", timeout=10,
               what="the next job held by the busy child")
    return long_id, next_id


@pytest.mark.timeout(90)
def test_a_held_jobs_timeout_counts_from_its_start_not_from_when_it_was_sent(dev_server, daemon_factory):
    d = daemon_factory("held-timeout", procs=1, args=["--health-port", "0", "--log-level", "DEBUG"])
    port = d.health_port
    d.wait_ready()
    train(dev_server, d.queue)
    long_id, next_id = hold_behind(dev_server, d, port, {"do": "sleep", "secs": 2.0}, {"do": "sleep", "secs": 0.3},
                                   timeout_seconds=1)
    jobs = wait_for_status(dev_server, [long_id, next_id], statuses=("completed", "failed", "deadletter"), timeout=30)
    assert [j["status"] for j in jobs] == ["completed", "completed"]  # held 2 s, ran 0.3 s of its 1 s
    assert jobs[1]["retry_count"] == 0 and not d.events("job timed out")
    assert d.wait_events("job held", job_id=next_id) and d.wait_events("job started", job_id=next_id)


@pytest.mark.timeout(90)
def test_a_held_job_whose_lease_is_lost_is_taken_back_and_never_started(dev_server, daemon_factory, tmp_path):
    """--lease 5: the held job's first renewal (after about 1.7 s) finds its lease gone (another worker
    holds the job now) while the long job still runs; the daemon asks the child for it back."""
    runs = tmp_path / "runs.txt"
    d = daemon_factory("held-lost", procs=1, handler=RECORD,
                       args=["--lease", "5", "--health-port", "0", "--log-level", "DEBUG"]).wait_ready()
    port = d.health_port
    train_ids = [dev_server.enqueue(d.queue, {"log": str(runs), "secs": 0.05}) for _ in range(4)]
    wait_for_status(dev_server, train_ids, timeout=20)
    long_id, next_id = hold_behind(dev_server, d, port, {"log": str(runs), "secs": 4.0},
                                   {"log": str(runs), "secs": 0.05})
    dev_server.steal_lease(next_id, "w-thief", secs=120)
    wait_until(lambda: events_of(d, "held job returned", next_id), timeout=10, what="the held job given back")
    assert events_of(d, "lease lost; stopping the job's work", next_id)
    assert wait_for_status(dev_server, [long_id], timeout=20)[0]["retry_count"] == 0
    wait_until(lambda: status(port)["inflight"] == 0, timeout=10, what="nothing left in flight")
    assert not events_of(d, "job started", next_id)
    assert next_id not in Path(runs).read_text()  # no child of ours ever ran it
    assert dev_server.job(next_id)["assigned_worker_id"] == "w-thief"


@pytest.mark.timeout(90)
def test_a_drain_takes_held_jobs_back_so_no_child_starts_one_on_its_own(dev_server, daemon_factory):
    """SIGTERM while a job is held: the daemon asks for it back at once; like a reserved job, it is then
    run by the drain, handed out by the parent once the long job has ended."""
    d = daemon_factory("held-drain", procs=1, args=["--health-port", "0", "--log-level", "DEBUG",
                                                    "--drain-timeout", "20"]).wait_ready()
    port = d.health_port
    train(dev_server, d.queue)
    long_id, next_id = hold_behind(dev_server, d, port, {"do": "sleep", "secs": 2.0}, {"do": "sleep", "secs": 0.05})
    d.signal(signal.SIGTERM)
    assert d.wait(30) == 0
    jobs = [dev_server.job(j) for j in (long_id, next_id)]
    assert [j["status"] for j in jobs] == ["completed", "completed"] and [j["retry_count"] for j in jobs] == [0, 0]
    order = [(r["msg"], r.get("job_id")) for r in log_records(d)
             if r.get("msg") in ("stop signal: draining", "held job returned", "job started")]
    drain = order.index(("stop signal: draining", None))
    returned = order.index(("held job returned", next_id))
    assert order.index(("job started", long_id)) < drain < returned < order.index(("job started", next_id))
    assert events_of(d, "held job returned", next_id)[0]["kept"] is True  # given back unstarted, to the reserve


def held_events(d) -> int:
    return sum(1 for r in log_records(d) if r.get("msg") == "job held")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("prefetch", ["0", "auto"])
def test_prefetch_0_holds_nothing_in_children(servers, daemons, prefetch):  # noqa: F811
    """20 ms API latency and 10 ms jobs: auto sends busy children their next job ahead; --prefetch 0
    claims only for idle children and never holds one."""
    server = servers("--fault-delay-ms", "20")
    queue = f"held-pf-{prefetch}"
    bulk(server, queue, [{"do": "sleep", "secs": 0.01}] * 60)
    d = daemons(server, queue, procs=2, args=["--prefetch", prefetch, "--log-level", "DEBUG", "--until-empty"])
    assert d.wait(60) == 0
    listed = server.request("GET", f"/api/v1/jobs?queue_name={queue}&limit=100").json()
    assert len(listed) == 60 and all(j["status"] == "completed" and j["retry_count"] == 0 for j in listed)
    if prefetch == "0":
        assert held_events(d) == 0
    else:
        assert held_events(d) > 10


@pytest.mark.timeout(120)
def test_with_2_s_jobs_no_child_holds_a_second_job(dev_server, daemon_factory):
    d = daemon_factory("held-long", procs=2, args=["--health-port", "0", "--log-level", "DEBUG"]).wait_ready()
    port = d.health_port
    ids = [dev_server.enqueue(d.queue, {"do": "sleep", "secs": 2.0}) for _ in range(6)]
    samples: list[int] = []

    def sample():
        snap = status(port)
        samples.append(snap["held"])
        return snap["jobs_settled"] >= 6

    wait_until(sample, timeout=60, interval=0.05, what="six 2 s jobs settled")
    assert all(j["retry_count"] == 0 for j in wait_for_status(dev_server, ids, timeout=5))
    assert len(samples) >= 50 and max(samples) == 0
    assert held_events(d) == 0


@pytest.mark.timeout(120)
def test_a_new_daemon_on_a_queue_with_short_history_holds_its_second_job_behind_its_first(dev_server, daemon_factory):
    queue = "held-history"
    history = [dev_server.enqueue(queue, {"do": "sleep", "secs": 0.02}) for _ in range(HISTORY_MIN_JOBS)]
    first = daemon_factory(queue, procs=2, worker_id="w-history-1", args=["--until-empty"])
    assert first.wait(60) == 0
    wait_for_status(dev_server, history, timeout=10)
    ids = [dev_server.enqueue(queue, {"do": "sleep", "secs": 0.2}) for _ in range(3)]
    d = daemon_factory(queue, procs=1, worker_id="w-history-2", args=["--log-level", "DEBUG"]).wait_ready()
    wait_for_status(dev_server, ids, timeout=30)
    for job_id in ids:  # the log is read on a thread: the server's record of a job can come before its line
        d.wait_events("job started", job_id=job_id)
    d.wait_events("run time seeded from the queue's statistics")
    assert [e["queue"] for e in d.events("run time seeded from the queue's statistics")] == [queue]
    started = [r["job_id"] for r in log_records(d) if r.get("msg") == "job started"]
    held = {r["job_id"] for r in log_records(d) if r.get("msg") == "job held"}
    trail = [(r["msg"], r.get("job_id")) for r in log_records(d) if r.get("msg", "").startswith(("job", "held", "run"))]
    assert sorted(started) == sorted(ids) and started[1] in held, trail  # held while the first still ran
