"""The job flow: claim just ahead of need, hand jobs over, renew leases, enforce timeouts, report
outcomes, and give up on work whose lease is lost.

`JobFlow` alone owns the in-flight table and the claim timing. It never changes a child: the
arbiter tells it which children are idle and what they answered (`job_done`, `child_lost`), and it
answers with facts (`StopJob` for a child whose job it gave up on, `Fatal` on a 401). Every API
call goes out through `submit(call, followup)` and comes back to the followup's methods.

Claiming (supervisor.parent.intake decides how many): one claim on the wire at a time, for the
children that are idle or will be within about two claim round trips, plus a batch when jobs are
short or requests are scarce. Queues are served in strict priority: a claim goes to the first queue
that is not backing off after coming back empty (or short); a queue that just gave a job is asked
again as soon as a child frees up, an empty one on its back-off (50 ms doubling to --poll-interval), or,
while the events stream is live (supervisor.parent.wake), when a job is announced there, else every 15 s.
"""

from __future__ import annotations

import logging
import math
import random
from functools import partial
from logging import DEBUG, ERROR, INFO, WARNING

from supervisor import exitcodes
from supervisor.backoff import backoff
from supervisor.client import rest as api
from supervisor.client.transport import Transport
from supervisor.config import Config
from supervisor.ops.logs import log_event
from supervisor.ops.nullhooks import NullHooks
from supervisor.parent.childproc import Child
from supervisor.parent.facts import (
    ChildLost,
    Fact,
    Fatal,
    Followup,
    Heard,
    JobDone,
    JobReturned,
    JobStarted,
    Listening,
    RecallJob,
    StopJob,
    Submit,
)
from supervisor.parent.inflight import Entry, InFlight, Outcome
from supervisor.parent.intake import (
    Ewma,
    Need,
    Tail,
    claim_size,
    history_run_time,
    hold_overdue,
    may_hold,
    next_need_at,
)
from supervisor.parent.single import OneAtATime
from supervisor.parent.wake import SAFETY_POLL

log = logging.getLogger("supervisor")

HELD_LEASE_MARGIN = 1.0  # seconds: a held job is started by its child only this long before its lease ends
RETRY_JITTER = 0.55  # seconds: the server adds up to 0.5 s to a retry's back-off


class QueueIntake:
    """Claim timing of one queue."""

    def __init__(self, name: str):
        self.name = name
        self.next_claim_at = 0.0  # claim no sooner (empty-queue back-off; now when it gave a job)
        self.empty_claims = 0  # claims in a row that found fewer jobs than asked
        self.run_time = Ewma()  # how long its jobs run (s)
        self.history_asked = False  # its statistics were asked for (once: they may seed `run_time`)
        self.hinted_at = -math.inf  # when the events stream last announced a job here
        self.retries_due: list[float] = []  # when jobs this daemon failed come due again (no event tells)

    def ask_history(self) -> bool:
        """True the first time only: its statistics are asked for once."""
        asked, self.history_asked = self.history_asked, True
        return not asked

    def answered(self, asked: int, got: int, now: float, poll_interval: float, listening: bool = False,
                 sent_at: float = -math.inf) -> None:
        """A claim sent at `sent_at` got `got` of `asked` jobs. Short: ask again at once if a job was
        announced since it was sent; else, while the events stream is live, on the slow safety poll;
        else on the back-off (50 ms doubling to `poll_interval`)."""
        self.retries_due = [t for t in self.retries_due if t > sent_at]  # the claim looked after those
        if got < asked:
            self.empty_claims += 1
            if self.hinted_at >= sent_at:
                self.next_claim_at = now
            elif listening:
                safety = now + random.uniform(0.8, 1.0) * max(poll_interval, SAFETY_POLL)
                self.next_claim_at = min([safety, *self.retries_due])
            else:
                self.next_claim_at = now + backoff(self.empty_claims, 0.05, poll_interval)
        else:
            self.empty_claims = 0
            self.next_claim_at = now

    def hinted(self, now: float) -> None:
        """The events stream announced a job here (or asks for a re-check): claim as soon as a child is free."""
        self.hinted_at = now
        self.next_claim_at = min(self.next_claim_at, now)

    def retry_due(self, at: float) -> None:
        """A job this daemon failed comes back to the queue at `at` (the server's retry back-off): nothing
        announces that, so claim then rather than at the safety poll."""
        self.retries_due.append(at)
        if self.next_claim_at > at:
            self.next_claim_at = at

    def gave_work(self, now: float, duration: float | None) -> None:
        """One of its jobs ended after `duration` seconds: a child is free and this queue had work."""
        if duration is not None:
            self.run_time.add(duration)
        self.next_claim_at = min(self.next_claim_at, now)


