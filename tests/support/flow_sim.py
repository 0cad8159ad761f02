"""A deterministic, in-process loop around the real jobs wing (and optionally the real `Pacer`): fake
children, a fake API that answers every call one round trip after it was sent (optionally behind a
per-organization token bucket that answers 429 as the dev server does), and a fake clock.

Each turn does what `Arbiter.turn` does, in its order: API answers, finished children, the pacer's
release, `enforce`, then the wing's turn (hand waiting jobs to idle children, send reports, maybe claim). The next turn
is at the earliest of the answers due, the children's ends, the flow's and the pacer's deadlines
(capped at one second, as the arbiter caps its wait). Nothing here sleeps or opens a socket.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from support.wing_rig import WingRig

from supervisor.client import rest as api
from supervisor.client.rest import Secret, SpooledAPI
from supervisor.config import Config
from supervisor.ops.nullhooks import NullHooks
from supervisor.parent.facts import GiveJob, JobDone
from supervisor.parent.pacer import Pacer

URL = "http://127.0.0.1:9"  # never contacted: SpooledAPI only builds the calls here
KEY = Secret("sp_test_sim")


def make_cfg(**overrides: Any) -> Config:
    fields: dict[str, Any] = dict(api_url=URL, api_key=KEY, queues=("q",), handler="m:f", worker_id="w-sim",
                                  hostname="sim", procs=2, lease=30, poll_interval=1.0, prefetch=None)
    fields.update(overrides)
    return Config(**fields)


def body(call) -> dict:
    return orjson.loads(call.body) if call.body else {}


@dataclass
class FakeChild:
    slot: int
    pid: int
    job_id: str | None = None
    ends_at: float = math.inf
    stays_after_job: bool = True


@dataclass
class Sent:
    at: float
    route: str
    limit: int | None = None  # a claim's `limit`
    job_id: str | None = None  # a job route's job
    refused: bool = False  # answered 429 by the fake API's rate limit


class Bucket:
    """The fake API's per-organization token bucket (as the dev server's RateLimiter)."""

    def __init__(self, rps: float, burst: float, now: float):
        self.rps, self.burst, self.tokens, self.at = rps, burst, burst, now

    def take(self, now: float) -> float | None:
        """None when a token was taken, else the Retry-After in whole seconds."""
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rps)
        self.at = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return None
        return max(1, math.ceil((1.0 - self.tokens) / self.rps))


@dataclass
class Sim:
    """Run `jobs` jobs of `run_time(index)` seconds on `procs` fake children against an API `rtt` away."""

    procs: int = 2
    jobs: int = 10
    run_time: Callable[[int], float] = lambda i: 1.0
    rtt: float = 0.02
    prefetch: int | None = None
    max_rps: float | None = None
    server_rps: float | None = None  # the fake API's rate limit (burst twice that), if any
    lease: int = 30
    now: float = 1000.0
    sent: list[Sent] = field(default_factory=list)
    turns: int = 0
    reserve_area: float = 0.0  # integral of reserved jobs over time (job-seconds)
    max_reserved: int = 0  # the most jobs waiting for a child after a turn's hand-out
    idle_with_backlog: float = 0.0  # child-seconds idle while the server still had jobs

    def __post_init__(self) -> None:
        self.cfg = make_cfg(procs=self.procs, prefetch=self.prefetch, max_rps=self.max_rps, lease=self.lease)
        self.pacer = Pacer(self._wire, self.max_rps)  # the arbiter always has one; off until a rate is known
        self.bucket = Bucket(self.server_rps, 2 * self.server_rps, self.now) if self.server_rps else None
        self.flow = WingRig(self.cfg, SpooledAPI(URL, KEY), self._submit, NullHooks())
        self.children = [FakeChild(slot, 10_000 + slot) for slot in range(self.procs)]
        self.backlog = [f"j{i}" for i in range(self.jobs)]
        self.index = {jid: i for i, jid in enumerate(self.backlog)}
        self.pending: list[tuple[float, int, Any, Any]] = []  # (answer at, seq, call, followup)
        self.completed: set[str] = set()
        self.start_times: dict[str, float] = {}
        self.claimed_at: dict[str, float] = {}  # when the claim that took the job was answered

    # ------------------------------------------------------------ the fake API
    def _submit(self, call, followup, first: bool = False) -> None:
        self.pacer.submit(call, followup, first, self.now)

    def _wire(self, call, followup, first: bool) -> None:
        limit = body(call).get("limit") if call.route == "claim" else None
        job_id = call.path.rsplit("/", 2)[-2] if call.job_route else None
        retry_after = self.bucket.take(self.now + self.rtt / 2) if self.bucket is not None else None
        self.sent.append(Sent(self.now, call.route, limit, job_id, retry_after is not None))
        self.pending.append((self.now + self.rtt, len(self.sent), call, (followup, retry_after)))

    def _rate_limited(self, call, retry_after: float) -> api.ApiError:
        payload = {"code": "RATE_LIMIT_EXCEEDED", "message": "Rate limit exceeded", "limit": self.server_rps,
                   "retry_after_secs": retry_after, "remaining": 0}
        return api.classify(429, payload, {"Retry-After": str(retry_after)}, job_route=call.job_route)

    def _answer(self, call) -> Any:
        if call.route == "claim":
            limit = body(call)["limit"]
            taken, self.backlog = self.backlog[:limit], self.backlog[limit:]
            self.claimed_at.update((jid, self.now) for jid in taken)
            return [{"id": jid, "lease_id": f"L-{jid}", "queue_name": "q"} for jid in taken]
        if call.route in ("complete", "fail"):
            self.completed.add(call.path.rsplit("/", 2)[-2])
        return None

    # ------------------------------------------------------------ the loop
    def idle(self) -> list[FakeChild]:
        return [c for c in self.children if c.job_id is None]

    def turn(self) -> None:
        now = self.now
        self.turns += 1
        due = sorted(p for p in self.pending if p[0] <= now)
        self.pending = [p for p in self.pending if p[0] > now]
        for _, _, call, (followup, retry_after) in due:
            if retry_after is None:
                self.flow.answer(followup, self._answer(call), None, now)
                continue
            error = self._rate_limited(call, retry_after)
            self.pacer.rate_limited(now, error.retry_after, error.body.get("limit"))  # as take_answers does
            self.flow.answer(followup, None, error, now)
        for child in self.children:
            if child.job_id is not None and child.ends_at <= now:
                self.flow.job_done(JobDone(child.slot, child.job_id, True, None), now)
                child.job_id, child.ends_at = None, math.inf
        self.pacer.release(now)
        self.flow.enforce(now)
        for order in self.flow.turn(now, idle=self.idle(), may_send_ahead=False, budget=self.pacer, procs=self.procs):
            if isinstance(order, GiveJob):
                child, job_id = order.child, order.job.id
                child.job_id, child.ends_at = job_id, now + self.run_time(self.index[job_id])
                self.start_times[job_id] = now
        self.max_reserved = max(self.max_reserved, self.flow.claiming.reserved())

    def next_time(self) -> float:
        now = self.now
        gate = self.pacer.claim_ready_at(now)
        times = [now + 1.0, self.flow.next_deadline(now, True, len(self.idle()), gate), self.pacer.next_deadline(now)]
        times += [p[0] for p in self.pending] + [c.ends_at for c in self.children]
        # a real turn takes time: at least a microsecond (a deadline computed to land on the boundary
        # of a token can come out a rounding error short of it; the real clock moves on regardless)
        return max(now + 1e-6, min(t for t in times if t is not None))

    def run(self, until: float = 600.0) -> Sim:
        """Turn until every job is completed (or `until` seconds of fake time pass)."""
        end = self.now + until
        burst_at, burst_turns = self.now, 0
        while len(self.completed) < self.jobs and self.now < end:
            self.turn()
            nxt = self.next_time()
            if nxt - burst_at > 0.001:
                burst_at, burst_turns = nxt, 0
            burst_turns += 1
            if burst_turns > 100:
                raise AssertionError(f"busy loop: 100 turns within a millisecond at t={self.now}")
            dt = nxt - self.now
            self.reserve_area += self.flow.claiming.reserved() * dt
            if self.backlog:
                self.idle_with_backlog += len(self.idle()) * dt
            self.now = nxt
        return self

    # ------------------------------------------------------------ reading
    def claims(self) -> list[Sent]:
        return [s for s in self.sent if s.route == "claim"]

    def routes(self) -> list[str]:
        return [s.route for s in self.sent]

    def refused(self) -> list[Sent]:
        return [s for s in self.sent if s.refused]

    def most_sent_in(self, window: float) -> int:
        """The most requests sent within any `window` seconds."""
        times = [s.at for s in self.sent]
        return max((sum(1 for t in times if start <= t < start + window) for start in times), default=0)
