"""In-process tests of claiming's and settling's decisions (wired as the arbiter wires them,
tests/support/job_parts.py): claims, reports, renewals, timeouts, lost children.

A fake clock (plain floats passed as `now`) and a recording `submit`; answers are fed to each call's
followup the way the arbiter's `take_answers` would.
"""

from __future__ import annotations

import pytest
from support.job_parts import JobParts
from support.parent_fakes import Hooks, Submit, body, error, fake_child, make_api, make_cfg, timeout_error

from supervisor import exitcodes
from supervisor.client import rest as api
from supervisor.parent.facts import ChildLost, Fatal, JobDone, JobSettled, StopJob
from supervisor.parent.intake import HISTORY_MIN_JOBS

T0 = 100.0


class Rig:
    def __init__(self, **cfg) -> None:
        self.submit = Submit()
        self.hooks = Hooks()
        self.cfg = make_cfg(**cfg)
        self.flow = JobParts(self.cfg, make_api(), self.submit, self.hooks)

    def claim(self, now: float, idle: int, jobs: list, answer_at: float | None = None) -> list:
        """Send a claim for `idle` children and answer it with `jobs`; return the answer's facts."""
        self.maybe_claim(now, idle)
        _, followup, first = self.submit.take("claim")
        assert first, "claims go to the front of the HTTP queue"
        at = answer_at if answer_at is not None else now
        return self.flow.route(followup.answer(jobs, None, at), at)

    def maybe_claim(self, now: float, idle: int, may_claim: bool = True, **kwargs) -> None:
        self.flow.maybe_claim(now, idle, self.cfg.procs, may_claim, **kwargs)

    def deadline(self, now: float, may_claim: bool = False, idle: int = 0) -> float | None:
        return self.flow.next_deadline(now, may_claim, idle)

    @property
    def intake(self):
        """The claim timing of queue q (the only queue)."""
        return self.flow.claiming.queues["q"]

    def run(self, job_id: str = "a", slot: int = 0, now: float = T0, **fields) -> None:
        """Claim `job_id` at `now` and start it on `slot` at once."""
        assert self.claim(now, 1, [job(job_id, **fields)]) == []
        entry = self.flow.inflight.get(job_id)
        self.flow.started(entry, fake_child(slot), now)

    def finish(self, job_id: str = "a", slot: int = 0, ok: bool = True, value=None, now: float = T0 + 1):
        """The child on `slot` answers for `job_id`; return the report call sent for it."""
        assert self.flow.job_done(JobDone(slot, job_id, ok, value), now) is None
        self.flow.send_reports()
        return self.submit.take("complete" if ok else "fail")

    def entry(self, job_id: str = "a"):
        return self.flow.inflight.get(job_id)


def job(job_id: str, **fields) -> dict:
    return {"id": job_id, "lease_id": f"L-{job_id}", "queue_name": "q", **fields}


@pytest.fixture
def rig() -> Rig:
    return Rig()


# ------------------------------------------------------------------ claiming

def test_claim_asks_for_idle_children_minus_waiting_jobs(rig):
    rig.claim(T0, 1, [job("a")])  # one job waits for a child
    rig.maybe_claim(T0 + 0.5, 3, may_claim=True)
    call, _, first = rig.submit.take("claim")
    assert body(call)["limit"] == 2 and body(call)["queue_name"] == "q" and body(call)["lease_duration_secs"] == 30
    assert first


def test_claim_answer_with_jobs_adds_entries_and_claims_again_at_once(rig):
    rig.maybe_claim(T0, 2, may_claim=True)
    _, followup, _ = rig.submit.take("claim")
    assert rig.flow.claiming.claim.busy
    assert followup.answer([job("a"), job("b")], None, T0 + 0.3) == []
    assert not rig.flow.claiming.claim.busy
    assert [e.id for e in rig.flow.inflight.unassigned()] == ["a", "b"]
    entry = rig.entry("a")
    assert entry.claimed_at == T0 and entry.lease_until == T0 + 30  # the lease counts from when the claim left
    assert rig.intake.next_claim_at == T0 + 0.3 and rig.intake.empty_claims == 0
    assert rig.hooks.named("claimed") == [("claimed", 2)]


def test_no_claim_while_one_is_on_the_wire_or_not_allowed_or_nothing_free(rig):
    rig.maybe_claim(T0, 2, may_claim=False)
    assert rig.submit.calls == []
    rig.maybe_claim(T0, 0, may_claim=True)
    assert rig.submit.calls == []
    rig.maybe_claim(T0, 2, may_claim=True)
    rig.maybe_claim(T0, 2, may_claim=True)
    assert rig.submit.routes() == ["claim"]


