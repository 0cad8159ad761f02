"""The parent's in-flight table: which job each child runs, its lease, and its deadlines.

Pure bookkeeping on monotonic times; no I/O. A job enters when claimed and leaves when its
outcome is acknowledged by the API, its lease is found lost, or the daemon gives it back.
Only `InFlight`'s methods change an `Entry`.

The table keeps a bound no deadline of any entry is earlier than (`next_deadline`): each method that
sets a deadline lowers it, `rescan` makes it exact again. Before the bound nothing can be due, so the
loop skips its scans of the table (`due`); with a reserve of a hundred jobs those scans, every turn,
were a fifth of the parent's CPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from supervisor.job import Job
from supervisor.parent.single import OneAtATime


@dataclass(slots=True)
class Outcome:
    """How a job ended: `ok` with `value` the result, or not with `value` the error text. `label` is
    the metrics outcome: completed, failed, timed_out or crashed (made for every job: slots, not frozen)."""

    ok: bool
    value: Any
    label: str

    @property
    def verb(self) -> str:
        return "complete" if self.ok else "fail"


@dataclass(eq=False, slots=True)
class Entry:
    """One job this worker holds: the job as claimed, its lease, the child that has it and how it ended.
    `InFlight`'s record: only its methods change the fields (`renewal` and `report` are its calls on the wire).
    `id`, `lease_id` and `queue` are the job's, copied once (they are read a dozen times a job)."""

    job: Job  # the job as the claim answered it
    claimed_at: float
    lease_until: float  # when the lease runs out unless renewed
    renew_at: float  # when to renew it next
    slot: int | None = None  # the child running (or holding) it; None while unassigned or reporting
    pid: int | None = None  # that child's pid
    held: bool = False  # sent ahead to the busy child on `slot`, not started yet
    started_at: float | None = None
    timeout_at: float | None = None  # its timeout_seconds from when a child started it
    outcome: Outcome | None = None  # once the child is done with it
    duration: float | None = None  # how long the child ran it, once it ended
    renewal: OneAtATime = field(default_factory=OneAtATime)  # a renewal of its lease on the wire
    report: OneAtATime = field(default_factory=OneAtATime)  # its outcome on the wire
    report_attempts: int = 0
    report_due_at: float | None = None  # send the outcome again at this time (after a failed attempt)
    id: str = field(init=False)
    lease_id: str = field(init=False)
    queue: str = field(init=False)

    def __post_init__(self) -> None:
        self.id, self.lease_id, self.queue = self.job.id, self.job.lease_id, self.job.queue


def job_fields(entry: Entry, worker_id: str, now: float) -> dict:
    """What every job log line carries: job_id, queue, worker_id, the child's pid and the duration so far."""
    duration = entry.duration
    if duration is None:
        duration = now - entry.started_at if entry.started_at is not None else 0.0
    return {"job_id": entry.id, "queue": entry.queue, "worker_id": worker_id, "pid": entry.pid,
            "duration": round(duration, 4)}


