"""A drain that begins while a claim is on the wire: it waits for the claim's answer (deregistering first would
leave the jobs that answer brings leased to a worker that is gone), and what that answer brings is handled as
the drain says: after a drain request, never started and handed back by the deregister; after a stop
signal, started while the drain allows."""

from __future__ import annotations

import signal

import pytest
from support.arbiter_rig import T0, Rig

from supervisor import exitcodes
from supervisor.parent.arbiter import Phase

JOBS = [{"id": "a", "lease_id": "L-a", "queue_name": "q"}, {"id": "b", "lease_id": "L-b", "queue_name": "q"}]


@pytest.fixture
def rig(monkeypatch):
    r = Rig(monkeypatch)
    try:
        yield r
    finally:
        r.close()


def claim_on_the_wire(rig: Rig) -> None:
    rig.running()
    rig.arb.feed_children(T0)
    assert rig.submit.routes() == ["claim"] and rig.arb.jobs.claiming.claim.busy


def test_a_drain_request_waits_for_the_claim_and_starts_none_of_what_it_brings(rig):
    claim_on_the_wire(rig)
    rig.arb.handle_DRAIN(T0 + 0.01)
    rig.arb.check_drain(T0 + 0.02)
    assert rig.arb.phase is Phase.DRAINING and rig.arb.exit_code is None  # the claim is still out
    assert rig.deregistered == []
    rig.answer("claim", JOBS, now=T0 + 0.05)
    rig.arb.feed_children(T0 + 0.05)
    assert all(not c.chan.sent for c in rig.arb.pool.children.values())  # no child was given a job
    assert rig.arb.jobs.claiming.reserved() == 2 and "claim" not in rig.submit.routes()
    rig.arb.check_drain(T0 + 0.06)
    assert rig.arb.exit_code == exitcodes.OK and rig.deregistered == [("w-1", 5.0)]  # the deregister hands them back
    assert "fail" not in rig.submit.routes()  # handed back unaltered: no retry spent


def test_a_stop_signal_waits_for_the_claim_and_runs_what_it_brings_while_the_drain_allows(rig):
    claim_on_the_wire(rig)
    rig.signal(signal.SIGTERM, now=T0 + 0.01)
    rig.arb.check_drain(T0 + 0.02)
    assert rig.arb.exit_code is None and rig.deregistered == []
    rig.answer("claim", JOBS, now=T0 + 0.05)
    rig.arb.feed_children(T0 + 0.05)
    assert sorted(c.job_id for c in rig.arb.pool.children.values()) == ["a", "b"]
    assert "claim" not in rig.submit.routes()
    rig.arb.check_drain(T0 + 0.06)
    assert rig.arb.exit_code is None  # the jobs run; the drain ends when they are settled (or at its deadline)
