"""Pacing under a request budget, decided with a fake clock: the real Pacer alone, the real
jobs wing behind it (a 429's Retry-After against a due renewal), and both in the deterministic loop of
tests/support/flow_sim.py against a fake API with the dev server's token bucket. Last, the Pacer alone
again from its first call at T1: priorities, tokens, and what a 429 teaches it.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from support.flow_sim import Sim, make_cfg
from support.parent_fakes import fake_child
from support.wing_rig import WingRig

from supervisor.client import rest as api
from supervisor.client.rest import Secret, SpooledAPI
from supervisor.ops.nullhooks import NullHooks
from supervisor.parent.pacer import CREEP_BY, CREEP_EVERY, PLAN_MARGIN, SHARED_BACKOFF, Pacer

T0 = 500.0


class Wire:
    """The HTTP client's submit, recording what the pacer let through and when."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, object]] = []

    def __call__(self, call, followup, first) -> None:
        self.sent.append((call.route, followup))

    def routes(self) -> list[str]:
        return [r for r, _ in self.sent]


def call(route: str, tag: str = "") -> SimpleNamespace:
    return SimpleNamespace(route=route, tag=tag)


def empty_bucket(rate: float) -> tuple[Pacer, Wire]:
    """A pacer at `rate` whose tokens are all spent at T0."""
    wire = Wire()
    pacer = Pacer(wire, max_rps=rate)
    while pacer._tokens(T0) >= 1.0:
        pacer.submit(call("register"), None, False, T0)
    wire.sent.clear()
    return pacer, wire


# ------------------------------------------------------------------ priorities

def test_calls_without_a_token_go_settlements_first_then_renewals_then_worker_calls_then_claims():
    pacer, wire = empty_bucket(10.0)
    for route in ("claim", "get_worker", "deregister", "worker_heartbeat", "job_heartbeat", "register", "fail",
                  "complete"):
        pacer.submit(call(route), route, False, T0)
    assert wire.sent == []
    for k in range(1, 9):
        pacer.release(T0 + k * 0.1)
    assert wire.routes() == ["fail", "complete", "job_heartbeat", "deregister", "worker_heartbeat", "register",
                             "claim", "get_worker"]


def test_calls_of_one_priority_keep_their_order():
    pacer, wire = empty_bucket(10.0)
    for n in range(5):
        pacer.submit(call("complete"), f"c{n}", False, T0)
    for k in range(1, 6):
        pacer.release(T0 + k * 0.1)
    assert [f for _, f in wire.sent] == ["c0", "c1", "c2", "c3", "c4"]


def test_a_new_call_never_jumps_ahead_of_queued_ones_even_when_a_token_came_in():
    pacer, wire = empty_bucket(10.0)
    pacer.submit(call("job_heartbeat"), "renew", False, T0)
    pacer.submit(call("complete"), "late", False, T0 + 0.15)  # a token is there by now, but the renewal waits
    assert wire.sent == []
    pacer.release(T0 + 0.15)
    assert [f for _, f in wire.sent] == ["late"]  # release hands the token by priority
    pacer.release(T0 + 0.25)
    assert [f for _, f in wire.sent] == ["late", "renew"]


# ------------------------------------------------------------------ claims need a spare token

def test_a_claim_is_allowed_only_with_a_token_left_for_the_settlement_behind_it():
    pacer, wire = empty_bucket(10.0)
    assert not pacer.allows_claim(T0)
    assert not pacer.allows_claim(T0 + 0.15)  # 1.5 tokens: a complete could go, a claim may not
    assert pacer.allows_claim(T0 + 0.21)
    pacer.submit(call("complete"), None, False, T0 + 0.21)
    assert wire.routes() == ["complete"] and not pacer.allows_claim(T0 + 0.21)


def test_no_claim_while_a_higher_priority_call_waits_for_a_token():
    pacer, wire = empty_bucket(10.0)
    pacer.submit(call("job_heartbeat"), None, False, T0)
    assert not pacer.allows_claim(T0 + 0.5)  # tokens came in, but the renewal is still queued
    pacer.release(T0 + 0.5)
    assert wire.routes() == ["job_heartbeat"] and pacer.allows_claim(T0 + 0.5)


