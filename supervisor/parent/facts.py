"""What the parent's parts tell the arbiter, and what an API call carries back.

Parts never call each other: a method of the pool, claiming, settling or membership returns a list of
these facts, and the arbiter routes each one to the part that acts on it (`Arbiter.route`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from supervisor.client.rest import ApiError


@dataclass(frozen=True)
class JobDone:
    """A child answered for its job: `ok` with `value` the result, else `value` the error text."""

    slot: int
    job_id: str
    ok: bool
    value: Any


@dataclass(frozen=True)
class JobStarted:
    """A child started the job it held, at `at` (time.monotonic() in the child)."""

    slot: int
    job_id: str
    at: float


@dataclass(frozen=True)
class JobReturned:
    """A child gave back its held job unstarted (asked to, or it ended): the job is unassigned again."""

    slot: int
    job_id: str


@dataclass(frozen=True)
class ChildReady:
    """A child imported the handler and waits for work; `first` when it is the daemon's first."""

    slot: int
    first: bool


@dataclass(frozen=True)
class ChildLost:
    """A child stopped without answering for its job (it died, or the pool stopped it):
    whatever job ran on `slot` fails with `error`, labelled `outcome` in the metrics."""

    slot: int
    error: str
    outcome: str


@dataclass(frozen=True)
class StopJob:
    """Settling gave up on `job_id` (timeout, lost lease): stop the child running it."""

    slot: int
    job_id: str
    reason: str


@dataclass(frozen=True)
class JobSettled:
    """`job_id` settled (`settled_as`: completed, failed, lease_lost, or error when the API refused its
    report; `refused` when it refused the result, which is then failed instead and settles again), told to the
    child `pid` that ran it: the SDK worker's hooks of that event run there."""

    pid: int
    job_id: str
    settled_as: str
    error: str = ""
    operation: str = ""


@dataclass(frozen=True)
class RecallJob:
    """The held job `job_id` is wanted back from the child on `slot` (lease lost, a drain)."""

    slot: int
    job_id: str


@dataclass(frozen=True)
class Fatal:
    """An error the daemon cannot work past: stop claiming, deliver what is in flight, exit `code`."""

    code: int
    error: str


@dataclass(frozen=True)
class ExitNow:
    """Stop at once with `code` (registration refused, handler cannot be imported)."""

    code: int


@dataclass(frozen=True)
class Registered:
    """The API accepted the registration."""


@dataclass(frozen=True)
class TakenOver:
    """A newer daemon now heartbeats on our worker id (`other` describes it): yield the row to it."""

    other: str


@dataclass(frozen=True)
class DrainAsked:
    """The API asked this worker to drain (a heartbeat answer's `should_drain`)."""


@dataclass(frozen=True)
class HandBack:
    """Give every reserved (claimed, not started) job back to the queue, failed with `error`."""

    error: str


@dataclass(frozen=True)
class ShedJob:
    """Stop the child on `slot` running `job_id` and fail the job with `error` (memory pressure)."""

    slot: int
    job_id: str
    error: str


@dataclass(frozen=True)
class QueueFreed:
    """A child ended a job of `queue` (after `duration` s): the queue had work and a child is free, so claim
    there again at once (and learn how long its jobs run)."""

    queue: str
    duration: float | None


@dataclass(frozen=True)
class RetryDue:
    """A job of `queue` this daemon failed comes back to the queue at `at` (the server's retry back-off):
    nothing announces that, so claim there then."""

    queue: str
    at: float


@dataclass(frozen=True)
class JobReissued:
    """A claim brought a job this worker still held (`old`, already out of the table): the server handed it
    out again under a new lease, so the old copy's work and answers are void."""

    old: Any  # the in-flight table's Entry


@dataclass(frozen=True)
class WorkCreated:
    """The events stream announced a job on `queue` (None: on some queue of ours): claim there now."""

    queue: str | None


@dataclass(frozen=True)
class Listening:
    """The events stream went live (`live`) or down: re-check every queue, and poll slowly only while live."""

    live: bool


Heard = WorkCreated | Listening  # what the events stream tells claiming
Fact = (JobDone | JobStarted | JobReturned | ChildReady | ChildLost | StopJob | RecallJob | Fatal | ExitNow | Registered
        | TakenOver | DrainAsked | HandBack | ShedJob | QueueFreed | RetryDue | JobReissued | Heard | JobSettled)


class Followup(NamedTuple):
    """What an API call does with its answer. `answer(result, error, now)` returns facts; if it raises (a
    bug, or an answer of a shape nobody foresaw), `recover(now)` puts back the state the call held, so
    nothing waits on it for ever. A named tuple: one is made for every call, and a tuple is cheap to make."""

    answer: Callable[[Any, ApiError | None, float], Sequence[Fact] | None]
    recover: Callable[[float], Sequence[Fact] | None]


Submit = Callable[..., None]  # submit(call, followup, first=False): the arbiter's way out to the API