def test_empty_claims_back_off_growing_within_poll_interval(rig):
    delays = []
    now = T0
    for _ in range(12):
        rig.claim(now, 1, [])
        delays.append(rig.intake.next_claim_at - now)
        now = rig.intake.next_claim_at
    assert rig.intake.empty_claims == 12
    for n, delay in enumerate(delays, start=1):
        top = min(rig.cfg.poll_interval, 0.05 * 2 ** (n - 1))
        assert top / 2 <= delay <= top
    assert max(delays) <= rig.cfg.poll_interval and delays[-1] >= rig.cfg.poll_interval / 2


def test_empty_claim_back_off_holds_until_its_time(rig):
    rig.claim(T0, 1, [])
    at = rig.intake.next_claim_at
    rig.maybe_claim(at - 0.001, 1, may_claim=True)
    assert rig.submit.calls == []
    rig.maybe_claim(at, 1, may_claim=True)
    assert rig.submit.routes() == ["claim"]


def test_fewer_jobs_than_asked_keeps_them_and_backs_off(rig):
    rig.claim(T0, 3, [job("a")])
    assert len(rig.flow.inflight) == 1 and rig.intake.empty_claims == 1
    assert T0 + 0.025 <= rig.intake.next_claim_at <= T0 + 0.05


def test_full_claim_resets_the_empty_back_off(rig):
    rig.claim(T0, 1, [])
    rig.claim(rig.intake.next_claim_at, 1, [job("a")], answer_at=T0 + 1)
    assert rig.intake.empty_claims == 0 and rig.intake.next_claim_at == T0 + 1


def test_429_with_retry_after_holds_claims_even_when_a_child_frees_up(rig):
    rig.run("a", slot=0)
    rig.maybe_claim(T0 + 1, 1, may_claim=True)
    _, followup, _ = rig.submit.take("claim")
    assert followup.answer(None, error(429, "RATE_LIMIT_EXCEEDED", retry_after=7), T0 + 1) == []
    assert rig.flow.claiming.claim_not_before >= T0 + 1 + 7
    rig.finish("a", now=T0 + 2)  # a freed child claims at once ... but not through a 429's wait
    rig.maybe_claim(T0 + 7.9, 1, may_claim=True)
    assert rig.submit.routes() == []
    rig.maybe_claim(rig.flow.claiming.claim_not_before, 1, may_claim=True)
    assert rig.submit.routes() == ["claim"]


def test_429_without_retry_after_backs_off_growing(rig):
    waits = []
    for n in range(1, 5):
        now = T0 + 100 * n
        rig.maybe_claim(now, 1, may_claim=True)
        _, followup, _ = rig.submit.take("claim")
        assert followup.answer(None, error(429, "RATE_LIMIT_EXCEEDED"), now) == []
        waits.append(rig.flow.claiming.claim_not_before - now)
    assert rig.flow.claiming.claim_failures == 4
    for n, wait in enumerate(waits, start=1):
        top = min(5.0, 0.2 * 2 ** (n - 1))
        assert top / 2 <= wait <= top


def test_claim_failure_on_5xx_backs_off_and_success_resets(rig):
    rig.maybe_claim(T0, 1, may_claim=True)
    rig.submit.take("claim")[1].answer(None, error(503), T0)
    assert rig.flow.claiming.claim_failures == 1 and rig.flow.claiming.claim_not_before > T0
    rig.claim(rig.flow.claiming.claim_not_before, 1, [job("a")])
    assert rig.flow.claiming.claim_failures == 0 and rig.flow.claiming.claim_not_before == 0.0


def test_claim_401_is_fatal(rig):
    rig.maybe_claim(T0, 1, may_claim=True)
    facts = rig.submit.take("claim")[1].answer(None, error(401, "UNAUTHORIZED"), T0)
    assert len(facts) == 1 and isinstance(facts[0], Fatal) and facts[0].code == exitcodes.AUTH
    assert not rig.flow.claiming.claim.busy


def test_malformed_jobs_are_ignored_and_the_others_kept(rig):
    bad = [{"lease_id": "L"}, {"id": "b"}, {"id": "c", "lease_id": ""}, {"id": 7, "lease_id": "L"}, "junk", None]
    assert rig.claim(T0, 10, [job("a"), *bad, job("d")]) == []
    assert sorted(rig.flow.inflight.jobs) == ["a", "d"]


