"""How many jobs to claim, and when: claim just ahead of need, in batches.

Pure decisions on numbers claiming measures; no I/O. The idea is Little's law: a child that
will be free within about one claim round trip should find a job reserved for it, so the reserve of
claimed-but-not-started jobs covers the round trip and no more. Jobs much longer than a round
trip are never reserved (their children are claimed for when idle, as with no prefetch), so a
fleet of daemons shares long jobs as evenly as before.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from dataclasses import dataclass

from supervisor.backoff import backoff
from supervisor.parent.wake import SAFETY_POLL

MAX_CLAIM = 100  # the API's largest `limit`
HORIZON_RTTS = 2.0  # claim for children that will be free within this many round trips
HORIZON_SLACK = 0.005  # seconds added to the horizon: the loop turn, the frame to the child
CLAIM_SHARE = 0.1  # under a known request rate, claims may use this share of it
SETTLE_SHARE = 0.9  # ... and jobs (one complete each) the rest
NEED_SLACK_RTTS = 0.5  # next_need_at wakes the loop this many round trips after the need (of the two the
# horizon covers): a child's answer in between, every few ms with short jobs, claims then at no extra turn
MAX_STEPS = 32  # next_need_at looks this many starts ahead at most (it costs the loop every turn)
HOLD_MAX_RUN = 0.25  # seconds: a busy child is sent its next job ahead only when jobs run no longer than
# this (and its own is expected to end within it), so a long job never waits behind another
MIN_BATCH_WINDOW = 0.1  # seconds: a claim carries at least this long's starts, so short jobs do not
# cost a claim each (a claim request costs the API and both processes more CPU than a job's complete)


class Ewma:
    """An exponentially weighted moving average; `value` is None until the first sample, or a seed."""

    def __init__(self, alpha: float = 0.2):
        self.alpha = alpha
        self.value: float | None = None
        self.seeded = False  # `value` is a prior, not a measure: the first sample replaces it

    def add(self, sample: float) -> None:
        if self.value is None or self.seeded:
            self.value = sample
        else:
            self.value += self.alpha * (sample - self.value)
        self.seeded = False

    def seed(self, prior: float) -> None:
        """Start from `prior` until the first sample (never over a measured value)."""
        if self.value is None:
            self.value, self.seeded = prior, True


class Tail:
    """A high percentile of the last `window` samples (claim round trips): claims sized and timed on it,
    not on the mean, so one slow answer in ten does not leave a child without a job. It is held to
    `cap` times the median, so a stall of a few seconds (the host paused, the API stuck) does not size
    the next claims for seconds of work. `value` is None until the first sample."""

    def __init__(self, quantile: float = 0.9, window: int = 32, cap: float = 3.0):
        self.quantile = quantile
        self.cap = cap
        self.samples: deque[float] = deque(maxlen=window)
        self.value: float | None = None

    def add(self, sample: float) -> None:
        self.samples.append(sample)
        ordered = sorted(self.samples)
        high = ordered[min(len(ordered) - 1, int(self.quantile * len(ordered)))]
        self.value = min(high, self.cap * ordered[len(ordered) // 2])


@dataclass(frozen=True)
class Need:
    """What claiming knows when it decides to claim."""

    idle: int  # idle children now
    reserved: int  # jobs claimed and not yet started (the reserve)
    remaining: tuple[float, ...]  # for each busy child, its job's expected time left (s); unknown: inf
    procs: int  # children in the pool
    rtt: float | None  # claim round trip estimate (s): a high percentile of those measured
    run_time: float | None  # job run time estimate (s), across the queues served
    prefetch: int | None  # None = auto; 0 = only for idle children; N = at most N reserved
    rate: float | None  # requests/s the daemon may spend, if known


def horizon(rtt: float | None) -> float:
    return HORIZON_RTTS * rtt + HORIZON_SLACK if rtt is not None else 0.0


def starts_within(h: float, n: Need) -> int:
    """Jobs the children will start within `h` seconds: an idle child one now and one after each run,
    a busy child one when its job ends (if within `h`) and one after each run from then."""
    run = max(n.run_time or 0.0, 1e-4)
    total = n.idle * (1 + math.floor(h / run))
    for left in n.remaining:
        if left <= h:
            total += 1 + math.floor((h - left) / run)
    return total


def claim_size(n: Need) -> int:
    """How many jobs one claim should ask for now; 0 = do not claim.

    Claim when the jobs reserved will not last the horizon (the children will start more than that
    within two round trips), and ask for the horizon's starts plus a batch: one more horizon of
    starts, or, under a request budget, the starts between the claims the budget can afford."""
    if n.prefetch == 0 or n.rtt is None or n.run_time is None:
        return max(0, min(MAX_CLAIM, n.idle - n.reserved))
    h = horizon(n.rtt)
    need = starts_within(h, n)
    if n.reserved >= need:
        return 0
    starts = n.procs / max(n.run_time, 1e-4)  # jobs started per second with every child busy
    window = max(h, MIN_BATCH_WINDOW)  # the batch: one more horizon of starts (none for long jobs)...
    if n.rate:  # ...or, under a request budget, the gap between the claims it can afford
        starts = min(starts, SETTLE_SHARE * n.rate)
        window = max(window, 1.0 / (CLAIM_SHARE * n.rate))
    want = need + math.floor(starts * window) - n.reserved
    if n.prefetch is not None:
        want = min(want, n.prefetch + n.idle - n.reserved)
    return max(0, min(MAX_CLAIM, want))


HISTORY_MIN_JOBS = 20  # a queue's statistics seed its run time when it completed this many jobs in 24 h...
HISTORY_SHORT = 1.0  # ...taking this long or less on average (seconds): short jobs, claimed ahead from the start


def history_run_time(stats: object) -> float | None:
    """The run time a queue's statistics (`GET /queues/{name}/stats`) suggest for its jobs, if they say
    they are short: their mean processing time, claim to completion, so an estimate on the long side."""
    if not isinstance(stats, dict):
        return None
    done, mean_ms = stats.get("completed_jobs_24h"), stats.get("avg_processing_time_ms")
    if not isinstance(done, int) or isinstance(mean_ms, bool) or not isinstance(mean_ms, (int, float)):
        return None
    if done < HISTORY_MIN_JOBS or not 0 < mean_ms <= HISTORY_SHORT * 1000:
        return None
    return mean_ms / 1000.0


def may_hold(run_time: float | None, left: float) -> bool:
    """Whether a busy child whose job has `left` seconds to run may be sent a job of `run_time` seconds
    (an estimate; None = unknown) ahead: both short, so the parent's wake-up and the round trip are no
    longer between the child's jobs, and a held job waits little."""
    return run_time is not None and run_time <= HOLD_MAX_RUN and left <= HOLD_MAX_RUN


