"""The parent's in-flight table: which job each child runs, its lease, and its deadlines.

Pure bookkeeping on monotonic times; no I/O. A job enters when claimed and leaves when
its outcome is acknowledged by the API, its lease is found lost, or the daemon gives it back.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Entry:
    job: dict
    claimed_at: float
    lease_until: float
    renew_at: float
    slot: int | None = None  # the child running it; None while waiting for a child or reporting
    pid: int | None = None
    started_at: float | None = None
    timeout_at: float | None = None
    outcome: tuple | None = None  # ("complete", result) or ("fail", error), once known
    kind: str = "completed"  # the metrics outcome: completed, failed, timed_out or crashed
    duration: float | None = None  # how long the child ran it, once it ended
    renewing: bool = False
    reporting: bool = False
    report_attempts: int = 0

    @property
    def id(self) -> str:
        return self.job["id"]

    @property
    def lease_id(self) -> str:
        return self.job.get("lease_id") or ""

    @property
    def queue(self) -> str:
        return self.job.get("queue_name") or ""


class InFlight:
    """Jobs this worker holds, keyed by job id. `renew_every` is a third of the lease."""

    def __init__(self, lease_secs: int):
        self.lease_secs = lease_secs
        self.renew_every = max(1.0, lease_secs / 3.0)
        self.jobs: dict[str, Entry] = {}

    def __len__(self) -> int:
        return len(self.jobs)

    def add(self, job: dict, now: float) -> Entry:
        entry = Entry(job=job, claimed_at=now, lease_until=now + self.lease_secs, renew_at=now + self.renew_every)
        self.jobs[job["id"]] = entry
        return entry

    def get(self, job_id: str) -> Entry | None:
        return self.jobs.get(job_id)

    def pop(self, job_id: str) -> Entry | None:
        return self.jobs.pop(job_id, None)

    def start(self, entry: Entry, slot: int, pid: int | None, now: float) -> None:
        entry.slot, entry.pid, entry.started_at = slot, pid, now
        timeout = entry.job.get("timeout_seconds")
        entry.timeout_at = now + float(timeout) if timeout and timeout > 0 else None

    def finish(self, entry: Entry, outcome: tuple, now: float, kind: str = "failed") -> None:
        """The child is done with it (or was stopped): record how and for how long; what is left is
        telling the API. `kind` labels a failure for the metrics (failed, timed_out, crashed)."""
        entry.outcome, entry.slot, entry.timeout_at = outcome, None, None
        entry.kind = "completed" if outcome[0] == "complete" else kind
        if entry.started_at is not None:
            entry.duration = now - entry.started_at

    def renewed(self, entry: Entry, sent_at: float) -> None:
        entry.lease_until = sent_at + self.lease_secs
        entry.renew_at = sent_at + self.renew_every
        entry.renewing = False

    def waiting(self) -> list[Entry]:
        """Claimed jobs not yet handed to a child, oldest first."""
        return [e for e in self.jobs.values() if e.slot is None and e.outcome is None]

    def renewals_due(self, now: float) -> list[Entry]:
        return [e for e in self.jobs.values() if not e.renewing and e.renew_at <= now]

    def timed_out(self, now: float) -> list[Entry]:
        return [e for e in self.jobs.values() if e.timeout_at is not None and e.timeout_at <= now and e.outcome is None]

    def on_child(self, slot: int) -> Entry | None:
        for e in self.jobs.values():
            if e.slot == slot and e.outcome is None:
                return e
        return None

    def next_deadline(self) -> float | None:
        times = [e.renew_at for e in self.jobs.values() if not e.renewing]
        times += [e.timeout_at for e in self.jobs.values() if e.timeout_at is not None and e.outcome is None]
        return min(times) if times else None
