"""In-process tests of the arbiter's decisions: routing facts, the lifecycle (start, drain, second
signal, fatal errors), signal dispatch, and one job's path through the parts.

The arbiter is real (its selector, wake pipe and LoopHTTP pointed at 127.0.0.1:9), but nothing is
sent: the HTTP client's `submit` records, `deregister` records, children are fakes and the pool
watches them in a fake selector. The clock is plain floats.
"""

from __future__ import annotations

import os
import signal

import pytest
from support.arbiter_rig import T0, Rig
from support.parent_fakes import body, error, timeout_error

from supervisor import exitcodes
from supervisor.client import rest as api
from supervisor.parent.arbiter import HANDLED_SIGNALS, Arbiter, Phase
from supervisor.parent.facts import (
    ChildLost,
    ChildReady,
    ExitNow,
    Fatal,
    Followup,
    JobDone,
    JobReturned,
    JobStarted,
    RecallJob,
    Registered,
    StopJob,
)


@pytest.fixture
def rig(monkeypatch):
    r = Rig(monkeypatch)
    try:
        yield r
    finally:
        r.close()


# ------------------------------------------------------------------ routing

def test_route_hands_each_fact_to_the_part_that_acts_on_it(rig, monkeypatch):
    seen: list[tuple[str, object]] = []

    def record(name):
        return lambda fact, *rest: seen.append((name, fact)) or []

    monkeypatch.setattr(rig.arb.settling, "job_done", record("jobs.job_done"))
    monkeypatch.setattr(rig.arb.claiming, "job_started", record("jobs.job_started"))
    monkeypatch.setattr(rig.arb.claiming, "job_returned", record("jobs.job_returned"))
    monkeypatch.setattr(rig.arb.settling, "child_lost", record("jobs.child_lost"))
    monkeypatch.setattr(rig.arb.pool, "recall_job", lambda slot, job_id: seen.append(
        ("pool.recall_job", (slot, job_id))))
    monkeypatch.setattr(rig.arb.pool, "stop_job_child", lambda slot, job_id, reason, now: seen.append(
        ("pool.stop_job_child", (slot, job_id, reason))))
    monkeypatch.setattr(rig.arb, "child_ready", record("arbiter.child_ready"))
    monkeypatch.setattr(rig.arb, "fatal", record("arbiter.fatal"))
    monkeypatch.setattr(rig.arb, "exit_with", lambda code: seen.append(("arbiter.exit_with", code)))
    facts = [JobDone(0, "a", True, 1), ChildLost(1, "e", "crashed"), StopJob(2, "b", "timeout"), ChildReady(0, True),
             Fatal(4, "401"), ExitNow(5), JobStarted(0, "c", T0), JobReturned(1, "d"), RecallJob(2, "e")]
    rig.arb.route(facts, T0)
    assert seen == [("jobs.job_done", facts[0]), ("jobs.child_lost", facts[1]),
                    ("pool.stop_job_child", (2, "b", "timeout")), ("arbiter.child_ready", facts[3]),
                    ("arbiter.fatal", facts[4]), ("arbiter.exit_with", 5), ("jobs.job_started", facts[6]),
                    ("jobs.job_returned", facts[7]), ("pool.recall_job", (2, "e"))]


def test_registered_moves_starting_to_running_and_announces_ready_once_all_children_are_up(rig):
    rig.arb.pool.converge(T0, stopping_for_good=False)
    first, second = rig.spawner.spawned
    first.chan.inbox.append({"t": "ready"})
    rig.arb.route(rig.arb.pool.read(first, T0), T0)
    call, _, _ = rig.submit.calls[0]
    assert call.route == "register" and body(call)["max_concurrency"] == 2  # the first ready child registers
    rig.answer("register", {}, None, T0)
    assert rig.arb.phase is Phase.RUNNING and rig.hooks.named("ready") == []  # one child still starting
    second.chan.inbox.append({"t": "ready"})
    rig.arb.route(rig.arb.pool.read(second, T0 + 1), T0 + 1)
    assert rig.hooks.named("ready") == [("ready", "queue=q busy=0/2 inflight=0")]
    rig.arb.route([Registered()], T0 + 2)  # registering again later: no second READY=1
    assert len(rig.hooks.named("ready")) == 1 and rig.arb.phase is Phase.RUNNING
    assert rig.submit.calls == []  # a later child's first ready does not register again


