"""What the parent's parts tell the arbiter, and what an API call carries back.

Parts never call each other: a method of the pool, the jobs wing or membership returns a list of these
facts, and the arbiter routes each one to the part that acts on it (`Arbiter.route`, one `match`). The
jobs wing's own facts (`QueueFreed`, `RetryDue`, `JobReissued`) are routed inside it; what it returns
are orders for the pool (`GiveJob`, `HoldJob`, `RecallJob`, `StopJob`, `JobSettled`), calls for the
transport (`Send`) and the facts that concern the daemon (`Fatal`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from supervisor.client.calls import ApiError
from supervisor.job import Job


@dataclass(slots=True)
class JobDone:
    """A child answered for its job: `ok` with `value` the result, else `value` the error text. Slots and
    not frozen, as the other facts made for every job (`QueueFreed`, `GiveJob`, `Send`, `JobSettled`): a
    frozen dataclass sets each field through object.__setattr__ and a named tuple's __new__ is a Python
    function, both dearer to make. Nothing changes a fact once made."""

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


@dataclass(slots=True)
class GiveJob:
    """Send `job` to the idle `child` (the pool's Child), to start at once (made for every job: see
    `JobDone`)."""

    child: Any
    job: Job


@dataclass(slots=True)
class HoldJob:
    """Send `job` ahead to the busy `child`, to start the moment its own job ends if that is before
    `start_by` (monotonic), else to give back."""

    child: Any
    job: Job
    start_by: float


@dataclass(frozen=True)
class NotSent:
    """The job `job_id` given or sent ahead to the child on `slot` never reached it (its socket is gone)."""

    slot: int
    job_id: str


@dataclass(frozen=True)
class StopJob:
    """The jobs wing gave up on `job_id` (timeout, lost lease): stop the child running it."""

    slot: int
    job_id: str
    reason: str


@dataclass(slots=True)
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


@dataclass(slots=True)
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
Order = GiveJob | HoldJob | RecallJob | StopJob | JobSettled  # what the jobs wing asks of the pool


class Followup(NamedTuple):
    """What an API call does with its answer. `answer(result, error, now)` returns facts; if it raises (a
    bug, or an answer of a shape nobody foresaw), `recover(now)` puts back the state the call held, so
    nothing waits on it for ever. A named tuple: one is made for every call, and a tuple is cheap to make."""

    answer: Callable[[Any, ApiError | None, float], Sequence[Fact] | None]
    recover: Callable[[float], Sequence[Fact] | None]


@dataclass(slots=True)
class Send:
    """An API call for the transport: `call` goes out within the request budget, its answer to `followup`;
    `first` puts it ahead of the calls already waiting for a connection (a claim)."""

    call: Any
    followup: Followup
    first: bool = False


Submit = Callable[..., None]  # submit(call, followup, first=False): the arbiter's way out to the API
Fact = (JobDone | JobStarted | JobReturned | ChildReady | ChildLost | StopJob | RecallJob | Fatal | ExitNow | Registered
        | TakenOver | DrainAsked | HandBack | ShedJob | QueueFreed | RetryDue | JobReissued | Heard | GiveJob | HoldJob
        | NotSent | Send | JobSettled)