def test_reissued_job_voids_the_old_entry_and_stops_its_child(rig):
    rig.run("a", slot=1)
    old = rig.entry("a")
    facts = rig.claim(T0 + 40, 1, [dict(job("a"), lease_id="L-new")])
    assert facts == [JobSettled(old.pid, "a", "lease_lost", "handed out again", "heartbeat"),
                     StopJob(1, "a", "lease_lost")]
    assert ("job_settled", "q", "lease_lost", None) in rig.hooks.events
    new = rig.entry("a")
    assert new is not old and new.lease_id == "L-new" and new.slot is None
    # whatever the old copy's child answers is void
    assert rig.flow.job_done(JobDone(1, "a", True, 1), T0 + 41) is None and rig.flow.settling.unsent == []


def test_reissued_job_waiting_for_a_child_needs_no_stop(rig):
    rig.claim(T0, 1, [job("a")])
    assert rig.claim(T0 + 40, 2, [dict(job("a"), lease_id="L-new")]) == []
    assert rig.entry("a").lease_id == "L-new"


def test_recover_claim_frees_the_claim_and_waits_a_second(rig):
    rig.maybe_claim(T0, 1, may_claim=True)
    _, followup, _ = rig.submit.take("claim")
    assert followup.recover(T0 + 2) is None
    assert not rig.flow.claiming.claim.busy and rig.flow.claiming.claim_not_before == T0 + 3


def test_reports_go_out_while_a_claim_is_on_the_wire(rig):
    rig.run("a", slot=0)
    rig.maybe_claim(T0 + 1, 2)
    rig.submit.take("claim")
    rig.flow.job_done(JobDone(0, "a", True, {"x": 1}), T0 + 1.1)
    rig.flow.send_reports()
    call, _, first = rig.submit.take("complete")  # not held behind the claim (the pacer orders calls)
    assert body(call) == {"worker_id": "w-1", "lease_id": "L-a", "result": {"x": 1}} and not first


def test_next_deadline_includes_the_claim_only_when_allowed_and_a_child_needs_a_job(rig):
    assert rig.deadline(T0, may_claim=False, idle=2) is None
    assert rig.deadline(T0, may_claim=True, idle=0) is None  # nobody to claim for (prefetch 0)
    assert rig.deadline(T0, may_claim=True, idle=2) == 0.0
    rig.claim(T0, 1, [job("a")])
    assert rig.deadline(T0, may_claim=False, idle=1) == T0 + 10  # its renewal
    assert rig.deadline(T0, may_claim=True, idle=1) == T0 + 10  # the idle child has a job waiting
    assert rig.deadline(T0, may_claim=True, idle=2) == T0  # claim again at once after a full claim
    rig.maybe_claim(T0, 2)
    assert rig.deadline(T0, may_claim=True, idle=2) == T0 + 10  # not while a claim is on the wire


def test_the_claim_deadline_respects_a_back_off_and_the_budget_gate(rig):
    rig.claim(T0, 2, [])
    backoff_at = rig.intake.next_claim_at
    assert rig.deadline(T0, may_claim=True, idle=2) == backoff_at
    assert rig.flow.next_deadline(T0, True, 2, claim_gate=T0 + 3) == T0 + 3


def test_no_claim_while_the_budget_holds(rig):
    rig.maybe_claim(T0, 2, budget_ok=False)
    assert rig.submit.calls == []


# ------------------------------------------------------------------ reporting

def test_report_ok_settles_the_job(rig):
    rig.run("a", slot=0)
    _, followup, _ = rig.finish("a", now=T0 + 2.5)
    entry = rig.entry("a")
    assert followup.answer({}, None, T0 + 2.6) == [JobSettled(entry.pid, "a", "completed")]  # for its child's hooks
    assert rig.entry("a") is None and rig.flow.claiming.drained()
    assert rig.hooks.named("job_settled") == [("job_settled", "q", "completed", 2.5)]


def test_report_of_a_failure_is_labelled_failed(rig):
    rig.run("a", slot=0)
    call, followup, _ = rig.finish("a", ok=False, value="ValueError: x", now=T0 + 1)
    assert body(call)["error"] == "ValueError: x"
    followup.answer({}, None, T0 + 1.1)
    assert rig.hooks.named("job_settled") == [("job_settled", "q", "failed", 1.0)]


@pytest.mark.parametrize("answer", [error(409, "LEASE_EXPIRED"), error(409, "CONFLICT"), error(404, "NOT_FOUND")],
                         ids=["409-lease-expired", "409-already-finished", "404"])
