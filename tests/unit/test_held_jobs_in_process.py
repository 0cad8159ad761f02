"""A busy child holds its next job, in process: the child's job loop (`serve`) on one end of a socketpair
with the test as the parent on the other; the decisions of what is held; and the jobs wing's bookkeeping
of a held job, driven through its turn and its facts. The real dev server and daemon:
tests/integration/test_held_jobs.py."""

from __future__ import annotations

import socket
import threading
import time

import pytest
from conftest import wait_until
from support.flow_sim import make_cfg
from support.parent_fakes import fake_child
from support.wing_rig import WingRig

from supervisor.child import main as child_main
from supervisor.child import wire
from supervisor.client.rest import Secret, SpooledAPI
from supervisor.job import Job
from supervisor.ops.nullhooks import NullHooks
from supervisor.parent.facts import ChildLost, HoldJob, JobDone, JobReturned, JobStarted, RecallJob, StopJob
from supervisor.parent.jobs.claiming import HELD_LEASE_MARGIN
from supervisor.parent.jobs.intake import (
    HISTORY_MIN_JOBS,
    HOLD_MAX_RUN,
    Ewma,
    Tail,
    history_run_time,
    hold_overdue,
    may_hold,
)

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

    def send(self, frame: wire.Down) -> None:
        wire.write_frame(self.parent, frame)

    def read(self) -> dict:
        """The child's next frame, as the JSON object it is on the wire."""
        frame = wire.read_frame(self.parent)
        assert frame is not None
        return frame.wire()

    def job(self, job_id: str, gate: str | None = None, held: bool = False, start_by: float | None = None) -> None:
        raw = {"id": job_id, "lease_id": f"L-{job_id}", "payload": {"gate": gate} if gate else {}}
        self.send(wire.JobFrame(Job.parse(raw), held, start_by))

    def wait_running(self, job_id: str) -> None:
        wait_until(lambda: job_id in self.ran, timeout=5, what=f"{job_id} running")

    def close(self) -> None:
        for gate in self.gates.values():
            gate.set()
        if self.thread.is_alive():
            self.send(wire.Stop())
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
    big = wire.JobFrame(Job.parse({"id": "big", "lease_id": "L", "payload": "x" * (3 * 2**20)}))
    chan = wire.Channel(parent)
    chan.send(wire.Drop("a"))
    chan.send(big)  # more than the socket buffer: the rest goes out as the child reads
    writer = threading.Thread(target=lambda: [chan.flush() for _ in iter(lambda: chan.wants_write, False)])
    writer.start()
    assert inbox.arrived() == [wire.Drop("a"), big]
    writer.join(5)
    chan.send(wire.Stop())
    assert inbox.arrived(wait=True) == [wire.Stop()]
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
    loop.send(wire.Drop("b"))
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
    loop.send(wire.Stop())
    loop.gate("a").set()
    assert loop.read() == {"t": "dropped", "id": "b"}
    assert loop.read()["id"] == "a"
    loop.thread.join(5)
    assert not loop.thread.is_alive() and loop.ran == ["a"]


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


# ------------------------------------------------------------------ the jobs wing's bookkeeping, through its turn

def flow_holding(run: float = 0.02, **cfg) -> tuple[WingRig, list, object]:
    """The jobs wing with one job running on slot 0 (started at t=10) and one job waiting, not yet held."""
    sent: list = []
    flow = WingRig(make_cfg(procs=1, **cfg), SpooledAPI("http://127.0.0.1:9", Secret("k")),
                   lambda call, followup, first=False: sent.append((call, followup)), NullHooks())
    flow.claiming.claim_rtt.add(0.005)
    flow.claiming.queues["q"].run_time.add(run)
    child = fake_child(0, pid=100)
    running = flow.add({"id": "run", "lease_id": "L1", "queue_name": "q"}, 10.0)
    flow.started(running, child, 10.0)
    flow.add({"id": "next", "lease_id": "L2", "queue_name": "q", "timeout_seconds": 1}, 10.0)
    return flow, sent, child