class JobFlow:
    def __init__(self, cfg: Config, client: Transport, submit: Submit, hooks: NullHooks):
        self.cfg = cfg
        self.api = client  # builds the calls
        self.submit = submit  # the arbiter's HTTP client
        self.hooks = hooks
        self.inflight = InFlight(cfg.lease)  # every job this worker holds
        self.queues = {name: QueueIntake(name) for name in cfg.queues}  # in priority order
        self.claim = OneAtATime()  # a claim on the wire
        self.unsent: list[Entry] = []  # outcomes recorded this turn, sent by send_reports
        self.claim_not_before = 0.0  # after a failed claim: a back-off no freed child may cut short
        self.claim_failures = 0  # claims in a row that failed
        self.claim_rtt = Tail()  # claim round trip (s): the 90th percentile of the last 32 measured
        self.settled = 0  # jobs whose outcome (complete or fail) the API acknowledged
        self.reserve_waits: list[float] = []  # seconds jobs waited claimed-but-not-started, last 1000
        self.listening = False  # the events stream is live: empty queues are polled slowly
        self.starting = True  # waiting jobs go to idle children; False once stop_starting()

    # ------------------------------------------------------------ reading
    def drained(self) -> bool:
        """Nothing left to finish: no job held (or, after stop_starting, none but the unstarted reserve)."""
        if self.claim.busy:
            return False
        return not self.inflight.jobs if self.starting else self.inflight.waiting_count() == len(self.inflight)

    def next_deadline(self, now: float, may_claim: bool, idle: int, claim_gate: float = 0.0) -> float | None:
        """The earliest time this part must act: a lease to renew, a timeout, a report to resend, or
        (when `may_claim`: registered and running) the next claim: now-ish when children are idle, or
        when the starts within the claim horizon will outnumber the jobs waiting; never before
        `claim_gate` (the request budget's say)."""
        times = [t for t in (self.inflight.next_deadline(),) if t is not None]
        if may_claim and not self.claim.busy:
            soonest = max(min(q.next_claim_at for q in self.queues.values()), self.claim_not_before, claim_gate)
            if idle > self.inflight.waiting_count():
                times.append(soonest)  # a child is idle with no job waiting for it
            elif self.cfg.prefetch != 0:
                need = self._need(now, idle)
                need_at = now if claim_size(need) > 0 else next_need_at(now, need)  # now: inside the horizon
                if need_at is not None:
                    times.append(max(need_at, soonest))
        if self.unsent:
            times.append(0.0)
        return min(times) if times else None

    def reserve_wait_ms(self) -> dict | None:
        """p50 / p99 of the time jobs waited claimed-but-not-started (the last 500 to 1000 starts)."""
        waits = sorted(self.reserve_waits)
        if not waits:
            return None
        at = lambda p: round(1000 * waits[min(len(waits) - 1, int(p * (len(waits) - 1) + 0.5))], 2)  # noqa: E731
        return {"p50": at(0.5), "p99": at(0.99), "samples": len(waits)}

    def exhausted(self) -> bool:
        """Every queue's last claim found fewer jobs than asked, and nothing is held or being claimed:
        what `--until-empty` waits for."""
        return (not self.inflight.jobs and not self.claim.busy
                and all(q.empty_claims > 0 for q in self.queues.values()))

    def by_queue(self) -> dict[str, dict]:
        """Per queue, in priority order: jobs held (`inflight`), of them not yet started (`reserved`), and
        whether its last claim came back short (`empty`) — for /status, read on the health server's thread, so
        it iterates copies of the tables the loop changes."""
        out = {name: {"inflight": 0, "reserved": 0, "empty": q.empty_claims > 0} for name, q in self.queues.items()}
        for key, entries in (("inflight", list(self.inflight.jobs.values())), ("reserved", self.inflight.waiting()),
                             ("reserved", self.inflight.held())):
            for e in entries:
                if e.queue in out:
                    out[e.queue][key] += 1
        return out

    def reserved(self) -> int:
        """Jobs claimed and not yet started: the reserve (those held by busy children included)."""
        return self.inflight.waiting_count() + self.inflight.held_count()

    def held(self) -> int:
        """Jobs sent ahead to busy children and not started yet."""
        return self.inflight.held_count()

    def job_fields(self, entry: Entry, now: float) -> dict:
        """What every job log line carries: job_id, queue, worker_id, the child's pid and the duration so far."""
        duration = entry.duration
        if duration is None:
            duration = now - entry.started_at if entry.started_at is not None else 0.0
        return {"job_id": entry.id, "queue": entry.queue, "worker_id": self.cfg.worker_id, "pid": entry.pid,
                "duration": round(duration, 4)}

    # ------------------------------------------------------------ what children did
    def job_done(self, fact: JobDone, now: float) -> None:
        """A child answered for its job: record the outcome; `send_reports` tells the API."""
        entry = self.inflight.get(fact.job_id)
        if entry is None or entry.slot != fact.slot:
            log_event(log, DEBUG, "result for a job no longer held; dropped", job_id=fact.job_id, slot=fact.slot)
            return
        self.inflight.finish(entry, Outcome(fact.ok, fact.value, "completed" if fact.ok else "failed"), now)
        self.unsent.append(entry)
        intake = self.queues.get(entry.queue)
        if intake is not None:
            intake.gave_work(now, entry.duration)  # ask it again at once

    def child_lost(self, fact: ChildLost, now: float) -> None:
        """The child on `fact.slot` stopped without answering: fail the job it ran, if any."""
        entry = self.inflight.on_child(fact.slot)
        if entry is None:
            return
        if fact.outcome == "crashed":
            log_event(log, ERROR, "child died during a job", cause=fact.error, **self.job_fields(entry, now))
        self._fail(entry, fact.error, now, fact.outcome)

    def job_started(self, fact: JobStarted, now: float) -> list[Fact]:
        """A child started the job it held (at `fact.at`): its timeout counts from then. A job no longer
        held for that child (its lease was lost meanwhile) has its child stopped."""
        entry = self.inflight.get(fact.job_id)
        if entry is None or not entry.held or entry.slot != fact.slot:
            log_event(log, WARNING, "a child started a job no longer held for it; stopping it", job_id=fact.job_id,
                      slot=fact.slot)
            return [StopJob(fact.slot, fact.job_id, "lease_lost")]
        self._start(entry, fact.slot, entry.pid, fact.at)
        return []

    def job_returned(self, fact: JobReturned, now: float) -> None:
        """A child gave back its held job unstarted: it waits for a child again."""
        entry = self.inflight.get(fact.job_id)
        kept = entry is not None and entry.held and entry.slot == fact.slot
        if entry is not None and kept:
            self.inflight.unhold(entry)
        log_event(log, DEBUG, "held job returned", job_id=fact.job_id, slot=fact.slot, kept=kept)

    def hand_back_reserved(self, error: str, now: float) -> None:
        """Give every reserved job (claimed, not started) back to the queue, failed with `error` (the API has
        no release: a fail puts it back, to be retried, by this worker or another)."""
        for entry in self.inflight.waiting():
            log_event(log, INFO, "handing a reserved job back", error=error, **self.job_fields(entry, now))
            self._fail(entry, error, now, "failed")

    def assignments(self, idle: list[Child]) -> list[tuple[Child, Entry]]:
        """Which idle child takes which waiting job, oldest job first (none after stop_starting)."""
        if not self.starting or not idle or not self.inflight.waiting_count():
            return []
        return list(zip(idle, self.inflight.waiting(), strict=False))

    def stop_starting(self) -> None:
        """Hand no more waiting jobs to children. They stay held (leases renewed) until deregistering hands
        them back to the queue unaltered: the API has no route that releases one job, and failing it would
        spend one of its retries."""
        self.starting = False

    def holds(self, busy: list[Child], now: float) -> list[tuple[Child, Entry]]:
        """Which busy child (of those that may hold one) is sent which waiting job ahead, to start it the
        moment its own job ends: only jobs of queues whose jobs are short, for children whose job is
        expected to end soon, the soonest first; never with --prefetch 0 or after stop_starting."""
        if self.cfg.prefetch == 0 or not self.starting or not busy or not self.inflight.waiting_count():
            return []
        ready = []
        for c in busy:
            job = self.inflight.on_child(c.slot)
            ready.append((self._time_left(job, now, overdue=True) if job is not None else math.inf, c.slot, c))
        ready.sort()
        out = []
        children = iter(ready)
        for entry in self.inflight.waiting():
            intake = self.queues.get(entry.queue)
            if intake is None or not may_hold(intake.run_time.value, 0.0):
                continue
            remaining, _, child = next(children, (math.inf, 0, None))
            if child is None or not may_hold(intake.run_time.value, remaining):
                break
            out.append((child, entry))
        return out

    def start_by(self, entry: Entry) -> float:
        """The latest time a child may start the held `entry` on its own: a margin before its lease (as
        last renewed) runs out. Later, the child gives it back and the parent decides."""
        return entry.lease_until - min(HELD_LEASE_MARGIN, self.cfg.lease / 10.0)

    def hold(self, entry: Entry, child: Child) -> None:
        """`entry` was sent ahead to the busy `child`."""
        self.inflight.hold(entry, child.slot, child.pid)
        log_event(log, DEBUG, "job held", job_id=entry.id, slot=child.slot)

    def _overdue(self, e: Entry, now: float) -> bool:
        intake = self.queues.get(e.queue)
        return e.started_at is not None and hold_overdue(intake.run_time.value if intake else None,
                                                         now - e.started_at)

    def recall_held(self) -> list[Fact]:
        """Ask for every held job back (a drain begins: no child starts a job on its own from now on)."""
        return [RecallJob(e.slot, e.id) for e in self.inflight.held() if e.slot is not None]

    def started(self, entry: Entry, child: Child, now: float) -> None:
        self._start(entry, child.slot, child.pid, now)

    def _start(self, entry: Entry, slot: int, pid: int | None, now: float) -> None:
        self.inflight.start(entry, slot, pid, now)
        waits = self.reserve_waits
        waits.append(now - entry.claimed_at)
        if len(waits) > 1000:
            del waits[:500]
        log_event(log, DEBUG, "job started", **self.job_fields(entry, now))

    # ------------------------------------------------------------ claiming
    def maybe_claim(self, now: float, idle: int, procs: int, may_claim: bool, budget_ok: bool = True,
                    rate: float | None = None) -> None:
        """Claim for the children that are idle or soon will be (intake.claim_size), from the first queue
        not backing off; one claim on the wire at a time, none while a back-off or the budget holds."""
        if not may_claim or not budget_ok or self.claim.busy or now < self.claim_not_before:
            return
        intake = next((q for q in self.queues.values() if now >= q.next_claim_at), None)
        if intake is None:
            return
        size = claim_size(self._need(now, idle, procs, rate))
        if size <= 0:
            return
        self.claim.start()
        call = self.api.claim_call(intake.name, self.cfg.worker_id, size, self.cfg.lease)
        self.submit(call, self.claim.followup(partial(self.on_claim, intake, size, now), self.recover_claim),
                    first=True)
        if self.cfg.prefetch != 0 and not rate and intake.run_time.value is None and intake.ask_history():
            self.submit(self.api.queue_stats_call(intake.name), Followup(partial(self.on_history, intake),
                                                                         lambda now: None))

    def on_history(self, intake: QueueIntake, stats, error, now: float) -> None:
        """A queue's statistics (asked with its first claim while no run time is known, unless requests
        are scarce: --prefetch 0, a request budget): when they say its jobs are short, their mean seeds
        the run time, so the next claims reach ahead (claim_size) before any job of this daemon ends."""
        seed = history_run_time(stats) if error is None else None
        if seed is not None:
            intake.run_time.seed(seed)
            log_event(log, DEBUG, "run time seeded from the queue's statistics", queue=intake.name,
                      run_time=round(seed, 4))

    def _need(self, now: float, idle: int, procs: int | None = None, rate: float | None = None) -> Need:
        return Need(idle=idle, waiting=self.reserved(), remaining=self._busy_remaining(now),
                    procs=procs or self.cfg.procs, rtt=self.claim_rtt.value, run_time=self._run_time(),
                    prefetch=self.cfg.prefetch, rate=rate)

    def _run_time(self) -> float | None:
        """The shortest run-time estimate among the queues (the one that wants claiming most often)."""
        values = [q.run_time.value for q in self.queues.values() if q.run_time.value is not None]
        return min(values) if values else None

    def _busy_remaining(self, now: float) -> tuple[float, ...]:
        """Expected seconds left of each running job (inf where its queue has no estimate yet)."""
        return tuple(self._time_left(e, now) for e in self.inflight.running())

    def _time_left(self, e: Entry, now: float, overdue: bool = False) -> float:
        """Expected seconds left of the running job `e` (inf where its queue has no estimate yet, and with
        `overdue` where it has run well past it)."""
        if overdue and self._overdue(e, now):
            return math.inf
        intake = self.queues.get(e.queue)
        est = intake.run_time.value if intake is not None else None
        return math.inf if est is None or e.started_at is None else max(0.0, e.started_at + est - now)

    def on_claim(self, intake: QueueIntake, asked: int, sent_at: float, jobs, error, now: float) -> list[Fact]:
        """A claim's answer: take its jobs into the table (or back off after a failed claim)."""
        if error is not None:
            return self._claim_failed(error, now)
        self.claim_rtt.add(now - sent_at)
        self.claim_failures = 0
        self.claim_not_before = 0.0
        facts: list[Fact] = []
        taken = 0
        for job in jobs:
            if not isinstance(job, dict) or not isinstance(job.get("id"), str) or not job.get("lease_id"):
                log_event(log, ERROR, "claim answer holds a job without an id or lease_id; ignored", job=str(job)[:200])
                continue
            facts += self._take_claimed(job, sent_at, now)
            taken += 1
        self.hooks.claimed(taken)
        intake.answered(asked, len(jobs), now, self.cfg.poll_interval, self.listening, sent_at)
        return facts

    def heard(self, fact: Heard, now: float) -> None:
        """News from the events stream. A job announced on a queue (None: some queue of ours): claim there
        now. The stream went live or down: jobs may have been created unannounced, so re-check every
        queue now; while it is live, an empty queue is polled only every SAFETY_POLL seconds."""
        if isinstance(fact, Listening):
            self.listening = fact.live
        for intake in self.queues.values():
            if isinstance(fact, Listening) or fact.queue is None or intake.name == fact.queue:
                intake.hinted(now)

    def recover_claim(self, now: float) -> None:
        """Handling a claim's answer raised: claim again after a second."""
        self.claim_not_before = now + 1.0

    def _claim_failed(self, error: api.ApiError, now: float) -> list[Fact]:
        self.claim_failures += 1
        if isinstance(error, api.Unauthorized):
            return [Fatal(exitcodes.AUTH, str(error))]
        wait = backoff(self.claim_failures, 0.2, max(self.cfg.poll_interval, 5.0))
        if isinstance(error, api.RateLimited) and error.retry_after is not None:
            wait = max(wait, float(error.retry_after))
        log_event(log, WARNING if self.claim_failures <= 3 or self.claim_failures % 20 == 0 else DEBUG,
                  "claim failed", error=str(error), retry_in=round(wait, 2), failures=self.claim_failures)
        self.claim_not_before = now + wait
        return []

    def _take_claimed(self, job: dict, sent_at: float, now: float) -> list[Fact]:
        """Add a claimed job to the table. The same id again means the server re-issued it (our lease had
        expired): the old copy's work and answers are void."""
        facts: list[Fact] = []
        old = self.inflight.get(job["id"])
        if old is not None:
            facts = self._lease_lost(old, "the server handed this job out again under a new lease", now)
        self.inflight.add(job, sent_at)
        log_event(log, DEBUG, "job claimed", job_id=job["id"], queue=job.get("queue_name"),
                  worker_id=self.cfg.worker_id)
        return facts

    # ------------------------------------------------------------ reporting
    def send_reports(self) -> None:
        """Send the outcomes recorded since the last call (after this turn's claim, which goes first)."""
        unsent, self.unsent = self.unsent, []
        for entry in unsent:
            if self.inflight.holds(entry):
                self._report(entry)

    def _report(self, entry: Entry) -> None:
        """Tell the API how the job ended (complete or fail), once at a time; retried by on_report."""
        if entry.outcome is None or not self.inflight.begin_report(entry):
            return
        out = entry.outcome
        if out.ok:
            call = self.api.complete_call(entry.id, self.cfg.worker_id, entry.lease_id, out.value)
        else:
            call = self.api.fail_call(entry.id, self.cfg.worker_id, entry.lease_id, out.value)
        self.submit(call, entry.report.followup(partial(self.on_report, entry), partial(self.recover_report, entry)))

    def on_report(self, entry: Entry, _result, error, now: float) -> list[Fact]:
        if not self.inflight.holds(entry) or entry.outcome is None:
            return []  # settled or void meanwhile (lease lost, handed out again)
        self.inflight.report_answered(entry)
        out = entry.outcome
        fields = self.job_fields(entry, now)
        if error is None:
            self.inflight.pop(entry.id)
            self.settled += 1
            self.hooks.job_finished(entry.queue, out.label, entry.duration)
            if out.ok:
                log_event(log, INFO, "job completed", **fields)
            else:
                log_event(log, WARNING, "job failed", error=str(out.value)[:300], **fields)
                self._expect_retry(entry, now)
            return []
        if isinstance(error, (api.LeaseLost, api.AlreadyFinished)):
            self.inflight.pop(entry.id)
            self.hooks.job_finished(entry.queue, "lease_lost", entry.duration)
            log_event(log, WARNING, f"{out.verb} refused: this worker no longer holds the job; outcome dropped",
                      error=str(error), **fields)
        elif isinstance(error, api.Unauthorized):
            self.inflight.pop(entry.id)
            return [Fatal(exitcodes.AUTH, str(error))]
        elif isinstance(error, api.Rejected) and out.ok:
            log_event(log, ERROR, "the API refused the result; failing the job instead", error=str(error), **fields)
            self.inflight.replace_outcome(entry, Outcome(False, f"ResultRejected: the API refused this job's result: "
                                                                f"{error}", "failed"))
            self._report(entry)
        elif isinstance(error, api.Rejected):
            self.inflight.pop(entry.id)
            log_event(log, ERROR, "the API refused the failure report; job left to its lease", error=str(error),
                      **fields)
        else:
            wait = backoff(entry.report_attempts, 0.2, 15.0)
            if isinstance(error, api.RateLimited) and error.retry_after:
                wait = max(wait, float(error.retry_after))
            log_event(log, WARNING, f"{out.verb} not delivered yet; will retry", error=str(error),
                      retry_in=round(wait, 2), attempts=entry.report_attempts, **fields)
            self.inflight.report_answered(entry, retry_at=now + wait)
        return []

    def _expect_retry(self, entry: Entry, now: float) -> None:
        """A failed job with retries left is pending again after min(2^min(retry_count, 6), 60) s plus up
        to 0.5 s of jitter (the server's fixed back-off): have its queue claimed then."""
        retries, limit = entry.job.get("retry_count"), entry.job.get("max_retries")
        intake = self.queues.get(entry.queue)
        if intake is None or not isinstance(retries, int) or not isinstance(limit, int) or retries >= limit:
            return
        intake.retry_due(now + min(2 ** min(retries, 6), 60) + RETRY_JITTER)

    def recover_report(self, entry: Entry, now: float) -> None:
        """Handling a report's answer raised: send it again after a second."""
        if self.inflight.holds(entry):
            self.inflight.report_answered(entry, retry_at=now + 1.0)

    # ------------------------------------------------------------ deadlines and leases
    def enforce(self, now: float) -> list[Fact]:
        """Drop reserved jobs whose lease ran out, time out jobs past their timeout_seconds, resend due
        reports, renew due leases; nothing to scan for before the table's next deadline."""
        if not self.inflight.due(now):
            return []
        facts: list[Fact] = []
        for entry in self.inflight.waiting() + self.inflight.held():
            if entry.lease_until <= now and not entry.renewal.busy:
                # The loop did not run for longer than the lease (the host paused, the API unreachable):
                # the server has re-queued the job, so this copy must never reach a child.
                facts += self._lease_lost(entry, "its lease ran out while it waited for a child", now)
        for entry in self.inflight.timed_out(now):
            timeout = entry.job.get("timeout_seconds")
            log_event(log, WARNING, "job timed out; stopping its child", timeout_seconds=timeout,
                      **self.job_fields(entry, now))
            if entry.slot is not None:
                facts.append(StopJob(entry.slot, entry.id, "timeout"))
            self._fail(entry, f"JobTimeout: the job ran past its timeout of {timeout} s; its child process "
                              f"(pid {entry.pid}) was stopped", now, "timed_out")
        for entry in self.inflight.reports_due(now):
            self._report(entry)
        for entry in self.inflight.renewals_due(now):
            self.inflight.begin_renewal(entry)
            call = self.api.renew_lease_call(entry.id, self.cfg.worker_id, entry.lease_id, self.cfg.lease)
            self.submit(call, entry.renewal.followup(partial(self.on_renew, entry, now),
                                                     partial(self.recover_renew, entry)))
        self.inflight.rescan()
        return facts

    def on_renew(self, entry: Entry, sent_at: float, _result, error, now: float) -> list[Fact]:
        if not self.inflight.holds(entry):
            return []
        if error is None:
            self.inflight.renewed(entry, sent_at)
            self.hooks.lease_renewed("ok")
            return []
        retry = min(2.0, self.cfg.lease / 10.0)
        if entry.outcome is not None and not isinstance(error, api.Unauthorized):
            # The outcome is on its way (or waiting to be retried): its answer settles the job. A renewal
            # racing a delivered `complete` meets 'already completed', which is no lost lease.
            self.inflight.renewal_failed(entry, now + retry)
            return []
        if isinstance(error, (api.LeaseLost, api.AlreadyFinished)):
            self.hooks.lease_renewed("lost")
            return self._lease_lost(entry, str(error), now)
        if isinstance(error, api.Unauthorized):
            self.inflight.renewal_failed(entry, now + retry)
            return [Fatal(exitcodes.AUTH, str(error))]
        self.hooks.lease_renewed("error")
        self.inflight.renewal_failed(entry, now + retry * random.uniform(0.5, 1.0))
        log_event(log, WARNING, "lease renewal failed; retrying", error=str(error),
                  lease_left=round(entry.lease_until - now, 2), **self.job_fields(entry, now))
        return []

    def recover_renew(self, entry: Entry, now: float) -> None:
        """Handling a renewal's answer raised: renew again after a second."""
        self.inflight.renewal_failed(entry, now + 1.0)

    def _lease_lost(self, entry: Entry, error: str, now: float) -> list[Fact]:
        """The API says this worker no longer holds the job: drop it, send nothing more for it, and
        have its child (if one runs it) stopped."""
        self.inflight.pop(entry.id)
        self.hooks.job_finished(entry.queue, "lease_lost", None)
        log_event(log, WARNING, "lease lost; stopping the job's work", error=error, **self.job_fields(entry, now))
        if entry.slot is None:
            return []
        return [RecallJob(entry.slot, entry.id) if entry.held else StopJob(entry.slot, entry.id, "lease_lost")]

    def _fail(self, entry: Entry, error: str, now: float, label: str) -> None:
        """The job ended without its child's answer (timeout, crash, memory cap): fail it with `error`."""
        self.inflight.finish(entry, Outcome(False, error, label), now)
        self._report(entry)