def test_registered_while_draining_stays_draining(rig):
    rig.running()
    rig.signal(signal.SIGTERM)
    rig.arb.route([Registered()], T0)
    assert rig.arb.phase is Phase.DRAINING


# ------------------------------------------------------------------ one job through the parts

def test_a_job_goes_from_claim_to_child_to_report(rig):
    rig.running()
    rig.arb.feed_children(T0)
    call, _, first = rig.submit.calls[0]
    assert call.route == "claim" and body(call)["limit"] == 2 and first
    rig.answer("claim", [{"id": "a", "lease_id": "L-a", "queue_name": "q"}], now=T0 + 0.1)
    rig.arb.feed_children(T0 + 0.1)
    child = rig.child_of("a")
    assert child.chan.sent == [{"t": "job", "job": {"id": "a", "lease_id": "L-a", "queue_name": "q"}}]
    assert rig.arb.inflight.get("a").slot == child.slot and rig.submit.calls == []  # fewer than asked: back off
    child.chan.inbox.append({"t": "done", "id": "a", "ok": True, "result": {"v": 1}})
    rig.arb.route(rig.arb.pool.read(child, T0 + 1), T0 + 1)
    rig.arb.feed_children(T0 + 1)
    assert rig.submit.routes() == ["complete", "claim"]  # the outcome first, then a claim for the two idle children
    assert body(rig.submit.calls[1][0])["limit"] == 2
    rig.answer("claim", [], now=T0 + 1.05)
    rig.answer("complete", {}, now=T0 + 1.1)
    assert rig.arb.claiming.drained()
    assert rig.hooks.named("job_settled") == [("job_settled", "q", "completed", pytest.approx(0.9))]


def test_no_claim_before_registration(rig):
    rig.start()
    rig.arb.feed_children(T0)
    assert "claim" not in rig.submit.routes() and not rig.arb.may_claim()


def test_a_timeout_stops_the_child_through_the_pool(rig):
    rig.running()
    rig.hold_job("a", timeout_seconds=2)
    child = rig.child_of("a")
    rig.arb.route(rig.arb.settling.enforce(T0 + 2), T0 + 2)
    assert child.stopping and child.stop_reason == "timeout" and (child.slot, signal.SIGTERM) in rig.signals.sent
    assert "fail" in rig.submit.routes()


def test_a_crashed_child_fails_its_job_through_the_job_flow(rig):
    rig.running()
    rig.hold_job("a")
    child = rig.child_of("a")
    child.proc.exitcode = -signal.SIGKILL
    rig.arb.reap(child, T0 + 1)
    call, _, _ = rig.submit.take("fail")
    assert body(call)["error"].startswith("ChildProcessDied: the child process running this job")


def test_a_handler_that_cannot_be_imported_exits_3(rig):
    rig.arb.pool.converge(T0, stopping_for_good=False)
    child = rig.spawner.spawned[0]
    child.chan.inbox.append({"t": "boot_error", "error": "ImportError: no module"})
    child.proc.exitcode = 3
    rig.arb.reap(child, T0 + 1)
    assert rig.arb.exit_code == exitcodes.HANDLER_IMPORT and rig.arb.phase is Phase.STOPPED
    assert rig.deregistered == []  # never registered


def test_an_answer_whose_handling_raises_is_recovered(rig, monkeypatch):
    recovered = []

    def broken(result, err, now):
        raise RuntimeError("bug")

    good = Followup(lambda result, err, now: [ExitNow(7)], lambda now: [])
    bad = Followup(broken, lambda now: recovered.append(now) or [])
    monkeypatch.setattr(rig.arb.http, "done", lambda: [(bad, None, None), (good, None, None)])
    rig.arb.take_answers(T0)
    assert recovered == [T0] and rig.arb.exit_code == 7
    assert rig.arb.membership.api_ok_at == T0


def test_a_network_failure_is_not_an_api_answer(rig, monkeypatch):
    quiet = Followup(lambda result, err, now: [], lambda now: [])
    monkeypatch.setattr(rig.arb.http, "done", lambda: [(quiet, None, timeout_error())])
    rig.arb.take_answers(T0)
    assert rig.arb.membership.api_ok_at is None
    monkeypatch.setattr(rig.arb.http, "done", lambda: [(quiet, None, error(503))])
    rig.arb.take_answers(T0)
    assert rig.arb.membership.api_ok_at is None  # 5xx is Unavailable too
    monkeypatch.setattr(rig.arb.http, "done", lambda: [(quiet, None, error(404))])
    rig.arb.take_answers(T0 + 1)
    assert rig.arb.membership.api_ok_at == T0 + 1


