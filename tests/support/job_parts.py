"""The job's parts wired as the arbiter wires them, for in-process tests: the in-flight table, `Claiming`
and `Settling`, with the facts they tell each other (`QueueFreed`, `RetryDue`, `JobReissued`) routed
between them as `Arbiter.route` does, and every other fact returned to the test."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from supervisor.parent.claiming import Claiming
from supervisor.parent.facts import (
    ChildLost,
    Fact,
    Heard,
    JobDone,
    JobReissued,
    JobReturned,
    JobStarted,
    QueueFreed,
    RetryDue,
)
from supervisor.parent.inflight import Entry, InFlight
from supervisor.parent.settling import Settling


class JobParts:
    """`claiming`, `settling` and `inflight` over one table; the methods below are the arbiter's calls."""

    def __init__(self, cfg: Any, client: Any, submit: Any, hooks: Any) -> None:
        self.cfg = cfg
        self.inflight = InFlight(cfg.lease)
        self.claiming = Claiming(cfg, client, submit, hooks, self.inflight)
        self.settling = Settling(cfg, client, submit, hooks, self.inflight)

    def route(self, facts: Sequence[Fact] | None, now: float) -> list[Fact]:
        """Act on the facts the job's parts tell each other (as Arbiter.route); return the others, in order."""
        out: list[Fact] = []
        for fact in facts or []:
            if isinstance(fact, QueueFreed):
                self.claiming.gave_work(fact.queue, now, fact.duration)
            elif isinstance(fact, RetryDue):
                self.claiming.retry_due(fact.queue, fact.at)
            elif isinstance(fact, JobReissued):
                out += self.route(self.settling.lease_lost(fact.old, "handed out again", now), now)
            else:
                out.append(fact)
        return out

    # -- what the arbiter asks of the parts (see Arbiter.turn, route and feed_children) --
    def job_done(self, fact: JobDone, now: float) -> None:
        assert self.route(self.settling.job_done(fact, now), now) == []

    def child_lost(self, fact: ChildLost, now: float) -> None:
        self.settling.child_lost(fact, now)

    def job_started(self, fact: JobStarted, now: float) -> list[Fact]:
        return self.route(self.claiming.job_started(fact, now), now)

    def job_returned(self, fact: JobReturned, now: float) -> None:
        self.claiming.job_returned(fact, now)

    def heard(self, fact: Heard, now: float) -> None:
        self.claiming.heard(fact, now)

    def enforce(self, now: float) -> list[Fact]:
        return self.route(self.settling.enforce(now), now)

    def next_deadline(self, now: float, may_claim: bool, idle: int, claim_gate: float = 0.0) -> float | None:
        times = [t for t in (self.settling.next_deadline(), self.claiming.next_deadline(now, may_claim, idle,
                                                                                         claim_gate)) if t is not None]
        return min(times) if times else None

    def send_reports(self) -> None:
        self.settling.send_reports()

    def maybe_claim(self, *args: Any, **kwargs: Any) -> None:
        self.claiming.maybe_claim(*args, **kwargs)

    def started(self, entry: Entry, child: Any, now: float) -> None:
        self.claiming.started(entry, child, now)

    def lease_lost(self, entry: Entry, error: str, now: float) -> list[Fact]:
        return self.route(self.settling.lease_lost(entry, error, now), now)
