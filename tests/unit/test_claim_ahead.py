"""Claim just ahead of need and batched claims, decided on numbers with a fake clock.

First each sizing decision of supervisor.parent.jobs.intake on its own, then the real jobs wing in a
deterministic loop (tests/support/flow_sim.py: fake children, an API one round trip away) to check what
those decisions add up to: latency hidden for short jobs, nothing hoarded behind long ones. Last, the
sizing decisions again for two children running 50 ms jobs (`short_need`).
"""

from __future__ import annotations

import math
import random
from dataclasses import replace
from types import SimpleNamespace

import pytest
from support.flow_sim import Sim, make_cfg
from support.parent_fakes import fake_child
from support.wing_rig import WingRig

from supervisor.client.rest import Secret, SpooledAPI
from supervisor.ops.nullhooks import NullHooks
from supervisor.parent.facts import JobDone
from supervisor.parent.jobs.intake import (
    MAX_CLAIM,
    MAX_STEPS,
    MIN_BATCH_WINDOW,
    NEED_SLACK_RTTS,
    Ewma,
    Need,
    claim_size,
    horizon,
    next_need_at,
    starts_within,
)

RTT = 0.02
H = horizon(RTT)  # 2 round trips + 5 ms = 45 ms
SLACK = NEED_SLACK_RTTS * RTT  # next_need_at wakes this long after the need itself


def need(**kw) -> Need:
    fields = dict(idle=0, reserved=0, remaining=(), procs=4, rtt=RTT, run_time=1.0, prefetch=None, rate=None)
    fields.update(kw)
    return Need(**fields)


# ------------------------------------------------------------------ the estimates

def test_ewma_has_no_value_until_a_sample_and_then_follows_the_samples():
    avg = Ewma(alpha=0.5)
    assert avg.value is None
    avg.add(0.1)
    assert avg.value == pytest.approx(0.1)
    for _ in range(30):
        avg.add(2.0)
    assert avg.value == pytest.approx(2.0, rel=1e-6)


def test_the_horizon_is_two_round_trips_and_a_loop_turn_and_nothing_without_an_estimate():
    assert H == pytest.approx(0.045)
    assert horizon(None) == 0.0


# ------------------------------------------------------------------ claim for idle children only

@pytest.mark.parametrize("idle,waiting,expected", [(3, 0, 3), (3, 1, 2), (1, 2, 0), (0, 0, 0), (500, 0, MAX_CLAIM)])
def test_prefetch_0_claims_idle_minus_waiting_even_with_a_child_about_to_finish(idle, waiting, expected):
    n = need(idle=idle, reserved=waiting, remaining=(0.001, 0.0), run_time=0.01, prefetch=0)
    assert claim_size(n) == expected


@pytest.mark.parametrize("missing", [{"rtt": None}, {"run_time": None}, {"rtt": None, "run_time": None}])
def test_without_an_estimate_yet_claims_are_idle_minus_waiting(missing):
    # a busy child about to finish would be claimed for with estimates; without them it is not
    assert claim_size(need(idle=2, reserved=0, remaining=(0.0,), **missing)) == 2
    assert claim_size(need(idle=2, reserved=1, remaining=(0.0,), **missing)) == 1
    assert claim_size(need(idle=0, reserved=0, remaining=(0.0,), **missing)) == 0
    assert claim_size(need(idle=2, reserved=0, remaining=(0.0,), rate=5.0, **missing)) == 2  # no batch either


# ------------------------------------------------------------------ long jobs: nothing reserved

def test_jobs_far_longer_than_the_horizon_reserve_nothing_beyond_the_idle_children():
    busy = (0.5, 1.2, 1.9)  # three children busy with 2 s jobs, none within 45 ms of its end
    assert claim_size(need(run_time=2.0, remaining=busy)) == 0
    assert claim_size(need(run_time=2.0, idle=1, remaining=busy)) == 1
    assert claim_size(need(run_time=2.0, idle=1, reserved=1, remaining=busy)) == 0
    assert claim_size(need(run_time=2.0, remaining=(math.inf,) * 4)) == 0  # queues without an estimate