def test_a_429_answer_teaches_the_pacer_and_holds_claims(rig, monkeypatch):
    rig.running()
    rig.arb.feed_children(T0)
    _, claim, _ = rig.submit.take("claim")
    limited = error(429, "RATE_LIMIT_EXCEEDED", retry_after=2)
    limited.body["limit"] = 10
    monkeypatch.setattr(rig.arb.http, "done", lambda: [(claim, None, limited)])
    rig.arb.take_answers(T0 + 0.1)
    assert rig.arb.pacer.rate == pytest.approx(9.5) and rig.arb.pacer.rate_limited_answers == 1
    assert not rig.arb.pacer.allows_claim(T0 + 2.0) and rig.arb.claiming.claim_not_before >= T0 + 2.1
    assert rig.arb.next_wakeup(T0 + 0.2) <= T0 + 1.2


def test_until_empty_drains_and_exits_0_once_every_queue_came_back_short(monkeypatch):
    rig = Rig(monkeypatch, until_empty=True)
    try:
        rig.running()
        rig.arb.feed_children(T0)
        rig.arb.check_drain(T0)
        assert rig.arb.phase is Phase.RUNNING  # a claim is on the wire
        rig.answer("claim", [], now=T0 + 0.1)
        rig.arb.check_drain(T0 + 0.1)
        assert rig.arb.exit_code == exitcodes.OK and rig.deregistered
    finally:
        rig.close()


def test_the_loop_never_sleeps_past_a_second_or_a_part_deadline(rig):
    rig.running()
    rig.hold_job("a")
    assert rig.arb.next_wakeup(T0) <= T0 + 0.05  # the next claim, after a short back-off
    rig.arb.pool.converge(T0, stopping_for_good=False)
    rig.arb.feed_children(T0 + 1)
    assert rig.submit.routes() == ["claim"]  # on the wire: its time is no deadline
    assert rig.arb.next_wakeup(T0 + 9.5) == T0 + 10  # the lease renewal, a third of 30 s
    assert rig.arb.next_wakeup(T0 + 1) == T0 + 2  # never more than a second


# ------------------------------------------------------------------ drain

def test_sigterm_drains_says_so_at_once_and_claims_no_more(rig):
    rig.running()
    rig.hold_job("a")
    rig.signal(signal.SIGTERM, now=T0 + 1)
    arb = rig.arb
    assert arb.phase is Phase.DRAINING and arb.drain_deadline == T0 + 26 and ("stopping",) in rig.hooks.events
    assert not arb.may_claim() and arb.membership.heartbeat_due(T0 + 1)
    arb.send_heartbeat(T0 + 1)
    call, _, _ = rig.submit.take("worker_heartbeat")
    assert body(call)["status"] == "draining" and body(call)["current_jobs"] == 1
    arb.settling.job_done(JobDone(rig.child_of("a").slot, "a", True, 1), T0 + 2)  # a child is free ...
    arb.feed_children(T0 + 2)
    assert "claim" not in rig.submit.routes()  # ... but no more claims
    arb.check_drain(T0 + 2)
    assert arb.exit_code is None  # the outcome is still on the wire
    rig.answer("complete", {}, now=T0 + 3)
    arb.check_drain(T0 + 3)
    assert arb.exit_code == exitcodes.OK and arb.phase is Phase.STOPPED
    assert rig.deregistered == [("w-1", 5.0)] and rig.shutdowns == 1


def test_drain_with_nothing_held_finishes_at_once(rig):
    rig.running()
    rig.signal(signal.SIGINT)
    assert rig.arb.phase is Phase.DRAINING
    rig.arb.check_drain(T0)
    assert rig.arb.exit_code == exitcodes.OK


def test_drain_timeout_finishes_with_jobs_still_held(rig):
    rig.running()
    rig.hold_job("a")
    rig.signal(signal.SIGTERM, now=T0)
    rig.arb.check_drain(T0 + 24.99)
    assert rig.arb.exit_code is None
    rig.arb.check_drain(T0 + 25)
    assert rig.arb.exit_code == exitcodes.OK and rig.deregistered and rig.shutdowns == 1


