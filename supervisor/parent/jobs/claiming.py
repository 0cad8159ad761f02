"""Claiming: claim just ahead of need, from the queues in priority order, and hand the jobs to children.

`Claiming` owns the claim timing of every queue (`QueueIntake`, supervisor.parent.jobs.intake), the one
claim on the wire, the claim round trip, and the handing over of reserved jobs: to idle children
(`assignments`), ahead to busy ones (`send_ahead`), started (`started`, `job_started`) or given back
(`job_returned`). It reads and fills the in-flight table (supervisor.parent.jobs.inflight); what happens
to a job once a child ends it is `Settling`'s (supervisor.parent.jobs.settling). A job handed out again
under a new lease comes back as a fact (`JobReissued`) for `Settling` to drop the old copy. Both are parts
of the jobs wing (supervisor.parent.jobs.wing), which routes those facts between them.

Claiming (supervisor.parent.jobs.intake decides how many): one claim on the wire at a time, for the
children that are idle or will be within about two claim round trips, plus a batch when jobs are
short or requests are scarce. Queues are served in strict priority: a claim goes to the first queue
that is not backing off after coming back empty (or short); a queue that just gave a job is asked
again as soon as a child frees up (`gave_work`), an empty one on its back-off (50 ms doubling to
--poll-interval), or, while the events stream is live (supervisor.parent.wake), when a job is announced
there, else every 15 s.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from functools import partial
from logging import DEBUG, ERROR, WARNING
from typing import Any, Protocol

from supervisor import exitcodes
from supervisor.backoff import backoff
from supervisor.client import calls as api
from supervisor.client.transport import Transport
from supervisor.config import Config
from supervisor.job import Job
from supervisor.ops.logs import log_event
from supervisor.ops.nullhooks import NullHooks
from supervisor.parent.facts import (
    Fact,
    Fatal,
    Followup,
    Heard,
    JobReissued,
    JobReturned,
    JobStarted,
    Listening,
    RecallJob,
    Send,
    StopJob,
)
from supervisor.parent.jobs.inflight import Entry, InFlight, job_fields
from supervisor.parent.jobs.intake import (
    Need,
    QueueIntake,
    Tail,
    claim_size,
    history_run_time,
    hold_overdue,
    may_hold,
    next_need_at,
)
from supervisor.parent.single import OneAtATime

log = logging.getLogger("supervisor")

class Worker(Protocol):
    """A child as the jobs wing reads it (supervisor.parent.childproc.Child)."""

    slot: int
    pid: int | None

    @property
    def stays_after_job(self) -> bool: ...  # it stays after its job: it may be sent its next one


HELD_LEASE_MARGIN = 1.0  # seconds: a held job is started by its child only this long before its lease ends


class Claiming:
    """The claims and the hand-over of claimed jobs to children (see the module docstring). Reads and
    fills the in-flight table it is given; every call it wants sent it returns as a `Send`."""

    def __init__(self, cfg: Config, transport: Transport, hooks: NullHooks, inflight: InFlight):
        self.cfg = cfg
        self.transport = transport  # builds the calls
        self.hooks = hooks
        self.inflight = inflight  # every job this worker holds (the table is its own part)
        self.queues = {name: QueueIntake(name) for name in cfg.queues}  # in priority order
        self.claim = OneAtATime()  # a claim on the wire
        self.claim_not_before = 0.0  # after a failed claim: a back-off no freed child may cut short
        self.claim_failures = 0  # claims in a row that failed
        self.claim_rtt = Tail()  # claim round trip (s): the 90th percentile of the last 32 measured
        self.reserve_waits: list[float] = []  # seconds jobs waited claimed-but-not-started, last 1000
        self.listening = False  # the events stream is live: empty queues are polled slowly
        self.starting = True  # reserved jobs go to idle children; False once stop_starting()
        self.histories_asked = False  # the queues' statistics were asked for (once, before the first claim)

    # ------------------------------------------------------------ reading
    def drained(self) -> bool:
        """Nothing left to run or settle: no job held (or, after stop_starting, none but the unstarted reserve)."""
        if self.claim.busy:
            return False
        return not self.inflight.jobs if self.starting else self.inflight.unassigned_count() == len(self.inflight)

    def next_deadline(self, now: float, may_claim: bool, idle: int, claim_gate: float = 0.0) -> float | None:
        """When (`may_claim`: registered and running) the next claim is due: now-ish when children are idle,
        or when the starts within the claim horizon will outnumber the jobs reserved; never before
        `claim_gate` (the request budget's say). None: no claim is due."""
        if not may_claim or self.claim.busy:
            return None
        soonest = max(min(q.next_claim_at for q in self.queues.values()), self.claim_not_before, claim_gate)
        if idle > self.inflight.unassigned_count():
            return soonest  # a child is idle and no reserved job is unassigned
        if self.cfg.prefetch != 0:
            need = self._need(now, idle)
            need_at = now if claim_size(need) > 0 else next_need_at(now, need)  # now: inside the horizon
            if need_at is not None:
                return max(need_at, soonest)
        return None

    def stats(self) -> dict:
        """Plain data for the published snapshot."""
        rtt = self.claim_rtt.value
        return {"reserved": self.reserved(), "held": self.inflight.held_count(), "queues": self.by_queue(),
                "claim_rtt_ms": None if rtt is None else round(rtt * 1000, 2),
                "reserve_wait_ms": self.reserve_wait_ms()}

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
        whether its last claim came back short (`empty`): /status's `queues`."""
        out = {name: {"inflight": 0, "reserved": 0, "empty": q.empty_claims > 0} for name, q in self.queues.items()}
        for key, entries in (("inflight", list(self.inflight.jobs.values())), ("reserved", self.inflight.unassigned()),
                             ("reserved", self.inflight.held())):
            for e in entries:
                if e.queue in out:
                    out[e.queue][key] += 1
        return out

    def reserved(self) -> int:
        """Jobs claimed and not yet started: the reserve (those held by busy children included)."""
        return self.inflight.unassigned_count() + self.inflight.held_count()

    # ------------------------------------------------------------ handing jobs to children
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
        """A child gave back its held job unstarted: it is unassigned again."""
        entry = self.inflight.get(fact.job_id)
        kept = entry is not None and entry.held and entry.slot == fact.slot
        if entry is not None and kept:
            self.inflight.unhold(entry)
        log_event(log, DEBUG, "held job returned", job_id=fact.job_id, slot=fact.slot, kept=kept)

    def assignments(self, idle: Sequence[Worker]) -> list[tuple[Worker, Entry]]:
        """Which idle child takes which unassigned reserved job, oldest job first (none after stop_starting)."""
        if not self.starting or not idle or not self.inflight.unassigned_count():
            return []
        return list(zip(idle, self.inflight.unassigned(), strict=False))

    def stop_starting(self) -> None:
        """Hand no more reserved jobs to children. They stay held (leases renewed) until deregistering hands
        them back to the queue unaltered: the API has no route that releases one job, and failing it would
        spend one of its retries."""
        self.starting = False

    def send_ahead(self, busy: Sequence[Worker], now: float) -> list[tuple[Worker, Entry]]:
        """Which busy child (of those that may hold one) is sent which unassigned reserved job ahead, to start it the
        moment its own job ends: only jobs of queues whose jobs are short, for children whose job is
        expected to end soon, the soonest first; never with --prefetch 0 or after stop_starting."""
        if self.cfg.prefetch == 0 or not self.starting or not busy or not self.inflight.unassigned_count():
            return []
        ready = []
        for c in busy:
            job = self.inflight.on_child(c.slot)
            ready.append((self._time_left(job, now, overdue=True) if job is not None else math.inf, c.slot, c))
        ready.sort()
        out = []
        children = iter(ready)
        for entry in self.inflight.unassigned():
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

    def hold(self, entry: Entry, child: Worker) -> None:
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

    def started(self, entry: Entry, child: Worker, now: float) -> None:
        self._start(entry, child.slot, child.pid, now)

    def _start(self, entry: Entry, slot: int, pid: int | None, now: float) -> None:
        self.inflight.start(entry, slot, pid, now)
        waits = self.reserve_waits
        waits.append(now - entry.claimed_at)
        if len(waits) > 1000:
            del waits[:500]
        log_event(log, DEBUG, "job started", **job_fields(entry, self.cfg.worker_id, now))

    # ------------------------------------------------------------ claiming
    def gave_work(self, queue: str, now: float, duration: float | None) -> None:
        """A job of `queue` ended (after `duration` s, if a child ran it): ask that queue again at once."""
        intake = self.queues.get(queue)
        if intake is not None:
            intake.gave_work(now, duration)

    def retry_due(self, queue: str, at: float) -> None:
        """A job of `queue` this daemon failed comes back to the queue at `at`: claim there then."""
        intake = self.queues.get(queue)
        if intake is not None:
            intake.retry_due(at)

    def maybe_claim(self, now: float, idle: int, procs: int, may_claim: bool, budget_ok: bool = True,
                    rate: float | None = None) -> list[Fact]:
        """Claim for the children that are idle or soon will be (intake.claim_size), from the first queue
        not backing off; one claim on the wire at a time, none while a back-off or the budget holds.
        Before the first claim (from the first turn, while registering), each queue's statistics are asked
        for once, unless requests are scarce (--prefetch 0, a request budget)."""
        out = [] if self.histories_asked else self.ask_histories(now, rate)
        if not may_claim or not budget_ok or self.claim.busy or now < self.claim_not_before:
            return out
        intake = next((q for q in self.queues.values() if now >= q.next_claim_at), None)
        if intake is None:
            return out
        size = claim_size(self._need(now, idle, procs, rate))
        if size <= 0:
            return out
        self.claim.start()
        call = self.transport.claim_call(intake.name, self.cfg.worker_id, size, self.cfg.lease)
        out.append(Send(call, self.claim.followup(partial(self.on_claim, intake, size, now), self.recover_claim),
                        first=True))
        return out

    def ask_histories(self, now: float, rate: float | None) -> list[Fact]:
        """Ask for the statistics of every queue with no run time yet (once), unless requests are scarce."""
        self.histories_asked = True
        if self.cfg.prefetch == 0 or rate:
            return []
        return [Send(self.transport.queue_stats_call(intake.name),
                     Followup(partial(self.on_history, intake, now), lambda now: None))
                for intake in self.queues.values() if intake.run_time.value is None]

    def on_history(self, intake: QueueIntake, sent_at: float, stats: Any, error: api.ApiError | None,
                   now: float) -> None:
        """A queue's statistics: when they say its jobs are short, their mean seeds the run time, and the
        answer's round trip the claim round trip while none is measured, so the first claim already
        reaches ahead (claim_size: the children's first jobs, the ones they hold next, and a batch)
        instead of claiming only for the idle children and reaching ahead after the first job ends."""
        seed = history_run_time(stats) if error is None else None
        if seed is not None:
            intake.run_time.seed(seed)
            if self.claim_rtt.value is None:
                self.claim_rtt.add(now - sent_at)
            log_event(log, DEBUG, "run time seeded from the queue's statistics", queue=intake.name,
                      run_time=round(seed, 4))

    def _need(self, now: float, idle: int, procs: int | None = None, rate: float | None = None) -> Need:
        return Need(idle=idle, reserved=self.reserved(), remaining=self._busy_remaining(now),
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

    def on_claim(self, intake: QueueIntake, asked: int, sent_at: float, jobs: Any, error: api.ApiError | None,
                 now: float) -> list[Fact]:
        """A claim's answer: take its jobs into the table (or back off after a failed claim)."""
        if error is not None:
            return self._claim_failed(error, now)
        self.claim_rtt.add(now - sent_at)
        self.claim_failures = 0
        self.claim_not_before = 0.0
        facts: list[Fact] = []
        taken = 0
        for raw in jobs:
            job = Job.parse(raw)
            if job is None:
                log_event(log, ERROR, "claim answer holds a job without an id or lease_id; ignored", job=str(raw)[:200])
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

    def _take_claimed(self, job: Job, sent_at: float, now: float) -> list[Fact]:
        """Add a claimed job to the table. The same id again means the server re-issued it (our lease had
        expired): the old copy's work and answers are void."""
        facts: list[Fact] = []
        old = self.inflight.pop(job.id)
        if old is not None:
            facts.append(JobReissued(old))
        self.inflight.add(job, sent_at)
        log_event(log, DEBUG, "job claimed", job_id=job.id, queue=job.raw.get("queue_name"),
                  worker_id=self.cfg.worker_id)
        return facts