class InFlight:
    """Jobs this worker holds, keyed by job id. `renew_every` is a third of the lease."""

    def __init__(self, lease_secs: int):
        self.lease_secs = lease_secs
        self.renew_every = max(1.0, lease_secs / 3.0)
        self.jobs: dict[str, Entry] = {}
        self._unassigned: dict[str, Entry] = {}  # the entries of `jobs` claimed and not yet given a child or an outcome
        self._held: dict[str, Entry] = {}  # the entries of `jobs` sent ahead to a busy child, not started yet
        self._running: dict[int, Entry] = {}  # slot -> the entry its child runs (started, no outcome yet)
        self._bound = math.inf  # no deadline of any entry is earlier (see the module docstring)

    def __len__(self) -> int:
        return len(self.jobs)

    # -- entering and leaving --
    def add(self, job: Job, now: float) -> Entry:
        entry = Entry(job=job, claimed_at=now, lease_until=now + self.lease_secs, renew_at=now + self.renew_every)
        self.jobs[job.id] = self._unassigned[job.id] = entry
        self._lower(entry.renew_at)
        return entry

    def get(self, job_id: str | None) -> Entry | None:
        return self.jobs.get(job_id) if job_id is not None else None

    def current(self, entry: Entry) -> bool:
        """`entry` is still the table's entry for its job (not settled, not replaced by a re-issue)."""
        return self.jobs.get(entry.id) is entry

    def pop(self, job_id: str) -> Entry | None:
        self._unassigned.pop(job_id, None)
        self._held.pop(job_id, None)
        entry = self.jobs.pop(job_id, None)
        if entry is not None:
            self._not_running(entry)
        return entry

    def _not_running(self, entry: Entry) -> None:
        if entry.slot is not None and self._running.get(entry.slot) is entry:
            del self._running[entry.slot]

    def _not_reserved(self, entry: Entry) -> None:
        if self._unassigned.get(entry.id) is entry:
            del self._unassigned[entry.id]
        if self._held.get(entry.id) is entry:
            del self._held[entry.id]
        entry.held = False

    # -- the job's life --
    def hold(self, entry: Entry, slot: int, pid: int | None) -> None:
        """`entry` was sent ahead to the busy child on `slot`; it starts (`start`) or comes back (`unhold`)."""
        self._not_reserved(entry)
        entry.slot, entry.pid, entry.held = slot, pid, True
        self._held[entry.id] = entry

    def unhold(self, entry: Entry) -> None:
        """The child gave `entry` back unstarted: it is unassigned again (its lease deadline included)."""
        self._not_reserved(entry)
        entry.slot = entry.pid = None
        self._unassigned[entry.id] = entry
        self._lower(self._renewal_deadline(entry))

    def unstart(self, entry: Entry) -> None:
        """The job given to an idle child never reached it (its socket was gone): it is unassigned again."""
        self._not_running(entry)
        entry.slot = entry.pid = entry.started_at = entry.timeout_at = None
        self._unassigned[entry.id] = entry
        self._lower(self._renewal_deadline(entry))

    def start(self, entry: Entry, slot: int, pid: int | None, now: float) -> None:
        """A child on `slot` started `entry` at `now` (given to it idle, or the held job it started)."""
        self._not_reserved(entry)
        self._running[slot] = entry
        entry.slot, entry.pid, entry.started_at = slot, pid, now
        timeout = entry.job.timeout_seconds
        entry.timeout_at = now + float(timeout) if timeout and timeout > 0 else None
        self._lower(entry.timeout_at)

    def record_outcome(self, entry: Entry, outcome: Outcome, now: float) -> None:
        """The child is done with it (or was stopped): record how and for how long; what is left is
        telling the API."""
        self._not_reserved(entry)
        self._not_running(entry)
        entry.outcome, entry.slot, entry.timeout_at = outcome, None, None
        if entry.started_at is not None:
            entry.duration = now - entry.started_at

    def replace_outcome(self, entry: Entry, outcome: Outcome) -> None:
        self._not_reserved(entry)
        self._not_running(entry)
        entry.outcome = outcome

    # -- reports --
    def begin_report(self, entry: Entry) -> bool:
        """Send its outcome now, unless a report of it is on the wire (then False)."""
        if not entry.report.start():
            return False
        entry.report_due_at = None
        entry.report_attempts += 1
        return True

    def report_answered(self, entry: Entry, retry_at: float | None = None) -> None:
        """The report's answer came (or it failed): send it again at `retry_at` if given."""
        entry.report.done()
        entry.report_due_at = retry_at
        self._lower(retry_at)

    def reports_due(self, now: float) -> list[Entry]:
        return [e for e in self.jobs.values() if e.report_due_at is not None and e.report_due_at <= now]

    # -- leases --
    def begin_renewal(self, entry: Entry) -> None:
        entry.renewal.start()

    def renewed(self, entry: Entry, sent_at: float) -> None:
        entry.lease_until = sent_at + self.lease_secs
        entry.renew_at = sent_at + self.renew_every
        entry.renewal.done()
        self._lower(entry.renew_at)

    def renewal_failed(self, entry: Entry, retry_at: float) -> None:
        entry.renewal.done()
        entry.renew_at = retry_at
        self._lower(self._renewal_deadline(entry))

    # -- queries --
    def unassigned(self) -> list[Entry]:
        """Reserved jobs no child has (neither running nor held), oldest first."""
        return list(self._unassigned.values())

    def unassigned_count(self) -> int:
        return len(self._unassigned)

    def held(self) -> list[Entry]:
        """Jobs sent ahead to busy children and not started yet."""
        return list(self._held.values())

    def held_count(self) -> int:
        return len(self._held)

    def running(self) -> list[Entry]:
        """Jobs a child runs now (started, no outcome yet)."""
        return list(self._running.values())

    def stats(self) -> dict:
        """Plain data for the published snapshot: how many jobs are held, and when each running one started."""
        return {"inflight": len(self.jobs), "started_at": {e.id: e.started_at for e in self._running.values()}}

    def renewals_due(self, now: float) -> list[Entry]:
        return [e for e in self.jobs.values() if not e.renewal.busy and e.renew_at <= now]

    def timed_out(self, now: float) -> list[Entry]:
        return [e for e in self.jobs.values() if e.timeout_at is not None and e.timeout_at <= now and e.outcome is None]

    def on_child(self, slot: int) -> Entry | None:
        """The job the child on `slot` runs, if any (not the one it holds)."""
        return self._running.get(slot)

    # -- deadlines --
    def _lower(self, t: float | None) -> None:
        if t is not None and t < self._bound:
            self._bound = t

    def _renewal_deadline(self, e: Entry) -> float | None:
        """The renewal, or for a job not started its lease's end if sooner (a renewal retried past it):
        then `enforce` drops the job. None while a renewal is on the wire."""
        if e.renewal.busy:
            return None
        return min(e.renew_at, e.lease_until) if self._unassigned.get(e.id) is e or e.held else e.renew_at

    def next_deadline(self) -> float | None:
        """When a deadline may next be due: never later than the earliest one (a renewal, a timeout, a
        report to resend, an unassigned job's lease), earlier only until the next `rescan`; None if none."""
        return None if self._bound == math.inf else self._bound

    def due(self, now: float) -> bool:
        """Whether any deadline may be due at `now` (False: none is, the scans can be skipped)."""
        return now >= self._bound

    def rescan(self) -> None:
        """Make the bound exact: one pass over the table."""
        soonest = math.inf
        for e in self.jobs.values():
            for t in (self._renewal_deadline(e), e.timeout_at if e.outcome is None else None, e.report_due_at):
                if t is not None and t < soonest:
                    soonest = t
        self._bound = soonest