def test_a_second_stop_signal_kills_every_child_and_finishes(rig):
    rig.running()
    rig.hold_job("a")
    rig.signal(signal.SIGTERM, now=T0)
    rig.signal(signal.SIGINT, now=T0 + 1)
    slots = sorted(rig.arb.pool.children)
    assert sorted(s for s, sig in rig.signals.sent if sig == signal.SIGKILL) == slots
    assert rig.arb.exit_code == exitcodes.OK and rig.arb.phase is Phase.STOPPED and rig.deregistered


def test_stopping_for_good_once_drained_so_no_child_is_restarted(rig):
    rig.running()
    assert not rig.arb.stopping_for_good()
    rig.signal(signal.SIGTERM)
    assert rig.arb.stopping_for_good()


def test_draining_while_registration_is_pending_stops(rig):
    rig.start()
    rig.answer("register", None, error(503, job_route=False), now=T0)
    rig.arb.begin_drain(T0, exitcodes.OK)
    rig.arb.check_drain(T0)
    assert rig.arb.exit_code == exitcodes.OK and rig.deregistered == []


def test_deregister_is_tried_twice_when_the_api_is_unavailable(rig, monkeypatch):
    rig.running()
    tries = []

    def unavailable(worker_id, timeout=None):
        tries.append(worker_id)
        raise timeout_error()

    monkeypatch.setattr(rig.arb.api, "deregister", unavailable)
    rig.arb.exit_with(exitcodes.OK)
    assert tries == ["w-1", "w-1"] and not rig.arb.membership.registered


def test_deregister_refused_is_not_retried(rig, monkeypatch):
    rig.running()
    tries = []

    def refused(worker_id, timeout=None):
        tries.append(worker_id)
        raise error(404, job_route=False)

    monkeypatch.setattr(rig.arb.api, "deregister", refused)
    rig.arb.exit_with(exitcodes.OK)
    assert tries == ["w-1"] and rig.arb.exit_code == exitcodes.OK


def test_exit_with_sets_the_exit_code_once(rig):
    rig.arb.exit_with(3)
    rig.arb.exit_with(0)
    assert rig.arb.exit_code == 3 and rig.shutdowns == 1


# ------------------------------------------------------------------ fatal errors

def test_fatal_before_registration_exits_at_once(rig):
    rig.start()
    rig.answer("register", None, error(401, job_route=False), now=T0)
    assert rig.arb.exit_code == exitcodes.AUTH and rig.arb.phase is Phase.STOPPED and rig.deregistered == []


def test_fatal_while_running_drains_and_exits_with_its_code(rig):
    rig.running()
    rig.hold_job("a")
    rig.arb.feed_children(T0 + 1)
    rig.answer("claim", None, error(401), now=T0 + 1)
    assert rig.arb.phase is Phase.DRAINING and rig.arb.exit_code is None and not rig.arb.may_claim()
    rig.arb.check_drain(T0 + 1)
    assert rig.arb.exit_code is None  # job "a" is still held
    rig.arb.check_drain(T0 + 1 + rig.arb.cfg.drain_timeout)
    assert rig.arb.exit_code == exitcodes.AUTH and rig.deregistered


def test_fatal_while_draining_changes_the_exit_code(rig):
    rig.running()
    rig.hold_job("a")
    rig.signal(signal.SIGTERM, now=T0)
    rig.arb.route([Fatal(exitcodes.AUTH, "401")], T0 + 1)
    assert rig.arb.phase is Phase.DRAINING and rig.arb.drain_code == exitcodes.AUTH
    rig.signal(signal.SIGTERM, now=T0 + 2)
    assert rig.arb.exit_code == exitcodes.AUTH


def test_taken_over_drains_and_exits_6_without_deregistering(rig):
    rig.running()
    rig.hold_job("a")
    rig.arb.membership.heartbeat_soon(T0 + 1)
    rig.arb.send_heartbeat(T0 + 1)
    rig.answer("worker_heartbeat", None, None, now=T0 + 1)
    rig.arb.membership.check_row_if_due(T0 + 10)  # just before the next heartbeat
    own = rig.arb.membership.identity
    row = {"metadata": {"instance_id": "f" * 16, "started_at": "2999-01-01T00:00:00.000Z"}}
    assert own["instance_id"] != "f" * 16
    rig.answer("get_worker", row, now=T0 + 10)
    assert rig.arb.phase is Phase.DRAINING and not rig.arb.may_claim()
    assert not rig.arb.membership.heartbeat_due(T0 + 100)  # the row is the newer daemon's now
    rig.arb.check_drain(T0 + 10 + rig.arb.cfg.drain_timeout)
    assert rig.arb.exit_code == exitcodes.WORKER_ID_IN_USE == 6 and rig.deregistered == []