def test_report_refused_because_the_job_is_no_longer_ours_drops_it(rig, answer):
    assert isinstance(answer, (api.LeaseLost, api.AlreadyFinished))
    rig.run("a", slot=0)
    _, followup, _ = rig.finish("a", now=T0 + 1)
    entry = rig.entry("a")
    settled = JobSettled(entry.pid, "a", "lease_lost", str(answer), "complete")
    assert followup.answer(None, answer, T0 + 1.1) == [settled]
    assert rig.entry("a") is None
    assert rig.hooks.named("job_settled") == [("job_settled", "q", "lease_lost", 1.0)]
    assert rig.flow.enforce(T0 + 100) == [] and rig.submit.calls == []  # nothing resent


@pytest.mark.parametrize("answer", [error(503), error(500), timeout_error()], ids=["503", "500", "timeout"])
def test_report_not_delivered_is_resent_at_its_time_and_not_before(rig, answer):
    rig.run("a", slot=0)
    _, followup, _ = rig.finish("a", now=T0 + 1)
    assert followup.answer(None, answer, T0 + 2) == []
    entry = rig.entry("a")
    assert entry is not None and not entry.report.busy
    due = entry.report_due_at
    assert T0 + 2 + 0.1 <= due <= T0 + 2 + 0.2
    assert rig.deadline(T0 + 2) <= due
    rig.flow.enforce(due - 0.001)
    assert rig.submit.routes() == []
    rig.flow.enforce(due)
    call, followup, _ = rig.submit.take("complete")
    assert entry.report_attempts == 2 and entry.report.busy
    rig.flow.enforce(due + 5)
    assert "complete" not in rig.submit.routes()  # one report on the wire at a time
    followup.answer({}, None, due + 0.1)
    assert rig.entry("a") is None


def test_report_retries_back_off_growing(rig):
    rig.run("a", slot=0)
    _, followup, _ = rig.finish("a", now=T0 + 1)
    now = T0 + 1
    for attempt in range(1, 6):
        followup.answer(None, error(502), now)
        wait = rig.entry("a").report_due_at - now
        top = min(15.0, 0.2 * 2 ** (attempt - 1))
        assert top / 2 <= wait <= top
        now += wait
        rig.flow.enforce(now)
        _, followup, _ = rig.submit.take("complete")


def test_report_429_waits_for_retry_after(rig):
    rig.run("a", slot=0)
    _, followup, _ = rig.finish("a", now=T0 + 1)
    followup.answer(None, error(429, "RATE_LIMIT_EXCEEDED", retry_after=12), T0 + 2)
    assert rig.entry("a").report_due_at >= T0 + 14
    rig.flow.enforce(T0 + 13.9)
    assert rig.submit.routes() == ["job_heartbeat"]  # the lease is kept while the report waits
    rig.flow.enforce(rig.entry("a").report_due_at)
    assert rig.submit.routes() == ["job_heartbeat", "complete"]


def test_result_rejected_with_422_becomes_a_failure_report(rig):
    rig.run("a", slot=0)
    _, followup, _ = rig.finish("a", value={"huge": "x"}, now=T0 + 1)
    answer = error(422, "VALIDATION_ERROR")
    assert isinstance(answer, api.Rejected)
    entry = rig.entry("a")  # its child hears of the refusal (an `error` hook), not yet final
    assert followup.answer(None, answer, T0 + 1.1) == [JobSettled(entry.pid, "a", "refused", str(answer), "complete")]
    call, followup, _ = rig.submit.take("fail")
    assert body(call)["error"].startswith("ResultRejected: the API refused this job's result")
    followup.answer({}, None, T0 + 1.2)
    assert rig.entry("a") is None
    assert rig.hooks.named("job_settled") == [("job_settled", "q", "failed", 1.0)]


def test_failure_report_rejected_is_dropped(rig):
    rig.run("a", slot=0)
    _, followup, _ = rig.finish("a", ok=False, value="boom", now=T0 + 1)
    entry = rig.entry("a")
    refused = error(400, "BAD_REQUEST")
    assert followup.answer(None, refused, T0 + 1.1) == [JobSettled(entry.pid, "a", "error", str(refused), "fail")]
    assert rig.entry("a") is None and rig.submit.calls == []


def test_report_401_is_fatal(rig):
    rig.run("a", slot=0)
    _, followup, _ = rig.finish("a", now=T0 + 1)
    facts = followup.answer(None, error(401), T0 + 1.1)
    assert [type(f) for f in facts] == [Fatal] and facts[0].code == exitcodes.AUTH
    assert rig.entry("a") is None


