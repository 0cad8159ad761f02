"""A reload under a steady stream of jobs, decided with a fake clock: the real ChildPool (fake children) and a
loop that keeps every child it may feed busy with equal-length jobs.

A reload replaces one child first; once a child started since is up, every child due for the reload takes no
more work and is replaced the moment its job ends. So every child is new within the first job's end, a
start-up, one job length and a start-up, and some child runs a job at every moment of it.
"""

from __future__ import annotations

import signal

from support.arbiter_rig import Rig as ArbiterRig
from support.pool_rig import T0
from support.pool_rig import Rig as PoolRig

JOB = 1.0  # seconds every job runs
START = 0.2  # seconds a child takes from spawn to ready
EXIT = 0.05  # seconds a child asked to stop takes to exit
STEP = 0.01


class Stream:
    """Drives the pool: ends jobs on time, exits stopped children, readies started ones, converges, then (as
    the arbiter's feed_children does) gives a job to every child `idle_children` offers. Records each job's
    start and whether it ran on a child started before the reload (the old code)."""

    def __init__(self, rig: PoolRig) -> None:
        self.rig = rig
        self.ends: dict[int, float] = {}  # id(child) -> when its job ends
        self.jobs: list[tuple[float, bool]] = []  # (started at, on an old child)
        self.old: set[int] = set()
        self.stop_seen: dict[int, float] = {}
        self.n = 0
        self.never_busy_after = None  # a time after the reload when no child ran a job

    def step(self, now: float, reload_at: float | None) -> None:
        pool = self.rig.pool
        for child in list(pool.children.values()):
            if child.busy and self.ends.get(id(child), 1e9) <= now:
                self.rig.done(child, child.job_id, now)
            if child.stopping:
                seen = self.stop_seen.setdefault(id(child), now)
                if now - seen >= EXIT:
                    self.rig.exit(child, 0, now)
            elif child.starting and now - child.started_at >= START:
                self.rig.ready(child, now)
        self.rig.converge(now)
        for child in pool.idle_children():
            self.n += 1
            self.rig.give(child, f"j{self.n}")
            self.ends[id(child)] = now + JOB
            self.jobs.append((now, id(child) in self.old))
        if reload_at is not None and now > reload_at + START and not any(c.busy for c in pool.children.values()):
            self.never_busy_after = self.never_busy_after or now


def run(monkeypatch, procs: int) -> tuple[Stream, float, float]:
    """Start `procs` children with staggered jobs, reload mid-stream; return the stream, the reload time and
    when every child was new."""
    rig = PoolRig(monkeypatch, procs=procs)
    rig.up(T0)
    stream = Stream(rig)
    now = T0
    for i, child in enumerate(rig.pool.children.values()):  # a steady stream: the jobs' ends spread over JOB
        stream.n += 1
        rig.give(child, f"j{stream.n}")
        stream.ends[id(child)] = now + JOB * (i + 1) / procs
    reload_at = T0 + 3.37
    while now < reload_at:
        now = round(now + STEP, 6)
        stream.step(now, None)
    stream.old = {id(c) for c in rig.pool.children.values()}
    rig.pool.reload()
    new_at = None
    while now < reload_at + 10 * JOB:
        now = round(now + STEP, 6)
        stream.step(now, reload_at)
        if new_at is None and rig.pool.all_up_since(reload_at):
            new_at = now
    assert new_at is not None, "the reload never reached every child"
    return stream, reload_at, new_at


def test_every_child_is_new_within_one_job_and_two_start_ups_of_the_first_jobs_end(monkeypatch):
    procs = 4
    stream, reload_at, new_at = run(monkeypatch, procs)
    first_end = JOB / procs  # the staggered stream: some job ends within this of any moment
    bound = first_end + JOB + 2 * (START + EXIT) + 3 * STEP
    assert new_at - reload_at <= bound, (new_at - reload_at, bound)
    # no old child starts a job once the first new child is up (after the first job's end and a start-up)
    proven_by = reload_at + first_end + START + EXIT + 2 * STEP
    late_old = [t for t, old in stream.jobs if old and t > proven_by]
    assert late_old == []
    assert stream.never_busy_after is None  # some child ran a job all along: the throughput never fell to zero
    assert any(not old for t, old in stream.jobs if t < new_at)  # new children took work during the reload


def test_one_child_reloads_within_its_job_and_a_start_up(monkeypatch):
    stream, reload_at, new_at = run(monkeypatch, 1)
    assert new_at - reload_at <= JOB + START + EXIT + 3 * STEP
    assert [t for t, old in stream.jobs if old and t > reload_at] == []  # its one job was its last


def test_new_code_that_does_not_start_leaves_the_other_children_working(monkeypatch):
    rig = PoolRig(monkeypatch, procs=3)
    a, b, c = rig.up(T0)
    rig.give(b, "b")
    rig.give(c, "c")
    rig.pool.reload()
    rig.converge(T0 + 1)
    assert a.stopping  # the first idle child goes first
    rig.exit(a, 0, T0 + 1)
    rig.converge(T0 + 1)
    new_a = rig.pool.children[a.slot]
    rig.exit(new_a, 3, T0 + 1.5)  # the new code fails to import
    rig.done(b, "b", T0 + 2)
    rig.converge(T0 + 2)
    assert not b.stopping and b in rig.pool.idle_children()  # the old code keeps running jobs
    rig.give(b, "b2")
    rig.done(c, "c", T0 + 2.5)
    rig.converge(T0 + 2.5)
    assert not c.stopping and rig.pool.idle_count() == 1


def test_a_due_child_idle_at_its_jobs_end_is_stopped_in_that_turn(monkeypatch):
    """The pool converges in the turn a due child answers, before any job could be handed to it."""
    rig = PoolRig(monkeypatch, procs=2)
    a, b = rig.up(T0)
    rig.give(a, "a")
    rig.give(b, "b")
    rig.pool.reload()
    rig.converge(T0 + 0.01)
    rig.done(a, "a", T0 + 0.02)
    rig.converge(T0 + 0.03)  # well within CONVERGE_EVERY of the last converge
    assert a.stopping and a.stop_reason == "reload"


def test_sighup_asks_back_the_jobs_sent_ahead(monkeypatch):
    """A job held by a busy child would start on the old code the moment the child's job ends: a reload asks
    for it back, so the child is idle then and replaced."""
    rig = ArbiterRig(monkeypatch)
    try:
        rig.running()
        rig.hold_job("a")
        child = rig.child_of("a")
        rig.arb.inflight.add({"id": "b", "lease_id": "L-b", "queue_name": "q"}, T0)
        entry = rig.arb.inflight.get("b")
        assert rig.arb.pool.hold_job(child, entry.job, rig.arb.claiming.start_by(entry))
        rig.arb.claiming.hold(entry, child)
        rig.signal(signal.SIGHUP, now=T0 + 1)
        assert child.chan.sent[-1] == {"t": "drop", "id": "b"}
    finally:
        rig.close()