def test_a_long_job_is_claimed_for_only_once_its_child_is_inside_the_horizon():
    assert claim_size(need(run_time=2.0, remaining=(H + 0.001, 1.0))) == 0
    assert claim_size(need(run_time=2.0, remaining=(H - 0.001, 1.0))) == 1
    assert claim_size(need(run_time=2.0, remaining=(H - 0.001, 1.0), reserved=1)) == 0


# ------------------------------------------------------------------ several children: one claim for all

def test_several_children_finishing_within_the_horizon_are_claimed_for_in_one_claim():
    assert starts_within(H, need(remaining=(0.0, 0.01, 0.02, 0.04))) == 4
    assert claim_size(need(remaining=(0.0, 0.01, 0.02, 0.04))) == 4
    assert claim_size(need(remaining=(0.0, 0.01, 0.02, 0.5))) == 3  # the fourth is not due yet
    assert claim_size(need(idle=2, remaining=(0.01, 0.02))) == 4  # idle and soon-free together


def test_short_jobs_count_every_start_in_the_horizon_and_add_one_horizon_more():
    # 10 ms jobs: an idle child starts 1 + 4 jobs in 45 ms; the batch adds 4 children x 100/s x 100 ms
    # (one more horizon, or the minimum window when that is longer: 100 ms here)
    assert starts_within(H, need(idle=1, run_time=0.01)) == 5
    n = need(idle=1, remaining=(0.0, 0.0, 0.0), run_time=0.01)
    assert starts_within(H, n) == 20
    assert claim_size(n) == 20 + math.floor(400 * max(H, MIN_BATCH_WINDOW)) == 60
    assert claim_size(need(idle=1, run_time=0.0001)) == MAX_CLAIM  # never above the API's limit


def test_on_loopback_a_claim_carries_at_least_a_minimum_window_of_starts_but_long_jobs_still_none():
    """A 1 ms round trip: 20 ms jobs on 2 children would cost a claim each; the batch covers 100 ms of
    starts instead. Jobs longer than children x that window still reserve nothing."""
    fast = dict(procs=2, rtt=0.001, remaining=(0.0, 0.01))
    h = horizon(0.001)
    assert h < MIN_BATCH_WINDOW
    assert claim_size(need(run_time=0.02, **fast)) == 1 + math.floor(2 / 0.02 * MIN_BATCH_WINDOW) == 11
    assert claim_size(need(run_time=0.1, **fast)) == 3  # 20 starts/s x 100 ms: the child due now and 2 more
    assert claim_size(need(run_time=0.3, **fast)) == 1  # 6.7 starts/s x 100 ms < 1: the child due now only
    assert claim_size(need(run_time=2.0, procs=2, rtt=0.001, remaining=(1.0, 1.5))) == 0


def test_waiting_jobs_count_against_the_need():
    n = dict(remaining=(0.0, 0.01, 0.02, 0.04))
    assert claim_size(need(reserved=4, **n)) == 0
    assert claim_size(need(reserved=3, **n)) == 1


# ------------------------------------------------------------------ a known rate: bigger batches

def test_a_known_request_rate_makes_the_batch_cover_the_gap_between_affordable_claims():
    n = dict(remaining=(0.0, 0.01, 0.02, 0.04), run_time=1.0)  # need 4; 4 starts/s with every child busy
    assert claim_size(need(**n)) == 4
    assert claim_size(need(rate=100.0, **n)) == 4  # claims every 0.1 s: 0.4 starts, no extra job
    assert claim_size(need(rate=10.0, **n)) == 4 + 4  # a claim a second: 4 more
    assert claim_size(need(rate=5.0, **n)) == 4 + 8  # a claim every 2 s: 8 more


@pytest.mark.parametrize("rate", [0.5, 1.0, 5.0, 25.0, 100.0])
def test_under_a_rate_short_jobs_come_nine_to_a_claim_so_claims_take_a_tenth_of_the_budget(rate):
    # jobs settle at 90% of the rate, claims get 10%: 9 jobs per claim whatever the plan
    n = need(idle=1, procs=2, run_time=0.005, rate=rate)
    assert claim_size(n) - starts_within(H, n) == 9