def test_recover_report_resends_a_second_later(rig):
    rig.run("a", slot=0)
    _, followup, _ = rig.finish("a", now=T0 + 1)
    assert followup.recover(T0 + 2) is None
    entry = rig.entry("a")
    assert not entry.report.busy and entry.report_due_at == T0 + 3
    rig.flow.enforce(T0 + 3)
    assert rig.submit.routes() == ["complete"]


def test_answers_for_an_entry_no_longer_held_are_ignored(rig):
    rig.run("a", slot=0)
    _, followup, _ = rig.finish("a", now=T0 + 1)
    rig.claim(T0 + 2, 1, [dict(job("a"), lease_id="L-new")])  # re-issued meanwhile
    new = rig.entry("a")
    before = list(rig.hooks.events)
    for answer in (None, error(503), error(401), error(422)):
        assert followup.answer(None, answer, T0 + 3) == []
    assert followup.recover(T0 + 3) is None
    assert rig.entry("a") is new and new.report_due_at is None and rig.hooks.events == before
    assert rig.submit.calls == []


# ------------------------------------------------------------------ renewals

def test_renewal_is_due_at_a_third_of_the_lease_and_sent_once(rig):
    rig.run("a", slot=0)
    rig.flow.enforce(T0 + 9.99)
    assert rig.submit.routes() == []
    rig.flow.enforce(T0 + 10)
    call, _, first = rig.submit.take("job_heartbeat")
    assert body(call) == {"worker_id": "w-1", "lease_id": "L-a", "lease_duration_secs": 30} and not first
    rig.flow.enforce(T0 + 11)
    rig.flow.enforce(T0 + 25)
    assert rig.submit.routes() == []  # not while one is on the wire


def test_renewal_ok_moves_the_lease_from_when_it_was_sent(rig):
    rig.run("a", slot=0)
    rig.flow.enforce(T0 + 10)
    _, followup, _ = rig.submit.take("job_heartbeat")
    assert followup.answer({}, None, T0 + 12) == []
    entry = rig.entry("a")
    assert entry.lease_until == T0 + 40 and entry.renew_at == T0 + 20 and not entry.renewal.busy
    assert rig.hooks.named("lease_renewed") == [("lease_renewed", "ok")]


@pytest.mark.parametrize("answer", [error(409, "LEASE_EXPIRED"), error(404)], ids=["409", "404"])
def test_renewal_lease_lost_stops_the_child_and_drops_the_job(rig, answer):
    rig.run("a", slot=3)
    rig.flow.enforce(T0 + 10)
    _, followup, _ = rig.submit.take("job_heartbeat")
    pid = rig.entry("a").pid
    assert followup.answer(None, answer, T0 + 10.1) == [JobSettled(pid, "a", "lease_lost", str(answer), "heartbeat"),
                                                         StopJob(3, "a", "lease_lost")]
    assert rig.entry("a") is None
    assert ("lease_renewed", "lost") in rig.hooks.events
    assert ("job_settled", "q", "lease_lost", None) in rig.hooks.events


def test_renewal_error_retries_soon(rig):
    rig.run("a", slot=0)
    rig.flow.enforce(T0 + 10)
    _, followup, _ = rig.submit.take("job_heartbeat")
    assert followup.answer(None, error(503), T0 + 11) == []
    entry = rig.entry("a")
    assert not entry.renewal.busy and T0 + 11 + 1.0 <= entry.renew_at <= T0 + 11 + 2.0
    assert rig.hooks.named("lease_renewed") == [("lease_renewed", "error")]
    rig.flow.enforce(entry.renew_at)
    assert rig.submit.routes() == ["job_heartbeat"]


def test_renewal_refused_once_the_outcome_is_known_is_no_lost_lease(rig):
    rig.run("a", slot=0)
    rig.flow.enforce(T0 + 10)
    _, renew, _ = rig.submit.take("job_heartbeat")
    rig.finish("a", now=T0 + 10.05)  # `complete` on the wire
    assert renew.answer(None, error(409, "CONFLICT"), T0 + 10.1) == []
    entry = rig.entry("a")
    assert entry is not None and entry.renew_at == T0 + 12.1
    assert rig.hooks.named("lease_renewed") == [] and rig.hooks.named("job_settled") == []


def test_renewal_401_is_fatal(rig):
    rig.run("a", slot=0)
    rig.flow.enforce(T0 + 10)
    _, followup, _ = rig.submit.take("job_heartbeat")
    facts = followup.answer(None, error(401), T0 + 10.1)
    assert [type(f) for f in facts] == [Fatal] and facts[0].code == exitcodes.AUTH
    assert rig.entry("a").renew_at == T0 + 12.1