def test_without_a_rate_nothing_waits_and_claims_are_free():
    wire = Wire()
    pacer = Pacer(wire)
    for n in range(50):
        pacer.submit(call("claim" if n % 2 else "complete"), None, False, T0)
    assert len(wire.sent) == 50 and pacer.allows_claim(T0)
    assert pacer.next_deadline(T0) is None and pacer.claim_ready_at(T0) <= T0


# ------------------------------------------------------------------ Retry-After

def test_retry_after_holds_claims_for_its_length_while_renewals_and_completes_still_go():
    pacer, wire = empty_bucket(10.0)
    pacer.rate_limited(T0, retry_after=3, limit=None)
    assert pacer.rate == 10.0  # the operator's --max-rps is never learned over
    for t in (T0 + 0.5, T0 + 1.5, T0 + 2.99):
        assert not pacer.allows_claim(t)
    pacer.submit(call("job_heartbeat"), None, False, T0 + 0.5)
    pacer.submit(call("complete"), None, False, T0 + 0.6)
    assert wire.routes() == ["job_heartbeat", "complete"]
    assert pacer.allows_claim(T0 + 3.0)
    assert pacer.next_deadline(T0 + 1.0) == pytest.approx(T0 + 3.0)  # the loop wakes when the hold ends


def test_a_longer_retry_after_wins_over_a_shorter_later_one():
    pacer = Pacer(Wire())
    pacer.rate_limited(T0, retry_after=5, limit=None)
    pacer.rate_limited(T0 + 1, retry_after=1, limit=None)
    assert not pacer.allows_claim(T0 + 4.9) and pacer.allows_claim(T0 + 5.0)


# ------------------------------------------------------------------ learning the rate

def test_a_429_with_the_plans_limit_paces_just_under_it_with_an_empty_bucket():
    wire = Wire()
    pacer = Pacer(wire)
    assert pacer.rate is None
    pacer.rate_limited(T0, retry_after=1, limit=25)
    assert pacer.rate == pytest.approx(PLAN_MARGIN * 25)
    assert not pacer.allows_claim(T0 + 0.5)
    pacer.submit(call("complete"), None, False, T0)
    assert wire.sent == []  # no token: the server's bucket is empty too
    pacer.release(T0 + 1.0 / pacer.rate)
    assert wire.routes() == ["complete"]


def test_a_429_while_pacing_at_the_plans_rate_means_a_shared_plan_then_the_rate_creeps_back():
    pacer = Pacer(Wire())
    pacer.rate_limited(T0, 1, limit=10)
    plan = PLAN_MARGIN * 10
    pacer.rate_limited(T0 + 5, 1, limit=10)  # seconds later, at the plan's rate: another client spends it
    assert pacer.rate == pytest.approx(plan * SHARED_BACKOFF)
    pacer.release(T0 + 5 + CREEP_EVERY - 0.01)
    assert pacer.rate == pytest.approx(plan * SHARED_BACKOFF)  # not before CREEP_EVERY without a 429
    pacer.release(T0 + 5 + CREEP_EVERY)
    assert pacer.rate == pytest.approx(plan * SHARED_BACKOFF * (1 + CREEP_BY))
    pacer.release(T0 + 5 + CREEP_EVERY + 0.5)
    assert pacer.rate == pytest.approx(plan * SHARED_BACKOFF * (1 + CREEP_BY))  # at most once per CREEP_EVERY
    for k in range(2, 40):
        pacer.release(T0 + 5 + k * CREEP_EVERY)
    assert pacer.rate == pytest.approx(plan)  # back to the plan, never above it


def test_answers_to_requests_sent_before_pacing_began_are_not_taken_for_a_shared_plan():
    """With completes, renewals and a claim on the wire together (calls overlap), one burst past the
    plan's bucket comes back as several 429s at once. Only the first says something new; the others
    answer requests sent before the daemon paced at all, so they must not cut the rate again."""
    pacer = Pacer(Wire())
    for _ in range(4):  # four requests that were in flight together, answered in the same turn
        pacer.rate_limited(T0, 1, limit=25)
    assert pacer.rate == pytest.approx(PLAN_MARGIN * 25)