def test_under_a_rate_jobs_are_counted_to_start_no_faster_than_the_rate_can_settle_them():
    n = dict(idle=1, procs=2, run_time=0.001)  # the children could start 2000 jobs/s
    need_now = starts_within(H, need(**n))
    assert claim_size(need(**n)) == min(MAX_CLAIM, need_now + math.floor(2000 * H))
    assert claim_size(need(rate=500.0, **n)) == need_now + math.floor(450 * max(H, MIN_BATCH_WINDOW))  # 90% of 500/s


# ------------------------------------------------------------------ prefetch N caps the reserve

def test_prefetch_n_caps_what_is_left_waiting_after_the_idle_children_take_theirs():
    n = dict(remaining=(0.0, 0.0, 0.0), run_time=0.01)  # auto would reserve 15 + 18
    assert claim_size(need(**n)) > 10
    assert claim_size(need(prefetch=3, **n)) == 3
    assert claim_size(need(prefetch=3, idle=1, **n)) == 4  # the idle child's job plus 3 reserved
    assert claim_size(need(prefetch=3, reserved=2, **n)) == 1
    assert claim_size(need(prefetch=3, reserved=3, **n)) == 0
    assert claim_size(need(prefetch=3, rate=5.0, **n)) == 3  # the rate's batch is capped too


def test_prefetch_n_is_a_cap_not_a_target():
    busy = (0.5, 1.2, 1.9)
    assert claim_size(need(prefetch=50, run_time=2.0, remaining=busy)) == 0
    assert claim_size(need(prefetch=50, run_time=2.0, idle=1, remaining=busy)) == 1


# ------------------------------------------------------------------ when to wake up for the next claim

def test_with_nothing_waiting_the_next_need_is_when_the_soonest_busy_child_enters_the_horizon():
    assert next_need_at(50.0, need(remaining=(1.0, 0.3, math.inf))) == pytest.approx(50.0 + 0.3 - H + SLACK)
    # the one inside is claimable now; the next step is the other's entry
    assert next_need_at(50.0, need(remaining=(0.01, 0.3))) == pytest.approx(50.0 + 0.3 - H + SLACK)
    # alone, the one inside next counts again when its next job's end enters the horizon
    assert next_need_at(50.0, need(remaining=(0.01,))) == pytest.approx(50.0 + 0.01 - H + 1.0 + SLACK)
    assert next_need_at(50.0, need(remaining=(math.inf,))) is None
    assert next_need_at(50.0, need(remaining=(1.0,), rtt=None)) is None
    assert next_need_at(50.0, need(remaining=(1.0,), run_time=None)) is None
    assert next_need_at(50.0, need(remaining=())) is None


def test_jobs_waiting_push_the_next_need_past_the_children_they_cover():
    """One job waiting covers the first child to come within the horizon: the loop wakes for the second
    (a turn per job saved when the reserve is enough); with short jobs, a child's later starts count too."""
    assert next_need_at(50.0, need(remaining=(0.2, 0.5), reserved=1)) == pytest.approx(50.0 + 0.5 - H + SLACK)
    assert next_need_at(50.0, need(remaining=(0.2, 0.5), reserved=2)) == pytest.approx(50.0 + 0.2 - H + 1.0 + SLACK)
    # 10 ms jobs: the child at 0.1 s starts again every 10 ms, long before the other one's entry
    assert next_need_at(50.0, need(remaining=(0.1, 0.5), reserved=3, run_time=0.01)) == pytest.approx(
        50.0 + 0.1 - H + 0.03 + SLACK)