def test_recover_renew_retries_a_second_later(rig):
    rig.run("a", slot=0)
    rig.flow.enforce(T0 + 10)
    _, followup, _ = rig.submit.take("job_heartbeat")
    assert followup.recover(T0 + 11) is None
    assert not rig.entry("a").renewal.busy and rig.entry("a").renew_at == T0 + 12


def test_renewal_answer_for_a_settled_job_is_ignored(rig):
    rig.run("a", slot=0)
    rig.flow.enforce(T0 + 10)
    _, renew, _ = rig.submit.take("job_heartbeat")
    _, report, _ = rig.finish("a", now=T0 + 10.05)
    report.answer({}, None, T0 + 10.06)
    assert renew.answer(None, error(409, "LEASE_EXPIRED"), T0 + 10.1) == []
    assert rig.hooks.named("lease_renewed") == []


# ------------------------------------------------------------------ timeouts

def test_timeout_stops_the_child_and_fails_the_job(rig):
    rig.claim(T0, 1, [job("a", timeout_seconds=5)])
    rig.flow.started(rig.entry("a"), fake_child(2, pid=4242), T0 + 3)  # waited 3 s for a child
    assert rig.flow.enforce(T0 + 5.5) == []  # 5 s after the claim: not yet, it counts from the start
    assert rig.flow.enforce(T0 + 7.99) == []
    assert rig.flow.enforce(T0 + 8) == [StopJob(2, "a", "timeout")]
    call, followup, _ = rig.submit.take("fail")
    assert body(call)["error"].startswith("JobTimeout: the job ran past its timeout of 5 s")
    assert "pid 4242" in body(call)["error"]
    assert rig.flow.enforce(T0 + 9) == []  # once
    followup.answer({}, None, T0 + 8.1)
    assert rig.hooks.named("job_settled") == [("job_settled", "q", "timed_out", 5.0)]


def test_a_job_without_timeout_never_times_out(rig):
    rig.run("a", slot=0, timeout_seconds=0)
    assert rig.flow.enforce(T0 + 1e6) == []
    assert rig.submit.routes().count("fail") == 0


# ------------------------------------------------------------------ what children did

def test_child_lost_fails_its_job_with_the_error_and_label(rig):
    rig.run("a", slot=1)
    rig.run("b", slot=0)
    lost = ChildLost(1, "ChildProcessDied: the child process running this job (pid 7) killed by SIGKILL", "crashed")
    assert rig.flow.child_lost(lost, T0 + 2) is None
    call, followup, _ = rig.submit.take("fail")
    assert call.path.endswith("/jobs/a/fail") and body(call)["error"] == lost.error
    followup.answer({}, None, T0 + 2.1)
    assert rig.hooks.named("job_settled") == [("job_settled", "q", "crashed", 2.0)]
    assert rig.entry("b").slot == 0  # the other child's job is untouched


def test_child_lost_on_a_slot_without_a_job_does_nothing(rig):
    rig.run("a", slot=0)
    assert rig.flow.child_lost(ChildLost(5, "x", "crashed"), T0 + 1) is None
    assert rig.submit.calls == [] and rig.entry("a").outcome is None


def test_job_done_for_a_job_no_longer_held_is_dropped(rig):
    rig.run("a", slot=0)
    assert rig.flow.job_done(JobDone(0, "zzz", True, 1), T0 + 1) is None
    assert rig.flow.job_done(JobDone(4, "a", True, 1), T0 + 1) is None  # not the child that runs it
    rig.flow.send_reports()
    assert rig.flow.settling.unsent == [] and rig.submit.calls == [] and rig.entry("a").outcome is None


def test_job_done_frees_the_claim_back_off(rig):
    rig.run("a", slot=0)
    rig.claim(T0 + 1, 2, [])  # empty: back off
    assert rig.intake.next_claim_at > T0 + 1
    rig.flow.job_done(JobDone(0, "a", True, 1), T0 + 1.01)
    assert rig.intake.next_claim_at == T0 + 1.01


def test_assignments_pair_idle_children_with_waiting_jobs_oldest_first(rig):
    rig.claim(T0, 3, [job("a"), job("b"), job("c")])
    children = [fake_child(0), fake_child(1)]
    pairs = rig.flow.claiming.assignments(children)
    assert [(c.slot, e.id) for c, e in pairs] == [(0, "a"), (1, "b")]



def test_an_outcome_not_yet_sent_is_due_at_once(rig):
    rig.run("a", slot=0)
    rig.flow.job_done(JobDone(0, "a", True, 1), T0 + 1)
    assert rig.deadline(T0 + 1) == 0.0
    rig.flow.send_reports()
    assert rig.deadline(T0 + 1) == T0 + 10