def hold_overdue(run_time: float | None, elapsed: float) -> bool:
    """Whether a child's job has run so far past the estimate (`run_time`) that no job should be sent to
    wait behind it (its end is no longer in sight)."""
    return run_time is None or elapsed > run_time + HOLD_MAX_RUN


def next_need_at(now: float, n: Need) -> float | None:
    """When the loop should wake to claim: NEED_SLACK_RTTS round trips after the starts within the
    horizon first outnumber the jobs reserved (claim_size's test), not at each busy child's entry into
    the horizon, which the reserve usually covers; None if no estimate.

    The starts within the horizon go up by one at each (left - h) + k x run from now (k = 0, 1, ...;
    an idle child's left is 0): the answer is the first of those steps after now that makes them
    outnumber `reserved`. With MAX_STEPS or more reserved it answers the first step after now instead
    (earlier: a wasted turn at worst, never a late claim), or None if all of MAX_STEPS are past: the
    children's answers, a job's end every few ms, wake the loop long before the reserve runs out."""
    if n.rtt is None or n.run_time is None:
        return None
    h, run = horizon(n.rtt), max(n.run_time, 1e-4)
    steps = [left - h for left in n.remaining if left != math.inf]
    if not steps:
        return None
    steps += [-h] * n.idle
    heapq.heapify(steps)
    first_ahead = None
    for count in range(1, MAX_STEPS + 1):  # the answer is step reserved + 1 at most: need(now) <= reserved
        t = steps[0]
        if t > 0:
            if count > n.reserved:
                return now + t + NEED_SLACK_RTTS * n.rtt
            if first_ahead is None:
                first_ahead = t
        heapq.heapreplace(steps, t + run)
    return None if first_ahead is None else now + first_ahead


class QueueIntake:
    """Claim timing of one queue."""

    def __init__(self, name: str):
        self.name = name
        self.next_claim_at = 0.0  # claim no sooner (empty-queue back-off; now when it gave a job)
        self.empty_claims = 0  # claims in a row that found fewer jobs than asked
        self.run_time = Ewma()  # how long its jobs run (s)
        self.hinted_at = -math.inf  # when the events stream last announced a job here
        self.retries_due: list[float] = []  # when jobs this daemon failed come due again (no event tells)

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
                safety = now + random.uniform(0.9, 1.0) * max(poll_interval, SAFETY_POLL)
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
