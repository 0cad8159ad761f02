"""The real jobs wing (supervisor.parent.jobs) with the arbiter's side of it faked, for in-process tests:
the calls it returns go to the test's `submit` (the fake transport), and the orders for the pool and the
facts for the arbiter are returned to the test. Nothing here routes a fact between the wing's parts:
the wing does that itself."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from support.parent_fakes import fake_child

from supervisor.job import Job
from supervisor.parent.facts import ChildLost, Fact, GiveJob, JobDone, Send
from supervisor.parent.jobs import Jobs, Turn


class Budget:
    """The request budget as the wing reads it: claims allowed (`ok`) or not, at `rate` requests/s."""

    def __init__(self, ok: bool = True, rate: float | None = None) -> None:
        self.ok, self.rate = ok, rate

    def allows_claim(self, now: float, after: int = 0) -> bool:
        return self.ok


class WingRig:
    """`jobs` (with its `claiming`, `settling` and `inflight` to read) and the arbiter's calls into it."""

    def __init__(self, cfg: Any, transport: Any, submit: Any, hooks: Any) -> None:
        self.cfg = cfg
        self.submit = submit
        self.jobs = Jobs(cfg, transport, hooks)
        self.claiming, self.settling, self.inflight = self.jobs.claiming, self.jobs.settling, self.jobs.inflight

    def out(self, items: Sequence[Fact] | None) -> list[Fact]:
        """Send the calls (as the arbiter's route does); return the rest, in order."""
        rest: list[Fact] = []
        for item in items or ():
            if isinstance(item, Send):
                self.submit(item.call, item.followup, item.first)
            else:
                rest.append(item)
        return rest

    # -- what the arbiter asks of the wing (Arbiter.turn, route, feed_children, take_answers) --
    def turn(self, now: float, idle: Sequence[Any] = (), busy: Sequence[Any] = (), may_claim: bool = True,
             may_send_ahead: bool = True, paused: bool = False, budget: Any = None, procs: int | None = None
             ) -> list[Fact]:
        turn = Turn(now, list(idle), list(busy), may_claim, may_send_ahead, paused, budget or Budget(),
                    procs or self.cfg.procs)
        return self.out(self.jobs.turn(turn))

    def take(self, fact: Fact, now: float) -> list[Fact]:
        return self.out(self.jobs.take(fact, now))

    def answer(self, followup: Any, result: Any, error: Any, now: float) -> list[Fact]:
        """An API answer, as take_answers hands it on: its facts go to the wing (the arbiter routes every
        job fact there); what the wing returns is returned."""
        out: list[Fact] = []
        for fact in followup.answer(result, error, now) or ():
            out += self.take(fact, now)
        return out

    def enforce(self, now: float) -> list[Fact]:
        return self.out(self.jobs.enforce(now))

    def next_deadline(self, now: float, may_claim: bool, idle: int, claim_gate: float = 0.0) -> float | None:
        return self.jobs.next_deadline(now, may_claim, idle, claim_gate)

    # -- shorthands --
    def job_done(self, fact: JobDone, now: float) -> list[Fact]:
        return self.take(fact, now)

    def child_lost(self, fact: ChildLost, now: float) -> list[Fact]:
        return self.take(fact, now)

    def send_reports(self, now: float) -> list[Fact]:
        """A turn with no child to feed and no claim allowed: it sends the outcomes recorded since the last."""
        return self.turn(now, may_claim=False, may_send_ahead=False)

    def start(self, job_id: str, child: Any, now: float) -> None:
        """A turn with `child` the one idle child gives it `job_id` (the oldest job waiting)."""
        given = [o for o in self.turn(now, idle=[child], may_claim=False, may_send_ahead=False)
                 if isinstance(o, GiveJob)]
        assert [(o.child.slot, o.job.id) for o in given] == [(child.slot, job_id)], given

    def started(self, entry: Any, child: Any, now: float) -> None:
        self.start(entry.id, child, now)

    def maybe_claim(self, now: float, idle: int, procs: int | None = None, may_claim: bool = True,
                    budget_ok: bool = True, rate: float | None = None) -> list[Fact]:
        """A turn with `idle` idle children (slots 100 on: they take what waits), no child busy."""
        return self.turn(now, idle=[fake_child(100 + n) for n in range(idle)], may_claim=may_claim,
                         may_send_ahead=False, budget=Budget(budget_ok, rate), procs=procs)

    def add(self, raw: dict, now: float) -> Any:
        """Put the job `raw` in the table as a claim at `now` would (a shortcut past the claim's answer)."""
        job = Job.parse(raw)
        assert job is not None
        return self.inflight.add(job, now)

    def lease_lost(self, entry: Any, error: str, now: float) -> list[Fact]:
        return self.out(self.jobs.route(self.settling.lease_lost(entry, error, now), now))
