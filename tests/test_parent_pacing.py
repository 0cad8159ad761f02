"""In-process tests of claim-ahead sizing (intake) and the request budget (pacer): pure decisions on numbers."""

from __future__ import annotations

import math

import pytest

from supervisor.parent.intake import MAX_CLAIM, Ewma, Need, claim_size, horizon, next_need_at, starts_within
from supervisor.parent.pacer import Pacer

T0 = 100.0


def need(**kw) -> Need:
    fields = dict(idle=0, waiting=0, remaining=(), procs=2, rtt=0.02, run_time=0.05, prefetch=None, rate=None)
    fields.update(kw)
    return Need(**fields)


# ------------------------------------------------------------------ intake

def test_ewma_starts_at_the_first_sample_then_moves_a_fifth_of_the_way():
    avg = Ewma()
    assert avg.value is None
    avg.add(1.0)
    avg.add(2.0)
    assert avg.value == pytest.approx(1.2)


def test_prefetch_0_or_no_measurements_claim_only_for_idle_children_without_a_waiting_job():
    for n in (need(prefetch=0, idle=3, waiting=1), need(rtt=None, idle=3, waiting=1),
              need(run_time=None, idle=3, waiting=1)):
        assert claim_size(n) == 2
    assert claim_size(need(prefetch=0, idle=1, waiting=3, remaining=(0.0,))) == 0
    assert claim_size(need(prefetch=0, idle=500)) == MAX_CLAIM


def test_a_busy_child_about_to_finish_gets_a_job_claimed_ahead():
    # horizon 2 x 20 ms + 5 ms = 45 ms; the child is free in 10 ms: one start, plus a batch of the 100 ms
    # minimum window (longer than the horizon) at 40 starts/s (2 children, 50 ms jobs) = 4 more
    assert horizon(0.02) == pytest.approx(0.045)
    assert starts_within(0.045, need(remaining=(0.01,))) == 1
    assert claim_size(need(remaining=(0.01,))) == 5


def test_prefetch_n_caps_the_reserve():
    assert claim_size(need(remaining=(0.01,), prefetch=1)) == 1
    assert claim_size(need(idle=2, remaining=(), prefetch=1)) == 3  # idle children plus one reserved


def test_enough_waiting_jobs_mean_no_claim():
    assert claim_size(need(remaining=(0.01,), waiting=1)) == 0


def test_jobs_longer_than_the_horizon_are_never_reserved():
    assert claim_size(need(run_time=10.0, remaining=(5.0,))) == 0
    assert claim_size(need(run_time=10.0, remaining=(5.0,), idle=1)) == 1  # only for the idle child
    assert claim_size(need(run_time=10.0, remaining=(math.inf,), idle=0)) == 0


def test_under_a_request_budget_claims_come_in_bigger_batches():
    # 5 req/s: claims may spend a tenth (one per 2 s); jobs start at most 4.5/s: 9 more in the gap
    assert claim_size(need(idle=1, rate=5.0)) == 10
    assert claim_size(need(idle=1, rate=5.0, prefetch=2)) == 3


def test_next_need_is_when_the_next_busy_child_comes_within_the_horizon():
    # the entry at 0.455 s, and half a round trip on (a child's answer before then claims at once)
    assert next_need_at(T0, need(remaining=(0.5, math.inf))) == pytest.approx(T0 + 0.455 + 0.01)
    # already within: claimed for now; the next need is its next job's entry (50 ms jobs)
    assert next_need_at(T0, need(remaining=(0.01,))) == pytest.approx(T0 + 0.01 - 0.045 + 0.05 + 0.01)
    assert next_need_at(T0, need(remaining=())) is None and next_need_at(T0, need(remaining=(0.5,), rtt=None)) is None


# ------------------------------------------------------------------ pacer

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
        pacer.submit(Call(route), None, route == "claim", T0)
    assert sent.routes() == ["claim", "complete", "job_heartbeat"] and sent.calls[0][2] is True
    assert pacer.allows_claim(T0) and pacer.next_deadline(T0) is None and pacer.sent == 3


def test_a_fixed_rate_queues_calls_by_priority_and_releases_them_as_tokens_come():
    sent = Sent()
    pacer = Pacer(sent, max_rps=2.0)
    for route in ("register", "worker_heartbeat"):  # the burst of two
        pacer.submit(Call(route), None, False, T0)
    for route in ("claim", "job_heartbeat", "complete", "fail"):
        pacer.submit(Call(route), None, False, T0)
    assert sent.routes() == ["register", "worker_heartbeat"]
    assert not pacer.allows_claim(T0)
    assert pacer.next_deadline(T0) == pytest.approx(T0 + 0.5)
    pacer.release(T0 + 0.49)
    assert len(sent.calls) == 2
    for at in (0.5, 1.0, 1.5, 2.0):
        pacer.release(T0 + at)
    assert sent.routes()[2:] == ["complete", "fail", "job_heartbeat", "claim"]  # settlements first, claims last


def test_a_claim_needs_a_token_to_spare_for_the_settlement_behind_it():
    pacer = Pacer(Sent(), max_rps=2.0)
    assert pacer.allows_claim(T0)
    pacer.submit(Call("complete"), None, False, T0)
    assert not pacer.allows_claim(T0)  # one token left
    assert pacer.claim_ready_at(T0) == pytest.approx(T0 + 0.5)
    assert pacer.allows_claim(T0 + 0.5)


def test_a_429_with_retry_after_holds_claims_only():
    sent = Sent()
    pacer = Pacer(sent, max_rps=100.0)
    pacer.rate_limited(T0, retry_after=3.0, limit=None)
    assert pacer.rate == 100.0  # set by the operator: never learned over
    assert not pacer.allows_claim(T0 + 2.9) and pacer.allows_claim(T0 + 3.0)
    assert pacer.claim_ready_at(T0) >= T0 + 3.0 and pacer.next_deadline(T0) == T0 + 3.0
    pacer.submit(Call("complete"), None, False, T0 + 1)
    assert sent.routes() == ["complete"]


def test_a_429_teaches_the_plan_rate_less_5_percent_then_a_fifth_less_when_shared_then_creeps_back():
    pacer = Pacer(Sent())
    pacer.rate_limited(T0, None, limit=10.0)
    assert pacer.rate == pytest.approx(9.5)
    pacer.rate_limited(T0 + 1, None, limit=10.0)  # still too fast: someone shares the plan
    assert pacer.rate == pytest.approx(7.6)
    pacer.release(T0 + 2.5)  # within CREEP_EVERY of the last 429
    assert pacer.rate == pytest.approx(7.6)
    pacer.release(T0 + 3.1)
    assert pacer.rate == pytest.approx(7.98)
    for n in range(20):
        pacer.release(T0 + 5.2 + 2.1 * n)
    assert pacer.rate == pytest.approx(9.5)  # never above the plan


def test_a_429_without_a_limit_paces_at_90_percent_of_what_was_sent():
    pacer = Pacer(Sent())
    for n in range(20):
        pacer.submit(Call("complete"), None, False, T0 + n * 0.1)
    pacer.rate_limited(T0 + 1.95, None, None)
    assert pacer.rate == pytest.approx(0.9 * 20 / 2.0) and pacer.rate_limited_answers == 1
    assert not pacer.allows_claim(T0 + 1.95)  # the bucket starts empty