# ------------------------------------------------------------------ claim-ahead, queues in priority, until-empty

def test_claim_ahead_measures_the_round_trip_and_claims_for_a_child_about_to_finish():
    rig = Rig(prefetch=None)  # auto
    rig.claim(T0, 2, [job("a"), job("b")], answer_at=T0 + 0.02)
    assert rig.flow.claiming.claim_rtt.value == pytest.approx(0.02)
    for n, job_id in enumerate(("a", "b")):
        rig.flow.started(rig.entry(job_id), fake_child(n), T0 + 0.02)
    rig.flow.job_done(JobDone(0, "a", True, 1), T0 + 0.07)  # ran 50 ms; "b" is due about now too
    assert rig.intake.run_time.value == pytest.approx(0.05)
    rig.maybe_claim(T0 + 0.07, 1)
    call, _, _ = rig.submit.take("claim")
    # the idle child, the one about to finish, and a batch of four (100 ms of starts at 40 a second)
    assert body(call)["limit"] == 6


def test_claim_ahead_with_prefetch_n_reserves_at_most_n():
    rig = Rig(prefetch=1)
    rig.claim(T0, 2, [job("a"), job("b")], answer_at=T0 + 0.02)
    for n, job_id in enumerate(("a", "b")):
        rig.flow.started(rig.entry(job_id), fake_child(n), T0 + 0.02)
    rig.flow.job_done(JobDone(0, "a", True, 1), T0 + 0.07)
    rig.maybe_claim(T0 + 0.07, 1)
    call, _, _ = rig.submit.take("claim")
    assert body(call)["limit"] == 2


def test_claim_ahead_wakes_when_the_next_busy_child_comes_within_the_horizon():
    rig = Rig(prefetch=None)
    rig.claim(T0, 2, [job("a"), job("b")], answer_at=T0 + 0.02)
    for n, job_id in enumerate(("a", "b")):
        rig.flow.started(rig.entry(job_id), fake_child(n), T0 + 0.02)
    rig.flow.job_done(JobDone(0, "a", True, 1), T0 + 1.02)  # 1 s jobs
    rig.claim(T0 + 1.02, 1, [job("c")], answer_at=T0 + 1.04)
    rig.flow.started(rig.entry("c"), fake_child(0), T0 + 1.04)
    rig.flow.send_reports()
    rig.submit.take("complete")
    # "b" was due to end near T0 + 1.02 and still runs: its child is inside the horizon, so a claim is due now
    assert rig.deadline(T0 + 1.5, may_claim=True, idle=0) <= T0 + 1.5
    # once "b" is done (and its report sent), "c" (ends near T0 + 2.04) is the next one: wake within its horizon
    rig.flow.job_done(JobDone(1, "b", True, 1), T0 + 1.5)
    rig.flow.send_reports()
    rig.submit.take("complete")
    at = rig.deadline(T0 + 1.5, may_claim=True, idle=0)
    # the run-time estimate grew with "b"'s 1.48 s (EWMA 1.096 s): "c" ends near T0 + 2.136
    assert at is not None and T0 + 2.0 < at < T0 + 2.136


def test_queues_are_claimed_in_strict_priority_skipping_one_that_backs_off():
    rig = Rig(queues=("hi", "lo"))
    rig.maybe_claim(T0, 1)
    call, followup, _ = rig.submit.take("claim")
    assert body(call)["queue_name"] == "hi"
    followup.answer([], None, T0)  # hi is empty: it backs off
    rig.maybe_claim(T0, 1)
    call, followup, _ = rig.submit.take("claim")
    assert body(call)["queue_name"] == "lo"
    followup.answer([dict(job("x"), queue_name="lo")], None, T0)
    rig.maybe_claim(rig.flow.claiming.queues["hi"].next_claim_at, 2)  # "x" waits for one of the two idle children
    call, _, _ = rig.submit.take("claim")
    assert body(call)["queue_name"] == "hi"  # back to the first queue once its back-off ends


def test_no_claim_while_every_queue_backs_off(rig):
    rig.claim(T0, 1, [])
    rig.maybe_claim(T0 + 0.001, 1)
    assert rig.submit.calls == []