def state_at(n: Need, t: float) -> Need:
    """What the job flow will see `t` s from now if nothing is claimed: each child whose job ends takes
    the next job waiting (an idle one at once), or goes idle when none is left."""
    run = n.run_time or 0.0
    ends = sorted(r for r in n.remaining if r != math.inf)
    never = [r for r in n.remaining if r == math.inf]
    waiting, idle = n.reserved, n.idle
    took = min(idle, waiting)
    waiting, idle = waiting - took, idle - took
    ends = sorted(ends + [run] * took)
    while ends and ends[0] <= t:
        end = ends.pop(0)
        if waiting:
            waiting -= 1
            ends = sorted(ends + [end + run])
        else:
            idle += 1
    return replace(n, idle=idle, reserved=waiting, remaining=tuple(never + [e - t for e in ends]))


@pytest.mark.parametrize("seed", range(5))
def test_the_next_need_is_the_first_moment_claim_size_would_claim(seed):
    """Against claim_size's own test (starts within the horizon > jobs waiting) on the state the flow will
    be in as jobs end and take the jobs waiting: the answer less SLACK is the moment it turns true (never
    true before); past MAX_STEPS, an earlier answer (a wasted turn) is allowed, a later one not."""
    rnd = random.Random(seed)
    checked = 0
    for _ in range(400):
        run = rnd.choice([0.002, 0.01, 0.05, 0.3, 2.0])
        n = need(idle=rnd.choice([0, 0, 1]), reserved=rnd.randrange(0, 40), run_time=run, procs=4,
                 remaining=tuple(rnd.choice([math.inf, rnd.uniform(0, 3 * run)]) for _ in range(rnd.randrange(1, 5))))
        if starts_within(H, n) > n.reserved or n.idle > n.reserved:
            continue  # claimable now: next_deadline wakes at once, not at next_need_at

        def claims(t: float, n: Need = n) -> bool:
            later = state_at(n, t)
            return starts_within(H, later) > later.reserved

        got = next_need_at(0.0, n)
        got = got if got is None or n.reserved >= MAX_STEPS else got - SLACK  # the need itself
        if all(r == math.inf for r in n.remaining):
            assert got is None
            continue
        if got is None and n.reserved >= MAX_STEPS:
            continue  # more than MAX_STEPS starts away: the jobs' ends wake the loop first
        assert got is not None and got > 0, (n, got)
        assert not any(claims(got * i / 50) for i in range(50)), (n, got)  # never late
        if n.reserved < MAX_STEPS:
            assert claims(got + 1e-9) and not claims(got - 1e-9), (n, got)
            checked += 1
    assert checked > 100


# ------------------------------------------------------------------ the jobs wing: one claim on the wire

class Submit:
    def __init__(self) -> None:
        self.calls: list = []

    def __call__(self, call, followup, first: bool = False) -> None:
        self.calls.append((call, followup, first))

    def routes(self) -> list[str]:
        return [c.route for c, _, _ in self.calls]


def flow_with_estimates(procs: int, run: float = 1.0, rtt: float = RTT, **cfg) -> tuple[WingRig, Submit]:
    """The jobs wing having measured `rtt` and `run` and has `procs` children running jobs started at t=10."""
    submit = Submit()
    flow = WingRig(make_cfg(procs=procs, **cfg), SpooledAPI("http://127.0.0.1:9", Secret("k")), submit, NullHooks())
    flow.claiming.claim_rtt.add(rtt)
    flow.claiming.queues["q"].run_time.add(run)
    for slot in range(procs):
        entry = flow.add({"id": f"r{slot}", "lease_id": f"L{slot}", "queue_name": "q"}, 10.0)
        flow.started(entry, fake_child(slot, pid=1000 + slot), 10.0)
    return flow, submit


def claim_limit(call) -> int:
    import orjson

    return orjson.loads(call.body)["limit"]