def test_without_a_limit_the_rate_is_learned_from_what_was_being_sent():
    wire = Wire()
    pacer = Pacer(wire)
    for n in range(30):  # 15 requests/s over the last two seconds
        pacer.submit(call("complete"), None, False, T0 + n / 15)
    pacer.rate_limited(T0 + 29 / 15, None, None)
    assert pacer.rate == pytest.approx(0.9 * 15, rel=0.1)


# ------------------------------------------------------------------ no busy wake-up

def test_when_tokens_are_short_every_wake_up_the_pacer_offers_is_in_the_future():
    pacer, wire = empty_bucket(4.0)
    pacer.submit(call("complete"), None, False, T0)
    assert pacer.next_deadline(T0) == pytest.approx(T0 + 0.25)  # the next token, not now
    assert pacer.claim_ready_at(T0) == pytest.approx(T0 + 0.5)  # two tokens for a claim
    pacer.release(T0 + 0.25)
    assert wire.routes() == ["complete"]
    assert pacer.next_deadline(T0 + 0.25) is None  # nothing waits: nothing to wake for
    assert pacer.claim_ready_at(T0 + 0.25) == pytest.approx(T0 + 0.75)


def make_flow(**cfg) -> tuple[WingRig, Pacer, Wire, dict]:
    """The real jobs wing behind a real Pacer on a fake clock (`clock["now"]`), as the arbiter wires them."""
    wire = Wire()
    pacer = Pacer(wire, make_cfg(**cfg).max_rps)
    clock = {"now": T0}
    flow = WingRig(make_cfg(**cfg), SpooledAPI("http://127.0.0.1:9", Secret("k")),
                   lambda c, f, first=False: pacer.submit(c, f, first, clock["now"]), NullHooks())
    return flow, pacer, wire, clock


def test_the_claim_wake_up_waits_for_the_budget_instead_of_spinning():
    flow, pacer, wire, clock = make_flow(procs=2, max_rps=2.0)
    pacer.submit(call("complete"), None, False, T0)  # one token left of two
    assert not pacer.allows_claim(T0)
    gate = pacer.claim_ready_at(T0)
    assert gate == pytest.approx(T0 + 0.5)
    assert flow.next_deadline(T0, True, 2, claim_gate=gate) == pytest.approx(gate)  # idle children: at the gate
    flow.maybe_claim(T0 + 0.2, 2, 2, True, pacer.allows_claim(T0 + 0.2), pacer.rate)
    assert "claim" not in wire.routes()
    clock["now"] = gate
    flow.turn(gate, idle=[fake_child(100 + n) for n in range(2)], procs=2, may_send_ahead=False, budget=pacer)
    assert wire.routes()[-1] == "claim"


# ------------------------------------------------------------------ the jobs wing: Retry-After vs a due renewal

def rate_limited_error(retry_after: int, limit: float) -> api.ApiError:
    body = {"code": "RATE_LIMIT_EXCEEDED", "message": "Rate limit exceeded", "limit": limit,
            "retry_after_secs": retry_after, "remaining": 0}
    return api.classify(429, body, {"Retry-After": str(retry_after)})


def test_a_429_on_a_claim_holds_claims_for_retry_after_but_a_due_renewal_goes_at_once():
    flow, pacer, wire, clock = make_flow(procs=2, lease=30)
    entry = flow.add({"id": "a", "lease_id": "La", "queue_name": "q"}, T0)  # renewal due at T0 + 10
    flow.started(entry, fake_child(0), T0)
    at = T0 + 9.5
    clock["now"] = at
    flow.turn(at, idle=[fake_child(100 + n) for n in range(1)], procs=2, may_send_ahead=False, budget=pacer)
    assert wire.routes() == ["queue_stats", "claim"]  # no run time known yet: the queue's statistics first
    followup = wire.sent.pop()[1]
    wire.sent.pop()
    error = rate_limited_error(3, 5)
    pacer.rate_limited(at, error.retry_after, error.body["limit"])  # what take_answers does first
    flow.answer(followup, None, error, at)
    for t in (at + 0.5, at + 1.0, at + 2.9):  # the child stays idle: still no claim until Retry-After ends
        clock["now"] = t
        pacer.release(t)
        flow.enforce(t)
        flow.turn(t, idle=[fake_child(100 + n) for n in range(1)], procs=2, may_send_ahead=False, budget=pacer)
        assert "claim" not in wire.routes(), t
        if t >= T0 + 10:
            assert wire.routes() == ["job_heartbeat"]  # the renewal went when due, within the hold
    clock["now"] = at + 3.0
    pacer.release(at + 3.0)
    flow.maybe_claim(at + 3.0, 1, 2, True, pacer.allows_claim(at + 3.0), pacer.rate)
    assert wire.routes() == ["job_heartbeat", "claim"]


