"""The wiring of a job's path: what each line that connects the parts does, held by a test that fails when
that line is broken (each found by changing it alone and running the suite). In process: the real arbiter
(tests/support/arbiter_rig.py) or the real jobs wing (tests/support/wing_rig.py), fake children and API."""

from __future__ import annotations

import signal
import time

import pytest
from support.arbiter_rig import T0, Rig
from support.parent_fakes import Hooks, Submit, fake_child, make_api, make_cfg
from support.wing_rig import WingRig

from supervisor.job import Job
from supervisor.parent.arbiter import Phase
from supervisor.parent.facts import GiveJob, JobDone, JobSettled
from supervisor.parent.jobs.settling import RETRY_JITTER

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def rig(monkeypatch):
    r = Rig(monkeypatch)
    yield r
    r.close()


def claimed(job_id: str, **fields) -> dict:
    return {"id": job_id, "lease_id": f"L-{job_id}", "queue_name": "q", **fields}


# ------------------------------------------------------------------ a failure's retry

@pytest.mark.parametrize(("retries", "due"), [(2, 2**2 + RETRY_JITTER), (3, None), (4, None)])
def test_a_failure_schedules_the_claim_of_its_retry_unless_it_was_the_last_try(retries, due):
    """The server dead-letters a job whose retries reach its limit: no retry comes, so none is claimed for."""
    submit, hooks = Submit(), Hooks()
    flow = WingRig(make_cfg(), make_api(), submit, hooks)
    flow.maybe_claim(T0, 1)
    _, followup, _ = submit.take("claim")
    flow.answer(followup, [claimed("a", retry_count=retries, max_retries=3)], None, T0)
    flow.start("a", fake_child(0), T0)
    pid = flow.inflight.get("a").pid
    assert flow.take(JobDone(0, "a", False, "boom"), T0 + 1) == []
    flow.send_reports(T0 + 1)
    _, report, _ = submit.take("fail")
    assert flow.answer(report, {}, None, T0 + 1.1) == [JobSettled(pid, "a", "failed", "boom")]  # for its child
    expected = [] if due is None else [pytest.approx(T0 + 1.1 + due)]
    assert flow.claiming.queues["q"].retries_due == expected


# ------------------------------------------------------------------ who takes the next job

def test_the_loop_gives_the_next_job_to_the_child_idle_longest(rig):
    """Through the arbiter's turn, not only the pool's order: slot 1 ended its job a second before slot 0,
    so the next job goes to slot 1 although slot 0 comes first in the pool."""
    rig.running()
    arb = rig.arb
    arb.feed_children(T0)
    rig.answer("claim", [claimed("a"), claimed("b")], now=T0)
    arb.feed_children(T0)
    first, second = (arb.pool.children[slot] for slot in (0, 1))
    assert (first.job_id, second.job_id) == ("a", "b")
    for child, job_id, at in ((second, "b", T0 + 1), (first, "a", T0 + 2)):
        child.chan.inbox.append({"t": "done", "id": job_id, "ok": True, "result": None})
        arb.route(arb.pool.read(child, at), at)
    arb.feed_children(T0 + 2)
    rig.answer("claim", [claimed("c")], now=T0 + 2)
    arb.feed_children(T0 + 2)
    assert (first.job_id, second.job_id) == (None, "c")


# ------------------------------------------------------------------ a drain that ends for good

def test_a_turn_of_a_drain_that_ends_for_good_restarts_no_child(rig, monkeypatch):
    """Draining with nothing left in flight, the turn tells the pool it stops for good: a slot left empty
    (its child died) is not filled again before the daemon exits."""
    rig.running(time.monotonic())
    arb = rig.arb
    spawned = len(rig.spawner.spawned)
    monkeypatch.setattr(arb.sel, "select", lambda timeout: [])
    rig.signal(signal.SIGTERM, now=time.monotonic())
    assert arb.phase is Phase.DRAINING and len(arb.jobs) == 0
    converged: list[bool] = []
    real = arb.pool.converge
    monkeypatch.setattr(arb.pool, "converge", lambda now, stopping_for_good: converged.append(
        stopping_for_good) or real(now, stopping_for_good))
    dead = arb.pool.children[1]
    dead.proc.exitcode = -9
    arb.reap(dead, time.monotonic())
    arb.turn()
    assert converged == [True] and len(rig.spawner.spawned) == spawned and 1 not in arb.pool.children


# ------------------------------------------------------------------ one turn, in its order

def test_one_turn_acts_in_the_documented_order(rig, monkeypatch):
    """One turn with a stop signal recorded, a claim's answer waiting and a child idle: the signal is acted
    on first (draining: no more claims), the answer is taken before the children are fed (its job starts on
    the idle child in this very turn, as a SIGTERM drain still starts reserved jobs), and the drain is
    checked after that (a job runs: not drained)."""
    now = time.monotonic()
    rig.running(now)
    arb = rig.arb
    arb.feed_children(now)
    _, claim, _ = rig.submit.take("claim")
    rig.submit.calls.clear()
    answers = [(claim, [claimed("a")], None)]
    monkeypatch.setattr(arb.loop_transport, "done", lambda: [answers.pop()] if answers else [])
    monkeypatch.setattr(arb.sel, "select", lambda timeout: [])
    arb.signals.put_nowait(signal.SIGTERM)
    arb.turn()
    assert arb.phase is Phase.DRAINING and arb.exit_code is None
    assert [c.job_id for c in arb.pool.children.values()].count("a") == 1  # given within the turn
    assert "claim" not in rig.submit.routes()  # draining: no claim sent
    assert arb.jobs.inflight.get("a").started_at is not None


# ------------------------------------------------------------------ a job that arrives without a claim

def test_a_job_pushed_to_a_child_without_a_claim_lives_as_a_claimed_one():
    """A stream may deliver a job for one child: it runs there at once, is renewed, reported and settled as
    any other, and no claim was spent on it."""
    submit, hooks = Submit(), Hooks()
    flow = WingRig(make_cfg(prefetch=0), make_api(), submit, hooks)
    job = Job.parse(claimed("p", timeout_seconds=5))
    (order,) = flow.out(flow.jobs.pushed(job, fake_child(1), T0))
    assert isinstance(order, GiveJob) and order.job is job and order.child.slot == 1
    entry = flow.inflight.get("p")
    assert entry.started_at == T0 and entry.timeout_at == T0 + 5 and flow.jobs.reserved() == 0
    assert flow.take(JobDone(1, "p", True, {"ok": 1}), T0 + 1) == []
    flow.send_reports(T0 + 1)
    _, report, _ = submit.take("complete")
    assert flow.answer(report, {}, None, T0 + 1.1) == [JobSettled(entry.pid, "p", "completed")]
    assert len(flow.jobs) == 0
    assert hooks.named("job_settled") == [("job_settled", "q", "completed", 1.0)]
    assert "claim" not in submit.routes()
