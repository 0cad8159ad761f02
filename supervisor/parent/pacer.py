"""Keep the daemon's API requests under the organization's rate.

A token bucket in front of the loop's HTTP client. The rate is `--max-rps` when given, otherwise
unknown (no pacing) until the API answers 429: then it is learned from the answer's `limit` (the
plan's requests per second), less a 5% margin. A 429 while already pacing at
that rate means someone else spends the same plan (another replica): the rate drops by a fifth,
and creeps back up towards the plan's limit while no 429 comes. Without a `limit` in the answer
the rate is 90% of what the daemon was sending. 429s within ECHO_WINDOW of a change answer requests
sent before it and teach nothing more. Settlements (complete, fail) go first, then lease
renewals, then worker calls (register, heartbeat); a claim goes only when a token is left over for
a settlement behind it, and not while a 429's Retry-After holds. Nothing is ever dropped: a call
without a token waits in order of priority.
"""

from __future__ import annotations

import collections
import heapq
import itertools
from collections.abc import Callable

from supervisor.client.transport import BuiltCall
from supervisor.parent.facts import Followup

PRIORITY = {"complete": 0, "fail": 0, "job_heartbeat": 1, "register": 2, "worker_heartbeat": 2, "deregister": 2}
CLAIM_PRIORITY = 3
RATE_WINDOW = 2.0  # seconds of sent requests kept to measure the rate being sent
LEARN_FACTOR = 0.9  # a 429 without a `limit` sets the rate to this share of what was being sent
PLAN_MARGIN = 0.95  # share of the plan's `limit` the daemon paces at
SHARED_BACKOFF = 0.8  # a 429 while pacing at that rate: the plan is shared; drop to this share
CREEP_EVERY = 2.0  # seconds without a 429 before a lowered rate grows
CREEP_BY = 0.05  # ... by this share, up to the plan's limit
MIN_RATE = 0.5
ECHO_WINDOW = 1.0  # seconds after a 429 changed the rate in which further 429s answer requests sent before it

Send = Callable[[BuiltCall, Followup, bool], None]  # send(call, followup, first)