def test_a_renewal_due_the_moment_a_429_empties_the_bucket_waits_one_token_not_the_retry_after():
    flow, pacer, wire, clock = make_flow(procs=1, lease=30, prefetch=0)  # (no queue statistics asked)
    entry = flow.add({"id": "a", "lease_id": "La", "queue_name": "q"}, T0)
    flow.started(entry, fake_child(0), T0)
    due = T0 + 10
    pacer.rate_limited(due, 5, limit=5)  # a 429 with Retry-After 5: claims held until due + 5
    clock["now"] = due
    flow.enforce(due)
    assert wire.sent == []  # no token at all right now
    wake = pacer.next_deadline(due)
    assert due < wake <= due + 1 / pacer.rate + 1e-9
    clock["now"] = wake
    pacer.release(wake)
    assert wire.routes() == ["job_heartbeat"]
    assert not pacer.allows_claim(wake)


# ------------------------------------------------------------------ both, against the dev server's bucket

@pytest.mark.parametrize("plan", [5, 25])
def test_sim_under_a_plan_limit_429s_are_rare_and_requests_per_job_near_one(plan):
    sim = Sim(procs=2, jobs=8 * plan, run_time=lambda i: 0.02, rtt=0.02, server_rps=plan).run()
    assert len(sim.completed) == 8 * plan
    assert len(sim.sent) / sim.jobs < 1.25  # batched claims: about 1 + 1/9 requests per job
    refused = sim.refused()
    first = min((s.at for s in refused), default=None)
    # the first collision teaches the rate: what was sent at that moment (with claims of 100 ms of starts,
    # both children's completes) may all be refused; after it 429s stay rare
    assert len([s for s in refused if s.at != first]) <= 0.02 * len(sim.sent)
    assert len(refused) <= 0.02 * len(sim.sent) + 2
    assert sim.jobs / (sim.now - 1000.0) >= 0.8 * plan


def test_sim_learned_pacing_holds_the_plans_rate_after_one_burst():
    sim = Sim(procs=2, jobs=200, run_time=lambda i: 0.02, rtt=0.02, server_rps=25).run()
    assert sim.pacer.rate == pytest.approx(PLAN_MARGIN * 25, rel=0.01)


def test_sim_max_rps_holds_every_window_under_the_cap():
    sim = Sim(procs=2, jobs=60, run_time=lambda i: 0.01, rtt=0.01, max_rps=10.0).run()
    assert len(sim.completed) == 60
    assert sim.most_sent_in(1.0) <= 10 + 10  # the rate plus one bucket
    assert sim.most_sent_in(4.0) <= 4 * 10 + 10
    span = sim.sent[-1].at - sim.sent[0].at
    assert len(sim.sent) <= 10 * span + 10
    assert not sim.refused()


def test_sim_under_a_tight_budget_leases_are_renewed_in_time_and_claims_wait():
    """2 requests/s, 3 s jobs on a 5 s lease (renewed every 1.7 s): completes and renewals take the
    budget first; no lease ever gets within a second of running out."""
    sim = Sim(procs=2, jobs=6, run_time=lambda i: 3.0, rtt=0.02, max_rps=2.0, lease=5).run()
    assert len(sim.completed) == 6
    for job in sim.completed:
        renewals = [s.at for s in sim.sent if s.route == "job_heartbeat" and s.job_id == job]
        held_from = sim.claimed_at[job] - sim.rtt
        held_to = next(s.at for s in sim.sent if s.route == "complete" and s.job_id == job)
        marks = [held_from, *renewals, held_to]
        assert all(b - a < 5 - 1 for a, b in zip(marks, marks[1:], strict=False)), (job, marks)