def test_exhausted_once_every_queue_came_back_short_and_nothing_is_held():
    rig = Rig(queues=("hi", "lo"))
    assert not rig.flow.claiming.exhausted()
    rig.maybe_claim(T0, 1)
    rig.submit.take("claim")[1].answer([], None, T0)
    assert not rig.flow.claiming.exhausted()  # "lo" not asked yet
    rig.maybe_claim(T0, 1)
    rig.submit.take("claim")[1].answer([dict(job("x"), queue_name="lo")], None, T0)
    assert not rig.flow.claiming.exhausted()  # a job is held (and lo gave all it was asked)
    assert rig.flow.claiming.reserved() == 1


def test_reserve_waits_are_measured_from_claim_to_start(rig):
    assert rig.flow.claiming.reserve_wait_ms() is None
    rig.claim(T0, 1, [job("a")])
    rig.flow.started(rig.entry("a"), fake_child(0), T0 + 0.25)
    assert rig.flow.claiming.reserve_wait_ms() == {"p50": 250.0, "p99": 250.0, "samples": 1}


def test_an_outcome_voided_in_the_same_turn_is_not_reported(rig):
    # One turn of the arbiter: the child's `done` frame is read first (job_done -> unsent), then the API
    # answers come in (a claim that hands the same job out again under a new lease), then feed_children
    # calls send_reports.
    rig.run("a", slot=0)
    rig.maybe_claim(T0 + 1, 2)
    _, claim, _ = rig.submit.take("claim")
    rig.flow.job_done(JobDone(0, "a", True, {"v": 1}), T0 + 40)
    claim.answer([dict(job("a"), lease_id="L-new")], None, T0 + 40)  # the old lease is void
    rig.flow.send_reports()
    assert "complete" not in rig.submit.routes(), "a report was sent for a job no longer held, under its old lease"


def test_by_queue_counts_held_and_reserved_jobs_per_queue_in_priority_order():
    rig = Rig(queues=("hi", "lo"))
    rig.claim(T0, 2, [job("a", queue_name="hi"), job("b", queue_name="lo")], answer_at=T0 + 0.02)
    rig.flow.started(rig.entry("a"), fake_child(0), T0 + 0.02)
    counts = rig.flow.claiming.by_queue()
    assert list(counts) == ["hi", "lo"]
    assert counts["hi"] == {"inflight": 1, "reserved": 0, "empty": False}
    assert counts["lo"] == {"inflight": 1, "reserved": 1, "empty": False}


# ------------------------------------------------------------------ a queue's history, before the first claim

def short_history(mean_ms: float = 20.0) -> dict:
    return {"completed_jobs_24h": HISTORY_MIN_JOBS, "avg_processing_time_ms": mean_ms}


def test_a_queues_statistics_are_asked_on_the_first_turn_before_the_daemon_may_claim():
    rig = Rig(prefetch=None)
    rig.maybe_claim(T0, 2, may_claim=False)  # registering: no claim yet
    _, followup, _ = rig.submit.take("queue_stats")
    assert rig.submit.routes() == []
    rig.maybe_claim(T0 + 0.01, 2, may_claim=False)
    assert rig.submit.routes() == []  # asked once
    assert followup.answer(short_history(), None, T0 + 0.05) is None
    assert rig.intake.run_time.value == pytest.approx(0.02) and rig.flow.claiming.claim_rtt.value == pytest.approx(0.05)


def test_with_a_short_history_the_first_claim_reaches_past_the_idle_children():
    rig = Rig(prefetch=None)
    rig.maybe_claim(T0, 2, may_claim=False)
    rig.submit.take("queue_stats")[1].answer(short_history(), None, T0 + 0.05)
    rig.maybe_claim(T0 + 0.1, 2)
    call, _, _ = rig.submit.take("claim")
    assert body(call)["limit"] > 2  # the first jobs, the next ones the children hold, and a batch


@pytest.mark.parametrize("stats", [{"completed_jobs_24h": 0, "avg_processing_time_ms": None}, short_history(5000.0)])
def test_without_a_short_history_the_first_claim_is_for_the_idle_children_only(stats):
    rig = Rig(prefetch=None)
    rig.maybe_claim(T0, 2, may_claim=False)
    rig.submit.take("queue_stats")[1].answer(stats, None, T0 + 0.05)
    assert rig.intake.run_time.value is None and rig.flow.claiming.claim_rtt.value is None
    rig.maybe_claim(T0 + 0.1, 2)
    assert body(rig.submit.take("claim")[0])["limit"] == 2


@pytest.mark.parametrize("cfg, rate", [({"prefetch": 0}, None), ({"prefetch": None}, 5.0)])
def test_scarce_requests_ask_no_statistics(cfg, rate):
    rig = Rig(**cfg)
    rig.maybe_claim(T0, 2, rate=rate)
    assert rig.submit.routes() == ["claim"]