def test_registration_refused_exits_with_its_code(rig):
    rig.start()
    rig.answer("register", None, error(409, "CONFLICT", job_route=False), now=T0)
    assert rig.arb.exit_code == exitcodes.WORKER_ID_CONFLICT


# ------------------------------------------------------------------ signals

def test_every_handled_signal_has_its_handler():
    for sig in HANDLED_SIGNALS:
        assert callable(getattr(Arbiter, f"handle_{sig.name}"))


def test_sigttin_and_sigttou_resize_the_pool(rig):
    rig.running()
    rig.signal(signal.SIGTTIN, signal.SIGTTIN, signal.SIGTTOU)
    assert rig.arb.pool.target == 3
    rig.arb.pool.converge(T0 + 1, stopping_for_good=False)
    assert sorted(rig.arb.pool.children) == [0, 1, 2]
    rig.signal(signal.SIGTTOU, signal.SIGTTOU, signal.SIGTTOU)
    assert rig.arb.pool.target == 1


def test_sighup_replaces_every_child(rig):
    rig.running()
    rig.signal(signal.SIGHUP)
    assert rig.arb.reloads == 1
    assert {c.replace_reason for c in rig.arb.pool.children.values()} == {"reload"}


def test_handle_signals_dispatches_by_name_in_order(rig, monkeypatch):
    seen = []
    for name in ("SIGTERM", "SIGINT", "SIGHUP", "SIGTTIN", "SIGTTOU"):
        monkeypatch.setattr(rig.arb, f"handle_{name}", lambda now, name=name: seen.append((name, now)))
    rig.signal(signal.SIGHUP, signal.SIGTTIN, signal.SIGTERM, signal.SIGTTOU, signal.SIGINT, now=T0 + 3)
    assert seen == [("SIGHUP", T0 + 3), ("SIGTTIN", T0 + 3), ("SIGTERM", T0 + 3), ("SIGTTOU", T0 + 3),
                    ("SIGINT", T0 + 3)]
    assert rig.arb.signals.empty()


# ------------------------------------------------------------------ what it shows

def test_worker_status_and_snapshot(rig):
    rig.running()
    rig.hold_job("a")
    assert rig.arb.worker_status(T0) == "healthy"
    rig.arb.publish(T0)  # the loop publishes what /status shows
    snap = rig.arb.snapshot()
    assert snap["registered"] and snap["phase"] == "running" and snap["inflight"] == 1 and snap["procs"] == 2
    assert [c["state"] for c in snap["children"]].count("busy") == 1
    rig.signal(signal.SIGTERM)
    assert rig.arb.worker_status(T0) == "draining" and rig.arb.snapshot()["draining"]


def test_api_errors_used_here_are_the_typed_ones():
    assert isinstance(error(401, job_route=False), api.Unauthorized)
    assert isinstance(timeout_error(), api.Unavailable)


# ------------------------------------------------------------------ the loop's turn

def test_one_turn_acts_in_the_documented_order(rig, monkeypatch):
    order: list[str] = []

    def step(name, result=None):
        return lambda *args, **kwargs: order.append(name) or result

    arb = rig.arb
    monkeypatch.setattr(arb.sel, "select", step("select", []))
    for name in ("handle_signals", "take_answers", "send_heartbeat", "feed_children", "check_drain", "update_title"):
        monkeypatch.setattr(arb, name, step(name))
    monkeypatch.setattr(arb.http, "expire", step("http.expire"))
    monkeypatch.setattr(arb.membership, "register_if_due", step("membership.register_if_due"))
    monkeypatch.setattr(arb.settling, "enforce", step("jobs.enforce", []))
    monkeypatch.setattr(arb.pool, "enforce", step("pool.enforce", []))
    monkeypatch.setattr(arb.pool, "converge", step("pool.converge"))
    arb.turn()
    assert order == ["select", "handle_signals", "http.expire", "take_answers", "membership.register_if_due",
                     "jobs.enforce", "pool.enforce", "send_heartbeat", "pool.converge", "feed_children",
                     "check_drain", "update_title"]


