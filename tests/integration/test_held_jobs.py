"""A busy child holds its next job: it starts it the moment its own ends, without waiting for the parent.

In-process: the child's job loop (`serve`) on one end of a socketpair, the test as the parent on the
other. End to end: the real dev server and the real daemon. A job is *held* when the daemon has sent it
to a busy child (/status `held`); the reliable way to get one, as in the claim-ahead tests: a few short
jobs teach the daemon a short run time, then a long job runs on the only child and the next job is
sent to it ahead.
"""

from __future__ import annotations

import signal
import socket
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import DevServer, wait_for_status, wait_until
from support.flow_sim import make_cfg
from support.intake_helpers import bulk, daemons_fixture, log_records, servers_fixture, status  # noqa: F401 (fixtures)
from support.job_parts import JobParts

from supervisor.child import main as child_main
from supervisor.child import wire
from supervisor.client.rest import Secret, SpooledAPI
from supervisor.ops.nullhooks import NullHooks
from supervisor.parent.facts import ChildLost, JobDone, JobReturned, JobStarted, RecallJob, StopJob
from supervisor.parent.intake import (
    HISTORY_MIN_JOBS,
    HOLD_MAX_RUN,
    Ewma,
    Tail,
    history_run_time,
    hold_overdue,
    may_hold,
)

RECORD = "tests.support.handlers_intake:record"


# ------------------------------------------------------------------ the child's job loop, in process

class ChildLoop:
    """`serve` in a thread with a handler that runs until the test releases it (payload {"gate": name})."""

    def __init__(self, monkeypatch):
        monkeypatch.setattr(child_main, "set_title", lambda text: None)
        self.parent, theirs = socket.socketpair()
        self.parent.settimeout(10)
        self.gates: dict[str, threading.Event] = {}
        self.ran: list[str] = []
        self.thread = threading.Thread(target=child_main.serve, args=(theirs, self.handle, "t", "w", 2**20),
                                       daemon=True)
        self.thread.start()
        assert self.read()["t"] == "ready"

    def handle(self, ctx):
        self.ran.append(ctx.job_id)
        gate = (ctx.payload or {}).get("gate")
        if gate:
            assert self.gate(gate).wait(10)
        return {"id": ctx.job_id}

    def gate(self, name: str) -> threading.Event:
        return self.gates.setdefault(name, threading.Event())

    def send(self, msg: dict) -> None:
        wire.write_frame(self.parent, msg)

    def read(self) -> dict:
        return wire.read_frame(self.parent)

    def job(self, job_id: str, gate: str | None = None, **frame) -> None:
        self.send({"t": "job", "job": {"id": job_id, "payload": {"gate": gate} if gate else {}}, **frame})

    def wait_running(self, job_id: str) -> None:
        wait_until(lambda: job_id in self.ran, timeout=5, what=f"{job_id} running")

    def close(self) -> None:
        for gate in self.gates.values():
            gate.set()
        if self.thread.is_alive():
            self.send({"t": "stop"})
            self.thread.join(5)
        self.parent.close()


@pytest.fixture
def loop(monkeypatch):
    rig = ChildLoop(monkeypatch)
    yield rig
    rig.close()


@pytest.mark.timeout(30)
def test_the_childs_inbox_takes_what_has_arrived_without_waiting_and_reads_a_begun_frame_to_its_end():
    parent, child = socket.socketpair()
    inbox = wire.Inbox(child)
    assert inbox.arrived() == []  # nothing sent: no wait
    big = {"t": "job", "job": {"id": "big", "payload": "x" * (3 * 2**20)}}
    chan = wire.Channel(parent)
    chan.send({"t": "drop", "id": "a"})
    chan.send(big)  # more than the socket buffer: the rest goes out as the child reads
    writer = threading.Thread(target=lambda: [chan.flush() for _ in iter(lambda: chan.wants_write, False)])
    writer.start()
    assert inbox.arrived() == [{"t": "drop", "id": "a"}, big]
    writer.join(5)
    chan.send({"t": "stop"})
    assert inbox.arrived(wait=True) == [{"t": "stop"}]
    parent.close()
    with pytest.raises(EOFError):
        inbox.arrived(wait=True)


@pytest.mark.timeout(30)
def test_a_job_sent_while_one_runs_starts_when_it_ends_and_its_done_frame_names_it(loop):
    loop.job("a", gate="a")
    loop.wait_running("a")
    loop.job("b", gate="b", held=True)
    before = time.monotonic()
    loop.gate("a").set()
    done = loop.read()
    assert done["t"] == "done" and done["id"] == "a" and done["ok"] and done["next"] == "b"
    assert before <= done["started"] <= time.monotonic()
    loop.wait_running("b")  # started by the child itself: the parent said nothing more
    loop.gate("b").set()
    assert loop.read() == {"t": "done", "id": "b", "ok": True, "result": {"id": "b"}}
    assert loop.ran == ["a", "b"]