def test_children_finishing_together_get_one_claim_and_no_second_one_while_it_is_out():
    flow, submit = flow_with_estimates(procs=4, run=1.0)
    flow.maybe_claim(10.9, idle=0, procs=4, may_claim=True)  # 100 ms before the ends: too early
    assert submit.calls == []
    at = 11.0 - H + 0.001
    assert flow.next_deadline(10.9, True, 0) == pytest.approx(11.0 - H + SLACK)
    flow.maybe_claim(at, idle=0, procs=4, may_claim=True)
    flow.maybe_claim(at + 0.001, idle=0, procs=4, may_claim=True)
    assert submit.routes() == ["claim"]
    call, followup, first = submit.calls[0]
    assert first and claim_limit(call) == 4
    flow.answer(followup, [{"id": f"n{i}", "lease_id": f"N{i}", "queue_name": "q"} for i in range(4)], None, at + RTT)
    assert flow.claiming.reserved() == 4
    for slot in range(4):  # the children finish one after another: the reserve covers them all
        flow.job_done(JobDone(slot, f"r{slot}", True, None), 11.0 + slot * 0.001)
        flow.turn(11.0 + slot * 0.001, idle=[fake_child(slot)], procs=4, may_send_ahead=False)  # it takes the next
    assert submit.routes() == ["claim"] + ["complete"] * 4  # each turn sends the report of the job done, no claim


def test_long_jobs_reserve_nothing_while_every_child_is_busy_and_the_flow_sleeps_until_one_is_due():
    flow, submit = flow_with_estimates(procs=2, run=2.0)
    for t in (10.0, 10.5, 11.0, 11.9):
        flow.maybe_claim(t, idle=0, procs=2, may_claim=True)
    assert submit.calls == []
    assert flow.next_deadline(11.0, True, 0) == pytest.approx(12.0 - H + SLACK)


def test_prefetch_0_neither_claims_nor_wakes_for_a_busy_child():
    flow, submit = flow_with_estimates(procs=2, run=0.01, prefetch=0)
    flow.maybe_claim(10.009, idle=0, procs=2, may_claim=True)
    assert submit.calls == []
    assert flow.next_deadline(10.005, True, 0) == pytest.approx(flow.inflight.next_deadline())  # only the renewal


def test_a_claim_held_by_the_budget_gate_wakes_the_loop_when_the_gate_opens():
    """A busy child already inside the horizon, the claim held by the request budget until `gate`: the
    loop must come back at the gate to claim for it, not sleep until the child ends or a renewal."""
    flow, submit = flow_with_estimates(procs=1, run=0.05)
    at = 10.05 - 0.01  # the child ends in 10 ms: inside the 45 ms horizon
    flow.maybe_claim(at, idle=0, procs=1, may_claim=True, budget_ok=False)
    assert submit.calls == []
    gate = at + 0.005
    deadline = flow.next_deadline(at, True, 0, claim_gate=gate)
    assert deadline == pytest.approx(gate)
    flow.maybe_claim(gate, idle=0, procs=1, may_claim=True)
    assert submit.routes() == ["claim"]


def test_no_wake_up_for_a_child_inside_the_horizon_when_the_reserve_already_covers_it():
    flow, submit = flow_with_estimates(procs=1, run=0.05)
    flow.add({"id": "w", "lease_id": "Lw", "queue_name": "q"}, 10.0)  # one job waiting
    at = 10.04
    # not now for the child inside (the job waiting is its next), but when that job, started at 10.05,
    # comes within the horizon of its own end (and half a round trip on)
    assert flow.next_deadline(at, True, 0) == pytest.approx(10.05 + 0.05 - H + SLACK)


# ------------------------------------------------------------------ what the decisions add up to

def test_sim_long_jobs_hold_no_reserve_so_a_fleet_shares_them():
    sim = Sim(procs=2, jobs=12, run_time=lambda i: 2.0, rtt=RTT).run()
    assert sim.completed == {f"j{i}" for i in range(12)}
    makespan = max(sim.start_times.values()) + 2.0 - min(sim.start_times.values())
    assert makespan == pytest.approx(12.0, abs=0.3)
    assert max(sim.flow.claiming.reserve_waits) <= H + RTT  # claimed at most a horizon ahead, from the claim's send
    assert sim.reserve_area / makespan < 0.02 * 2  # under 2% of the children's time has a job reserved
    assert len(sim.claims()) <= 12 + 3  # about one claim per job (the jobs end apart), not a poll loop