class Pacer:
    """The request budget in front of the loop's transport: sends a call now or defers it by priority
    (`deferred`) until a token frees; learns the rate from 429s unless --max-rps fixed it."""

    def __init__(self, send: Send, max_rps: float | None = None):
        self.send = send  # the HTTP client's submit
        self.rate: float | None = max_rps  # requests per second allowed; None = not paced
        self.fixed = max_rps is not None  # set by the operator: never learned over
        self.tokens = self._capacity()
        self.refilled_at = 0.0
        self.plan_rate: float | None = None  # PLAN_MARGIN x the `limit` a 429 answer gave
        self.claims_paused_until = 0.0  # a 429's Retry-After
        self.last_429_at = -1e9
        self.rate_set_at = -1e9  # when a 429 last changed the rate
        self.crept_at = 0.0
        self.deferred: list[tuple[int, int, BuiltCall, Followup, bool]] = []  # (priority, seq, call, followup, first)
        self._seq = itertools.count()
        self.recent: collections.deque[float] = collections.deque()  # send times, the last RATE_WINDOW seconds
        self.sent = 0  # requests sent in all
        self.rate_limited_answers = 0  # 429s seen

    def stats(self) -> dict:
        """Plain data for the published snapshot."""
        return {"requests_sent": self.sent, "rate_limit_rps": self.rate,
                "rate_limited_answers": self.rate_limited_answers}

    # ------------------------------------------------------------ asking
    def submit(self, call: BuiltCall, followup: Followup, first: bool, now: float) -> None:
        """Send `call` now if the budget allows, else queue it by priority."""
        if self.rate is None or (not self.deferred and self._take(now)):
            self._send(call, followup, first, now)
            return
        prio = PRIORITY.get(getattr(call, "route", ""), CLAIM_PRIORITY)
        heapq.heappush(self.deferred, (prio, next(self._seq), call, followup, first))

    def allows_claim(self, now: float, after: int = 0) -> bool:
        """A claim may go now, once `after` more calls (this turn's reports, sent before it) have taken
        their tokens: no Retry-After holds, nothing of higher priority waits, and a token is left for a
        settlement after it. Takes no token (the claim's submit does)."""
        if now < self.claims_paused_until:
            return False
        if self.rate is None:
            return True
        return not self.deferred and self._tokens(now) >= 2.0 + after

    def release(self, now: float) -> None:
        """Send queued calls as tokens come in; grow a learned rate while no 429 comes."""
        self._creep(now)
        while self.deferred and self._take(now):
            _, _, call, followup, first = heapq.heappop(self.deferred)
            self._send(call, followup, first, now)

    def next_deadline(self, now: float) -> float | None:
        times = []
        if self.claims_paused_until > now:
            times.append(self.claims_paused_until)
        if self.rate and self.deferred:
            times.append(now + max(0.0, 1.0 - self._tokens(now)) / self.rate)
        return min(times) if times else None

    def claim_ready_at(self, now: float) -> float:
        """When `allows_claim` may next be true (for the loop's wait)."""
        at = self.claims_paused_until
        if self.rate:
            at = max(at, now + max(0.0, 2.0 - self._tokens(now)) / self.rate)
        return at

    # ------------------------------------------------------------ learning
    def rate_limited(self, now: float, retry_after: float | None, limit: float | None = None) -> None:
        """The API answered 429 RATE_LIMIT_EXCEEDED: hold claims for Retry-After and (unless the rate
        was set) learn the rate to pace at."""
        self.rate_limited_answers += 1
        self.last_429_at = now
        if retry_after:
            self.claims_paused_until = max(self.claims_paused_until, now + float(retry_after))
        if self.fixed:
            return
        if limit and limit > 0:
            self.plan_rate = max(MIN_RATE, PLAN_MARGIN * float(limit))
        if self.rate is not None and self.plan_rate is not None and self.rate <= self.plan_rate * 1.001:
            # Pacing at the plan's rate is not enough: another client spends the plan. Unless the rate
            # was just set: then this answers a request sent before it (several overlap on the wire).
            if now - self.rate_set_at >= ECHO_WINDOW:
                self.rate, self.rate_set_at = max(MIN_RATE, self.rate * SHARED_BACKOFF), now
        elif self.plan_rate is not None:
            self.rate, self.rate_set_at = self.plan_rate, now
        else:
            learned = max(MIN_RATE, LEARN_FACTOR * self._sending_rate(now))
            self.rate, self.rate_set_at = (learned if self.rate is None else min(self.rate, learned)), now
        self.tokens, self.refilled_at = 0.0, now

    def requests_per_second(self, now: float) -> float:
        return self._sending_rate(now)

    # ------------------------------------------------------------ inside
    def _capacity(self) -> float:
        return max(2.0, self.rate or 2.0)  # one second of requests (the server's burst is two), room for a claim

    def _tokens(self, now: float) -> float:
        if self.rate is None:
            return float("inf")
        return min(self._capacity(), self.tokens + (now - self.refilled_at) * self.rate)

    def _take(self, now: float) -> bool:
        tokens = self._tokens(now)
        self.refilled_at = now
        if tokens >= 1.0:
            self.tokens = tokens - 1.0
            return True
        self.tokens = tokens
        return False

    def _send(self, call: BuiltCall, followup: Followup, first: bool, now: float) -> None:
        self.sent += 1
        self.recent.append(now)
        self.send(call, followup, first)

    def _sending_rate(self, now: float) -> float:
        while self.recent and self.recent[0] < now - RATE_WINDOW:
            self.recent.popleft()
        return len(self.recent) / RATE_WINDOW

    def _creep(self, now: float) -> None:
        if self.fixed or self.rate is None or now - self.last_429_at < CREEP_EVERY or now - self.crept_at < CREEP_EVERY:
            return
        self.crept_at = now
        grown = self.rate * (1.0 + CREEP_BY)
        self.rate = min(grown, self.plan_rate) if self.plan_rate is not None else grown