def send_ahead(flow: WingRig, child, now: float = 10.001):
    """A turn with `child` busy: the wing sends it the waiting job ahead; return that job's entry."""
    (order,) = flow.turn(now, busy=[child], may_claim=False)
    assert isinstance(order, HoldJob) and order.child is child
    return flow.inflight.get(order.job.id)


def test_a_held_jobs_timeout_counts_from_the_start_the_child_reports():
    flow, _, child = flow_holding()
    entry = send_ahead(flow, child)
    assert flow.claiming.reserved() == 1 and flow.inflight.held_count() == 1 and flow.inflight.unassigned_count() == 0
    assert flow.enforce(11.5) == [] and entry.timeout_at is None  # held 1.5 s: its 1 s timeout has not begun
    assert flow.take(JobDone(0, "run", True, None), 12.0) == []
    assert flow.take(JobStarted(0, "next", 11.9), 12.0) == []
    assert entry.started_at == 11.9 and entry.timeout_at == 12.9 and flow.inflight.held_count() == 0
    assert flow.enforce(12.8) == []
    assert flow.enforce(12.9) == [StopJob(0, "next", "timeout")]


def test_a_held_job_whose_lease_is_lost_is_recalled_not_its_child_stopped():
    flow, _, child = flow_holding()
    entry = send_ahead(flow, child)
    facts = flow.lease_lost(entry, "gone", 10.5)
    assert facts == [RecallJob(0, "next")] and flow.inflight.get("next") is None
    assert flow.take(JobReturned(0, "next"), 10.6) == []  # given back unstarted: nothing more to do
    # had the child started it before reading the recall, it is stopped at once
    assert flow.take(JobStarted(0, "next", 10.6), 10.7) == [StopJob(0, "next", "lease_lost")]


def test_a_held_job_given_back_waits_for_a_child_again_and_a_dead_childs_job_still_fails():
    flow, _, child = flow_holding()
    entry = send_ahead(flow, child)
    assert flow.take(JobReturned(0, "next"), 10.5) == []  # the reap's fact comes before its ChildLost
    assert flow.take(ChildLost(0, "ChildProcessDied: killed by SIGKILL", "crashed"), 10.5) == []
    assert [e.id for e in flow.inflight.unassigned()] == ["next"] and entry.slot is None
    assert flow.inflight.get("run").outcome.label == "crashed"


@pytest.mark.parametrize("case", ["prefetch 0", "long jobs", "no run time yet", "job overrunning"])
def test_nothing_is_held_for_prefetch_0_long_jobs_an_unknown_run_time_or_behind_an_overrun(case):
    cfg = {"prefetch": 0} if case == "prefetch 0" else {}
    flow, _, child = flow_holding(run=2.0 if case == "long jobs" else 0.02, **cfg)
    if case == "no run time yet":
        flow.claiming.queues["q"].run_time.value = None
    now = 10.0 + 0.03 + HOLD_MAX_RUN if case == "job overrunning" else 10.001
    assert flow.turn(now, busy=[child], may_claim=False) == []
    assert flow_holding()[0].turn(10.001, busy=[child], may_claim=False)  # the same wing with short jobs holds one


@pytest.mark.parametrize(("lease", "start_by"), [(30, 40.0 - HELD_LEASE_MARGIN), (5, 15.0 - 0.5)])
def test_a_job_sent_ahead_must_start_a_margin_before_its_lease_ends(lease, start_by):
    """The margin is HELD_LEASE_MARGIN, or a tenth of a short lease: the child gives the job back past it."""
    flow, _, child = flow_holding(lease=lease)
    (order,) = flow.turn(10.001, busy=[child], may_claim=False)
    assert isinstance(order, HoldJob) and order.job.id == "next"
    assert order.start_by == start_by  # the lease (claimed at 10) ends at 10 + lease
