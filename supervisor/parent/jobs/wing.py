"""The jobs wing: the one part of the parent that owns a job's whole life, from the claim (or a push) to
its settlement.

`Jobs` owns the in-flight table (supervisor.parent.jobs.inflight), `Claiming` and `Settling` and routes
what they tell each other among themselves (a job done frees its queue for a claim, a failure schedules
the claim of its retry, a job handed out again drops the old copy), so none of that climbs through the
arbiter. The arbiter gives it:

- a turn (`turn`, with a `Turn`: the time, the idle and busy children, whether it may claim and send
  ahead, the request budget), which returns orders for the pool (`GiveJob`, `HoldJob`, `RecallJob`) and
  calls for the transport (`Send`), in the order they must go;
- the facts about jobs (`take`: a child's answer, a start, a return, a child lost, an API answer's facts,
  news from the events stream, a hand-back), which return the same kinds, plus `StopJob`, `JobSettled`
  (tell the child that ran a job how it settled) and `Fatal`;
- the deadlines (`enforce`), which return the same kinds.

A job may also arrive without a claim (`pushed`: a job a stream delivered for one child): it enters the
table as running on that child, and from there lives as any other.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, Protocol

from supervisor.client.transport import Transport
from supervisor.config import Config
from supervisor.job import Job
from supervisor.ops.nullhooks import NullHooks
from supervisor.parent.facts import (
    ChildLost,
    Fact,
    GiveJob,
    HandBack,
    HoldJob,
    JobDone,
    JobReissued,
    JobReturned,
    JobStarted,
    Listening,
    NotSent,
    QueueFreed,
    RetryDue,
    WorkCreated,
)
from supervisor.parent.jobs.claiming import Claiming, Worker
from supervisor.parent.jobs.inflight import InFlight
from supervisor.parent.jobs.settling import Settling


class Budget(Protocol):
    """The request budget as the wing reads it (supervisor.parent.pacer.Pacer)."""

    rate: float | None

    def allows_claim(self, now: float, after: int = 0) -> bool: ...


class Turn(NamedTuple):
    """What the arbiter knows at a turn: the idle children (that may take a job, the longest idle first),
    the busy ones that may be sent their next job ahead, whether a claim may go (registered, running,
    no memory pressure), whether jobs may be sent ahead (running, no memory pressure), whether memory
    pressure pauses the starts (every held job is then asked back), the request budget and the target
    number of children. A named tuple: one is made every turn."""

    now: float
    idle: Sequence[Worker]
    busy: Sequence[Worker]
    may_claim: bool
    may_send_ahead: bool
    paused: bool
    budget: Budget
    procs: int


class Jobs:
    """The jobs wing (see the module docstring). Every call it wants sent it returns as a `Send`."""

    def __init__(self, cfg: Config, transport: Transport, hooks: NullHooks):
        self.cfg = cfg
        self.inflight = InFlight(cfg.lease)  # every job this worker holds; claiming fills it, settling empties it
        self.claiming = Claiming(cfg, transport, hooks, self.inflight)
        self.settling = Settling(cfg, transport, hooks, self.inflight)

    def __len__(self) -> int:
        return len(self.inflight)

    # ------------------------------------------------------------ the arbiter's turn
    def turn(self, t: Turn) -> list[Fact]:
        """Hand reserved jobs to the idle children (unless paused), the outcomes recorded since the last
        turn's reports, a claim for the children idle or soon to be (after the reports: the budget counts
        them), then, unless paused, the busy children's next jobs ahead (paused: every held job recalled)."""
        now = t.now
        out: list[Fact] = []
        given: list[Worker] = []
        if not t.paused:
            for child, entry in self.claiming.assignments(t.idle):
                self.claiming.started(entry, child, now)
                out.append(GiveJob(child, entry.job))
                given.append(child)
        reports = self.settling.send_reports()
        out += reports
        out += self.claiming.maybe_claim(now, len(t.idle) - len(given), t.procs, t.may_claim,
                                         t.budget.allows_claim(now, len(reports)), t.budget.rate)
        if t.paused:
            out += self.claiming.recall_held()  # no child starts a job on its own under pressure
        elif t.may_send_ahead:
            busy = [*t.busy, *(c for c in given if c.stays_after_job)] if given else t.busy
            for child, entry in self.claiming.send_ahead(busy, now):
                out.append(HoldJob(child, entry.job, self.claiming.start_by(entry)))
                self.claiming.hold(entry, child)
        return out

    def enforce(self, now: float) -> list[Fact]:
        """The table's deadlines: lost leases of waiting jobs, timeouts, reports to resend, renewals."""
        return self.route(self.settling.enforce(now), now)

    def next_deadline(self, now: float, may_claim: bool, idle: int, claim_gate: float = 0.0) -> float | None:
        """The earliest time the wing must act: a deadline of the table, a report to send, a claim due."""
        settle = self.settling.next_deadline()
        claim = self.claiming.next_deadline(now, may_claim, idle, claim_gate)
        if settle is None or claim is None:
            return claim if settle is None else settle
        return min(settle, claim)

    # ------------------------------------------------------------ facts about jobs
    def take(self, fact: Fact, now: float) -> list[Fact]:
        """Act on a fact about jobs; return the orders, calls and facts for the arbiter."""
        match fact:
            case JobDone():
                return self.route(self.settling.job_done(fact, now), now)
            case JobStarted():
                return self.claiming.job_started(fact, now)
            case JobReturned():
                self.claiming.job_returned(fact, now)
            case ChildLost():
                return self.settling.child_lost(fact, now)
            case HandBack():
                return self.settling.hand_back_reserved(fact.error, now)
            case WorkCreated() | Listening():
                self.claiming.heard(fact, now)
            case NotSent():
                self.not_sent(fact)
            case _:
                return self.route([fact], now)
        return []

    def route(self, facts: Sequence[Fact] | None, now: float) -> list[Fact]:
        """Act on what the wing's parts tell each other; return the rest, in order."""
        if not facts:
            return []
        out: list[Fact] = []
        for fact in facts:
            if isinstance(fact, QueueFreed):
                self.claiming.gave_work(fact.queue, now, fact.duration)
            elif isinstance(fact, RetryDue):
                self.claiming.retry_due(fact.queue, fact.at)
            elif isinstance(fact, JobReissued):
                out += self.settling.lease_lost(fact.old, "the server handed this job out again under a new lease",
                                                now)
            else:
                out.append(fact)
        return out

    def not_sent(self, fact: NotSent) -> None:
        """A job given or sent ahead never reached its child: it is unassigned again, for another child."""
        entry = self.inflight.get(fact.job_id)
        if entry is None or entry.slot != fact.slot or entry.outcome is not None:
            return
        if entry.held:
            self.inflight.unhold(entry)
        else:
            self.inflight.unstart(entry)

    def pushed(self, job: Job, child: Worker, now: float) -> list[Fact]:
        """A job that arrived for the idle `child` without a claim (a stream pushed it): it runs there
        from now, and is renewed, timed, reported and settled as a claimed one."""
        entry = self.inflight.add(job, now)
        self.claiming.started(entry, child, now)
        return [GiveJob(child, job)]

    # ------------------------------------------------------------ the daemon's stages
    def recall_held(self) -> list[Fact]:
        """Ask for every held job back (a drain begins)."""
        return self.claiming.recall_held()

    def stop_starting(self) -> None:
        """Hand no more reserved jobs to children (a drain request: they go back with the deregister)."""
        self.claiming.stop_starting()

    def drained(self) -> bool:
        return self.claiming.drained()

    def exhausted(self) -> bool:
        return self.claiming.exhausted()

    # ------------------------------------------------------------ reading
    def reserved(self) -> int:
        """Jobs claimed and not yet started (those held by busy children included)."""
        return self.claiming.reserved()

    def job_ids(self) -> list[str]:
        return list(self.inflight.jobs)

    def started_at(self, job_id: str | None) -> float | None:
        """When a child started the job `job_id` (None: not running, or not held)."""
        entry = self.inflight.get(job_id)
        return entry.started_at if entry is not None else None

    def stats(self) -> dict:
        """Plain data for the published snapshot: the table's, claiming's and settling's."""
        return {**self.inflight.stats(), **self.claiming.stats(), **self.settling.stats()}