def test_a_turn_that_sets_the_exit_code_touches_nothing_after(rig, monkeypatch):
    arb = rig.arb
    monkeypatch.setattr(arb.sel, "select", lambda timeout: [])
    monkeypatch.setattr(arb.settling, "enforce", lambda now: [ExitNow(exitcodes.CONFIG)])
    converged = []
    monkeypatch.setattr(arb.pool, "converge", lambda now, stopping_for_good: converged.append(now))
    arb.turn()
    assert arb.exit_code == exitcodes.CONFIG and converged == []


def test_events_go_to_their_owner(rig, monkeypatch):
    rig.running()
    arb = rig.arb
    child = next(iter(arb.pool.children.values()))
    seen = []
    monkeypatch.setattr(arb.pool, "flush", lambda c: seen.append(("flush", c.slot)))
    monkeypatch.setattr(arb.http, "on_ready", lambda conn, mask, now: seen.append(("http", conn)))
    os.write(arb.wake_w, b"xyz")
    arb.on_event(("wake", None), 1)
    with pytest.raises(BlockingIOError):
        os.read(arb.wake_r, 1)  # the wake-up pipe was emptied
    arb.on_event(("chan", child), 2)  # writable
    child.chan.inbox.append({"t": "done", "id": "nope", "ok": True})
    arb.on_event(("chan", child), 1)  # readable: read and routed
    assert child.jobs_done == 1
    arb.on_event(("http", "conn"), 1)
    child.proc.exitcode = -signal.SIGKILL
    arb.on_event(("sentinel", child), 1)
    assert seen == [("flush", child.slot), ("http", "conn")]
    assert arb.pool.children.get(child.slot) is not child  # reaped


def test_signal_handler_only_records(rig):
    rig.arb._on_signal(signal.SIGTERM, None)
    assert rig.arb.phase is Phase.STARTING and rig.arb.signals.get_nowait() == signal.SIGTERM


def test_the_title_is_refreshed_at_most_every_200_ms_and_only_when_it_changes(rig):
    rig.running()
    arb = rig.arb
    arb.update_title(T0)
    assert rig.hooks.events[-1] == ("status", "spooled-supervisor: parent queue=q busy=0/2 inflight=0")
    count = len(rig.hooks.events)
    arb.update_title(T0 + 0.1)
    arb.update_title(T0 + 0.3)  # unchanged: nothing sent
    assert len(rig.hooks.events) == count
    assert arb.next_wakeup(T0 + 0.1) <= T0 + 0.2
    rig.signal(signal.SIGTERM, now=T0 + 0.3)
    arb.update_title(T0 + 0.3)
    assert rig.hooks.events[-1] == ("status", "spooled-supervisor: parent queue=q busy=0/2 inflight=0 draining")


def test_answers_waiting_to_be_taken_mean_no_sleep(rig, monkeypatch):
    rig.running()
    rig.arb.pool.converge(T0, stopping_for_good=False)
    rig.arb.feed_children(T0)  # a claim on the wire: no claim deadline
    assert rig.arb.next_wakeup(T0 + 5) == T0 + 6  # nothing due: a second at most
    monkeypatch.setattr(rig.arb.http, "results", [("followup", None, None)])
    assert rig.arb.next_wakeup(T0 + 5) == T0 + 5


def test_nothing_happens_outside_its_time(rig):
    rig.running()
    rig.arb.check_drain(T0)  # not draining
    rig.arb.send_heartbeat(T0 + 1)  # not due
    rig.arb.begin_drain(T0, exitcodes.OK)
    rig.arb.begin_drain(T0 + 5, exitcodes.AUTH)  # once
    assert rig.arb.drain_code == exitcodes.OK and rig.arb.drain_deadline == T0 + 25
    assert rig.submit.routes() == [] and rig.arb.exit_code is None


# ------------------------------------------------------------ regressions found by these tests

def test_registering_again_after_a_resize_tells_the_current_pool_size(rig):
    rig.running()
    rig.signal(signal.SIGTTIN)
    assert rig.arb.pool.target == 3
    rig.arb.membership.heartbeat_soon(T0 + 1)
    rig.arb.send_heartbeat(T0 + 1)
    rig.answer("worker_heartbeat", None, error(404, "NOT_FOUND", job_route=False), now=T0 + 1)
    rig.arb.membership.register_if_due(T0 + 1, rig.arb.pool.target)  # what the next turn does
    call, _, _ = rig.submit.take("register")
    assert body(call)["max_concurrency"] == 3 and body(call)["metadata"]["procs"] == 3