@pytest.mark.timeout(30)
def test_a_held_job_asked_back_before_it_starts_is_returned_and_never_runs(loop):
    loop.job("a", gate="a")
    loop.wait_running("a")
    loop.job("b", held=True)
    loop.send({"t": "drop", "id": "b"})
    loop.gate("a").set()
    assert loop.read() == {"t": "dropped", "id": "b"}
    done = loop.read()
    assert done["id"] == "a" and "next" not in done
    loop.job("c")  # an idle child runs what it is sent next, as before
    assert loop.read()["id"] == "c"
    assert loop.ran == ["a", "c"]


@pytest.mark.timeout(30)
def test_a_held_job_whose_start_by_has_passed_is_returned_and_never_runs(loop):
    """The parent may be unable to recall it (stopped longer than the lease): the child must not start
    work whose lease may already be gone."""
    loop.job("a", gate="a")
    loop.wait_running("a")
    start_by = time.monotonic() + 0.05
    loop.job("late", held=True, start_by=start_by)
    loop.job("fresh", held=True, start_by=time.monotonic() + 60)
    wait_until(lambda: time.monotonic() > start_by, timeout=1, what="start_by to pass")
    loop.gate("a").set()
    assert loop.read() == {"t": "dropped", "id": "late"}
    done = loop.read()
    assert done["id"] == "a" and done["next"] == "fresh"
    assert loop.read()["id"] == "fresh"
    assert loop.ran == ["a", "fresh"]


@pytest.mark.timeout(30)
def test_a_held_job_that_reaches_an_idle_child_is_started_with_a_started_frame(loop):
    """The child ended its job before the parent sent the next one ahead: it starts it at once, and a
    `started` frame tells the parent when (its timeout counts from then)."""
    loop.job("a")
    assert loop.read()["id"] == "a"
    before = time.monotonic()
    loop.job("b", held=True)
    started = loop.read()
    assert started["t"] == "started" and started["id"] == "b" and before <= started["at"] <= time.monotonic()
    assert loop.read()["id"] == "b"


@pytest.mark.timeout(30)
def test_stop_gives_back_every_held_job(loop):
    loop.job("a", gate="a")
    loop.wait_running("a")
    loop.job("b", held=True)
    loop.send({"t": "stop"})
    loop.gate("a").set()
    assert loop.read() == {"t": "dropped", "id": "b"}
    assert loop.read()["id"] == "a"
    loop.thread.join(5)
    assert not loop.thread.is_alive() and loop.ran == ["a"]


# ------------------------------------------------------------------ end to end

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
    assert events_of(d, "job held", next_id) and events_of(d, "job started", next_id)


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


# ------------------------------------------------------------------ the decisions, in process

def test_only_short_jobs_are_held_and_only_behind_a_job_about_to_end():
    assert may_hold(0.02, 0.01) and may_hold(HOLD_MAX_RUN, HOLD_MAX_RUN)
    assert not may_hold(None, 0.0)  # no run time known yet: a long job could wait behind another
    assert not may_hold(2.0, 0.0) and not may_hold(0.02, 1.0)


def test_no_job_is_held_behind_one_that_overruns_its_estimate():
    assert not hold_overdue(0.02, 0.02 + HOLD_MAX_RUN)
    assert hold_overdue(0.02, 0.03 + HOLD_MAX_RUN) and hold_overdue(None, 0.0)


def test_claims_read_the_tail_of_the_round_trips_not_their_mean():
    rtt = Tail(quantile=0.9, window=10)
    for sample in [0.02] * 8 + [0.05, 0.02]:
        rtt.add(sample)
    assert rtt.value == 0.05  # one slow answer in ten sets the horizon; a mean would say 0.023
    for _ in range(10):
        rtt.add(0.02)
    assert rtt.value == 0.02  # and it leaves the window
    for sample in [3.0, 2.5]:  # a stall: the host paused, or the API stuck for seconds
        rtt.add(sample)
    assert rtt.value == pytest.approx(0.06)  # held to 3 x the median: no claim for seconds of work