def test_sim_short_jobs_keep_the_children_busy_despite_the_round_trip():
    """20 ms jobs, 20 ms API: claiming ahead keeps children busy; claiming only for idle children
    leaves each idle a round trip per job (half the time)."""
    ahead = Sim(procs=2, jobs=200, run_time=lambda i: 0.02, rtt=RTT).run()
    idle_only = Sim(procs=2, jobs=200, run_time=lambda i: 0.02, rtt=RTT, prefetch=0).run()
    busy = 200 * 0.02
    assert ahead.idle_with_backlog < 0.1 * busy
    assert idle_only.idle_with_backlog > 0.8 * busy
    assert len(ahead.claims()) < 200 / 2  # batched: more than two jobs a claim on average
    assert ahead.turns < 20 * 200


def test_sim_prefetch_0_never_holds_a_job_no_idle_child_takes_at_once():
    sim = Sim(procs=2, jobs=100, run_time=lambda i: 0.01, rtt=0.05, prefetch=0).run()
    assert len(sim.completed) == 100
    assert sim.max_reserved == 0
    assert all(s.limit <= 2 for s in sim.claims())


def test_sim_prefetch_n_caps_the_reserve_where_auto_would_hold_more():
    auto = Sim(procs=2, jobs=150, run_time=lambda i: 0.01, rtt=0.05).run()
    capped = Sim(procs=2, jobs=150, run_time=lambda i: 0.01, rtt=0.05, prefetch=3).run()
    assert auto.max_reserved > 3
    assert capped.max_reserved <= 3
    assert len(capped.completed) == 150


def test_sim_children_finishing_together_share_one_claim_each_round():
    sim = Sim(procs=4, jobs=16, run_time=lambda i: 0.5, rtt=RTT).run()
    assert len(sim.completed) == 16
    claims = [s for s in sim.claims() if s.at < max(sim.start_times.values())]
    assert [s.limit for s in claims] == [4, 4, 4, 4]  # one claim per round of four, each for all four


def test_sim_a_mispredicted_long_job_keeps_only_what_was_claimed_before_it_overran():
    """Short jobs teach a 20 ms estimate; then a 3 s job. Its child is claimed for as if about to end,
    and those jobs wait (renewed) until it does; no claim goes while it overruns, nothing piles up."""
    sim = Sim(procs=1, jobs=12, run_time=lambda i: 3.0 if i == 5 else 0.02, rtt=RTT, lease=5).run()
    assert len(sim.completed) == 12
    long_start = sim.start_times["j5"]
    n = need(idle=0, remaining=(0.0,), procs=1, run_time=0.02)
    assert 1 <= sim.max_reserved <= claim_size(n)  # one horizon of starts and one batch, no more
    assert not [s for s in sim.claims() if long_start < s.at < long_start + 3.0]
    assert max(sim.flow.claiming.reserve_waits) > 2.5  # the jobs behind the long one waited...
    behind = {j for j, t in sim.start_times.items() if t >= long_start + 3.0 and sim.claimed_at[j] <= long_start}
    renewed = {s.job_id for s in sim.sent if s.route == "job_heartbeat"}
    assert renewed == {"j5"} | behind and behind  # ...each renewed (5 s lease, renewed every 1.7 s)


def test_enforce_before_the_tables_next_deadline_scans_nothing_and_sends_nothing(monkeypatch):
    flow, submit = flow_with_estimates(procs=1, run=0.05, lease=30)  # r0 claimed at 10: renewal due at 20
    scans: list[float] = []
    monkeypatch.setattr(flow.inflight, "renewals_due", lambda now: scans.append(now) or [])
    assert flow.enforce(19.9) == [] and scans == [] and submit.calls == []
    monkeypatch.undo()
    assert flow.enforce(20.0) == [] and [c.route for c, _, _ in submit.calls] == ["job_heartbeat"]
    assert flow.inflight.next_deadline() is None  # the renewal is on the wire: nothing else is due


