"""The API asks this worker to drain (a heartbeat answer's `should_drain`): the arbiter routes the fact to a
drain that exits 0, and every other fact a part returns reaches the part that acts on it (an unknown one
is logged as the bug it is)."""

from __future__ import annotations

import logging

import pytest
from support.arbiter_rig import T0, Rig
from support.parent_fakes import body

from supervisor import exitcodes
from supervisor.parent.arbiter import Phase
from supervisor.parent.facts import DrainAsked, JobStarted, StopJob


@pytest.fixture
def rig(monkeypatch):
    r = Rig(monkeypatch)
    try:
        yield r
    finally:
        r.close()


def test_should_drain_in_a_heartbeat_answer_drains_and_exits_0(rig):
    rig.running()
    rig.arb.membership.heartbeat_soon(T0 + 1)
    rig.arb.send_heartbeat(T0 + 1)
    rig.answer("worker_heartbeat", {"acknowledged": True, "should_drain": True}, now=T0 + 1.1)
    assert rig.arb.phase is Phase.DRAINING and rig.arb.drain_code == exitcodes.OK
    assert rig.arb.drain_deadline == T0 + 1.1 + rig.arb.cfg.drain_timeout and not rig.arb.may_claim()
    assert ("stopping",) in rig.hooks.events
    rig.arb.send_heartbeat(T0 + 1.2)  # the API hears `draining` at once
    assert body(rig.submit.take("worker_heartbeat")[0])["status"] == "draining"
    rig.arb.check_drain(T0 + 1.3)
    assert rig.arb.exit_code == exitcodes.OK and rig.deregistered  # nothing held: drained at once


def test_drain_asked_while_draining_for_a_stop_keeps_the_first_drain(rig):
    rig.running()
    rig.arb.begin_drain(T0, exitcodes.AUTH)
    rig.arb.route([DrainAsked()], T0 + 1)
    assert rig.arb.drain_code == exitcodes.AUTH and rig.arb.drain_deadline == T0 + rig.arb.cfg.drain_timeout


def test_a_fact_a_handler_returns_is_routed_in_turn(rig, monkeypatch):
    rig.running()
    stopped: list[tuple] = []
    monkeypatch.setattr(rig.arb.pool, "stop_job_child", lambda *args: stopped.append(args))
    assert rig.arb.jobs.claiming.job_started(JobStarted(0, "gone", T0), T0) == [StopJob(0, "gone", "lease_lost")]
    rig.arb.route([JobStarted(0, "gone", T0)], T0)  # a child started a job no longer held for it
    assert stopped == [(0, "gone", "lease_lost", T0)]  # the StopJob job_started returned reached the pool


def test_a_fact_no_part_acts_on_is_logged_as_an_error(rig, caplog):
    rig.running()
    with caplog.at_level(logging.ERROR, logger="supervisor"):
        rig.arb.route(["not a fact"], T0)  # type: ignore[list-item]
    assert any("a fact no part acts on" in r.getMessage() and r.levelno == logging.ERROR for r in caplog.records)
    assert rig.arb.phase is Phase.RUNNING and rig.arb.exit_code is None