def test_a_queues_history_of_short_jobs_lets_a_new_daemon_reach_ahead_before_its_first_job_ends():
    """The queue's statistics (the mean processing time of its jobs) seed the run time of a daemon that has
    measured none: its second job is claimed and held while its first still runs, not claimed after it."""
    seed = Ewma()
    seed.seed(0.5)
    assert seed.value == 0.5 and seed.seeded
    seed.add(0.02)
    assert seed.value == 0.02  # the first measure replaces the prior outright
    stats = {"completed_jobs_24h": HISTORY_MIN_JOBS, "avg_processing_time_ms": 60.0}
    assert history_run_time(stats) == 0.06
    assert history_run_time({**stats, "completed_jobs_24h": HISTORY_MIN_JOBS - 1}) is None  # too little history
    assert history_run_time({**stats, "avg_processing_time_ms": 1500.0}) is None  # long jobs: never claimed ahead
    assert history_run_time({**stats, "avg_processing_time_ms": None}) is None


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
    assert [e["queue"] for e in d.events("run time seeded from the queue's statistics")] == [queue]
    started = [r["job_id"] for r in log_records(d) if r.get("msg") == "job started"]
    held = {r["job_id"] for r in log_records(d) if r.get("msg") == "job held"}
    trail = [(r["msg"], r.get("job_id")) for r in log_records(d) if r.get("msg", "").startswith(("job", "held", "run"))]
    assert sorted(started) == sorted(ids) and started[1] in held, trail  # held while the first still ran


# ------------------------------------------------------------------ the job flow's bookkeeping, in process

def flow_holding(run: float = 0.02, **cfg) -> tuple[JobParts, list, object]:
    """A JobParts with one job running on slot 0 (started at t=10) and one job held by that child."""
    sent: list = []
    flow = JobParts(make_cfg(procs=1, **cfg), SpooledAPI("http://127.0.0.1:9", Secret("k")),
                   lambda call, followup, first=False: sent.append((call, followup)), NullHooks())
    flow.claiming.claim_rtt.add(0.005)
    flow.claiming.queues["q"].run_time.add(run)
    child = SimpleNamespace(slot=0, pid=100)
    running = flow.inflight.add({"id": "run", "lease_id": "L1", "queue_name": "q"}, 10.0)
    flow.started(running, child, 10.0)
    flow.inflight.add({"id": "next", "lease_id": "L2", "queue_name": "q", "timeout_seconds": 1}, 10.0)
    return flow, sent, child


def test_a_held_jobs_timeout_counts_from_the_start_the_child_reports():
    flow, _, child = flow_holding()
    ((holder, entry),) = flow.claiming.holds([child], 10.001)
    flow.claiming.hold(entry, holder)
    assert flow.claiming.reserved() == 1 and flow.claiming.held() == 1 and flow.inflight.unassigned_count() == 0
    assert flow.enforce(11.5) == [] and entry.timeout_at is None  # held 1.5 s: its 1 s timeout has not begun
    flow.job_done(JobDone(0, "run", True, None), 12.0)
    assert flow.job_started(JobStarted(0, "next", 11.9), 12.0) == []
    assert entry.started_at == 11.9 and entry.timeout_at == 12.9 and flow.claiming.held() == 0
    assert flow.enforce(12.8) == []
    assert flow.enforce(12.9) == [StopJob(0, "next", "timeout")]


def test_a_held_job_whose_lease_is_lost_is_recalled_not_its_child_stopped():
    flow, _, child = flow_holding()
    ((holder, entry),) = flow.claiming.holds([child], 10.001)
    flow.claiming.hold(entry, holder)
    facts = flow.lease_lost(entry, "gone", 10.5)
    assert facts == [RecallJob(0, "next")] and flow.inflight.get("next") is None
    assert flow.job_returned(JobReturned(0, "next"), 10.6) is None  # given back unstarted: nothing more to do
    # had the child started it before reading the recall, it is stopped at once
    assert flow.job_started(JobStarted(0, "next", 10.6), 10.7) == [StopJob(0, "next", "lease_lost")]


def test_a_held_job_given_back_waits_for_a_child_again_and_a_dead_childs_job_still_fails():
    flow, _, child = flow_holding()
    ((holder, entry),) = flow.claiming.holds([child], 10.001)
    flow.claiming.hold(entry, holder)
    flow.job_returned(JobReturned(0, "next"), 10.5)  # the reap's fact comes before its ChildLost
    flow.child_lost(ChildLost(0, "ChildProcessDied: killed by SIGKILL", "crashed"), 10.5)
    assert [e.id for e in flow.inflight.unassigned()] == ["next"] and entry.slot is None
    assert flow.inflight.get("run").outcome.label == "crashed"


@pytest.mark.parametrize("case", ["prefetch 0", "long jobs", "no run time yet", "job overrunning"])
def test_nothing_is_held_for_prefetch_0_long_jobs_an_unknown_run_time_or_behind_an_overrun(case):
    cfg = {"prefetch": 0} if case == "prefetch 0" else {}
    flow, _, child = flow_holding(run=2.0 if case == "long jobs" else 0.02, **cfg)
    if case == "no run time yet":
        flow.claiming.queues["q"].run_time.value = None
    now = 10.0 + 0.03 + HOLD_MAX_RUN if case == "job overrunning" else 10.001
    assert flow.claiming.holds([child], now) == []
    assert flow_holding()[0].claiming.holds([child], 10.001)  # the same flow with short jobs holds one