def test_a_reserved_job_whose_lease_ran_out_is_dropped_before_any_child_can_take_it():
    flow, submit = flow_with_estimates(procs=1, run=0.05, lease=6)
    stale = flow.add({"id": "w", "lease_id": "Lw", "queue_name": "q"}, 10.0)  # renewal due at 12
    fresh = flow.add({"id": "f", "lease_id": "Lf", "queue_name": "q"}, 14.0)
    assert flow.enforce(16.5) == []  # the loop did not run from 10 to 16.5: longer than the 6 s lease
    assert flow.inflight.get("w") is None and flow.inflight.get("f") is fresh
    assert [e.id for _, e in flow.claiming.assignments([SimpleNamespace(slot=0, pid=1)])] == ["f"]
    renewed = [c for c, _, _ in submit.calls if c.route == "job_heartbeat"]
    assert all("/w/" not in c.path for c in renewed) and stale.renewal.busy is False


# ------------------------------------------------------------------ the same decisions: two children, 50 ms jobs

T0 = 100.0


def short_need(**kw) -> Need:
    fields = dict(idle=0, reserved=0, remaining=(), procs=2, rtt=0.02, run_time=0.05, prefetch=None, rate=None)
    fields.update(kw)
    return Need(**fields)


def test_ewma_starts_at_the_first_sample_then_moves_a_fifth_of_the_way():
    avg = Ewma()
    assert avg.value is None
    avg.add(1.0)
    avg.add(2.0)
    assert avg.value == pytest.approx(1.2)


def test_prefetch_0_or_no_measurements_claim_only_for_idle_children_without_a_waiting_job():
    for n in (short_need(prefetch=0, idle=3, reserved=1), short_need(rtt=None, idle=3, reserved=1),
              short_need(run_time=None, idle=3, reserved=1)):
        assert claim_size(n) == 2
    assert claim_size(short_need(prefetch=0, idle=1, reserved=3, remaining=(0.0,))) == 0
    assert claim_size(short_need(prefetch=0, idle=500)) == MAX_CLAIM


def test_a_busy_child_about_to_finish_gets_a_job_claimed_ahead():
    # horizon 2 x 20 ms + 5 ms = 45 ms; the child is free in 10 ms: one start, plus a batch of the 100 ms
    # minimum window (longer than the horizon) at 40 starts/s (2 children, 50 ms jobs) = 4 more
    assert horizon(0.02) == pytest.approx(0.045)
    assert starts_within(0.045, short_need(remaining=(0.01,))) == 1
    assert claim_size(short_need(remaining=(0.01,))) == 5


def test_prefetch_n_caps_the_reserve():
    assert claim_size(short_need(remaining=(0.01,), prefetch=1)) == 1
    assert claim_size(short_need(idle=2, remaining=(), prefetch=1)) == 3  # idle children plus one reserved


def test_enough_waiting_jobs_mean_no_claim():
    assert claim_size(short_need(remaining=(0.01,), reserved=1)) == 0


def test_jobs_longer_than_the_horizon_are_never_reserved():
    assert claim_size(short_need(run_time=10.0, remaining=(5.0,))) == 0
    assert claim_size(short_need(run_time=10.0, remaining=(5.0,), idle=1)) == 1  # only for the idle child
    assert claim_size(short_need(run_time=10.0, remaining=(math.inf,), idle=0)) == 0


def test_under_a_request_budget_claims_come_in_bigger_batches():
    # 5 req/s: claims may spend a tenth (one per 2 s); jobs start at most 4.5/s: 9 more in the gap
    assert claim_size(short_need(idle=1, rate=5.0)) == 10
    assert claim_size(short_need(idle=1, rate=5.0, prefetch=2)) == 3


def test_next_need_is_when_the_next_busy_child_comes_within_the_horizon():
    # the entry at 0.455 s, and half a round trip on (a child's answer before then claims at once)
    assert next_need_at(T0, short_need(remaining=(0.5, math.inf))) == pytest.approx(T0 + 0.455 + 0.01)
    # already within: claimed for now; the next need is its next job's entry (50 ms jobs)
    assert next_need_at(T0, short_need(remaining=(0.01,))) == pytest.approx(T0 + 0.01 - 0.045 + 0.05 + 0.01)
    assert next_need_at(T0, short_need(remaining=())) is None
    assert next_need_at(T0, short_need(remaining=(0.5,), rtt=None)) is None