# ------------------------------------------------------------------ the pacer alone, from T1

T1 = 100.0

class Sent:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def __call__(self, call, followup, first) -> None:
        self.calls.append((call, followup, first))

    def routes(self) -> list[str]:
        return [c.route for c, _, _ in self.calls]


class Call:
    def __init__(self, route: str) -> None:
        self.route = route


def test_without_a_rate_every_call_goes_at_once():
    sent = Sent()
    pacer = Pacer(sent)
    for route in ("claim", "complete", "job_heartbeat"):
        pacer.submit(Call(route), None, route == "claim", T1)
    assert sent.routes() == ["claim", "complete", "job_heartbeat"] and sent.calls[0][2] is True
    assert pacer.allows_claim(T1) and pacer.next_deadline(T1) is None and pacer.sent == 3


def test_a_fixed_rate_queues_calls_by_priority_and_releases_them_as_tokens_come():
    sent = Sent()
    pacer = Pacer(sent, max_rps=2.0)
    for route in ("register", "worker_heartbeat"):  # the burst of two
        pacer.submit(Call(route), None, False, T1)
    for route in ("claim", "job_heartbeat", "complete", "fail"):
        pacer.submit(Call(route), None, False, T1)
    assert sent.routes() == ["register", "worker_heartbeat"]
    assert not pacer.allows_claim(T1)
    assert pacer.next_deadline(T1) == pytest.approx(T1 + 0.5)
    pacer.release(T1 + 0.49)
    assert len(sent.calls) == 2
    for at in (0.5, 1.0, 1.5, 2.0):
        pacer.release(T1 + at)
    assert sent.routes()[2:] == ["complete", "fail", "job_heartbeat", "claim"]  # settlements first, claims last


def test_a_claim_needs_a_token_to_spare_for_the_settlement_behind_it():
    pacer = Pacer(Sent(), max_rps=2.0)
    assert pacer.allows_claim(T1)
    pacer.submit(Call("complete"), None, False, T1)
    assert not pacer.allows_claim(T1)  # one token left
    assert pacer.claim_ready_at(T1) == pytest.approx(T1 + 0.5)
    assert pacer.allows_claim(T1 + 0.5)


def test_a_429_with_retry_after_holds_claims_only():
    sent = Sent()
    pacer = Pacer(sent, max_rps=100.0)
    pacer.rate_limited(T1, retry_after=3.0, limit=None)
    assert pacer.rate == 100.0  # set by the operator: never learned over
    assert not pacer.allows_claim(T1 + 2.9) and pacer.allows_claim(T1 + 3.0)
    assert pacer.claim_ready_at(T1) >= T1 + 3.0 and pacer.next_deadline(T1) == T1 + 3.0
    pacer.submit(Call("complete"), None, False, T1 + 1)
    assert sent.routes() == ["complete"]


def test_a_429_teaches_the_plan_rate_less_5_percent_then_a_fifth_less_when_shared_then_creeps_back():
    pacer = Pacer(Sent())
    pacer.rate_limited(T1, None, limit=10.0)
    assert pacer.rate == pytest.approx(9.5)
    pacer.rate_limited(T1 + 1, None, limit=10.0)  # still too fast: someone shares the plan
    assert pacer.rate == pytest.approx(7.6)
    pacer.release(T1 + 2.5)  # within CREEP_EVERY of the last 429
    assert pacer.rate == pytest.approx(7.6)
    pacer.release(T1 + 3.1)
    assert pacer.rate == pytest.approx(7.98)
    for n in range(20):
        pacer.release(T1 + 5.2 + 2.1 * n)
    assert pacer.rate == pytest.approx(9.5)  # never above the plan


def test_a_429_without_a_limit_paces_at_90_percent_of_what_was_sent():
    pacer = Pacer(Sent())
    for n in range(20):
        pacer.submit(Call("complete"), None, False, T1 + n * 0.1)
    pacer.rate_limited(T1 + 1.95, None, None)
    assert pacer.rate == pytest.approx(0.9 * 20 / 2.0) and pacer.rate_limited_answers == 1
    assert not pacer.allows_claim(T1 + 1.95)  # the bucket starts empty
