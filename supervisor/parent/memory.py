"""Memory pressure: from readings of the memory the daemon has, decide when to stop taking work and what to shed.

`MemoryPressure` is sans-I/O: `observe(reading, now, reserved, running)` gets one reading (used and limit
in bytes, see supervisor.ops.cgroup) and returns facts; `paused` says whether claims and job starts wait.

- at or above *high*: pause (no claims, no reserved job started) and hand reserved jobs back;
- at or above *max*: also shed the newest running job (its child is stopped, the job failed with a
  `MemoryPressure` error so it retries elsewhere), one at a time, `SHED_PAUSE` apart so the memory
  freed is measured before the next;
- below *high* minus the hysteresis band: resume.

Lease renewals and reports are not this part's business: they never stop.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from logging import INFO, WARNING

from supervisor.ops.cgroup import MemoryReading
from supervisor.ops.logs import log_event
from supervisor.parent.facts import Fact, HandBack, ShedJob

log = logging.getLogger("supervisor")

SHED_PAUSE = 2.0  # seconds between two shed jobs: time for the first one's memory to be freed and measured
HYSTERESIS = 0.05  # of the limit: resume once below high by this much
MiB = 2**20


@dataclass(frozen=True)
class Level:
    """A threshold as given: a percent of the limit, or an absolute number of MiB."""

    value: float
    percent: bool

    def bytes(self, limit: int) -> int:
        return int(limit * self.value / 100) if self.percent else int(self.value * MiB)

    def __str__(self) -> str:
        return f"{self.value:g}%" if self.percent else f"{self.value:g} MiB"


@dataclass(frozen=True)
class Running:
    """A job running on a child, as the shedding decision sees it."""

    slot: int
    job_id: str
    started_at: float


class MemoryPressure:
    """Owns the pressure state (`state`: ok, high or max; `paused`) and decides from each reading."""

    def __init__(self, high: Level, max_: Level, shed_pause: float = SHED_PAUSE):
        self.high = high
        self.max = max_
        self.shed_pause = shed_pause
        self.state = "ok"
        self.paused = False
        self.reading: MemoryReading | None = None  # the last one
        self.next_shed_at = 0.0
        self.shed = 0  # jobs shed so far
        self.handed_back = 0  # hand-backs asked so far

    def thresholds(self, limit: int) -> tuple[int, int, int]:
        """(high, max, resume) in bytes for `limit`."""
        high, top = self.high.bytes(limit), self.max.bytes(limit)
        return high, top, max(0, high - int(limit * HYSTERESIS))

    def observe(self, reading: MemoryReading | None, now: float, reserved: int, running: list[Running]) -> list[Fact]:
        """Take one reading; return what to do: `HandBack` of the reserved jobs, `ShedJob` of the newest one."""
        if reading is None:
            return []
        self.reading = reading
        high, top, resume = self.thresholds(reading.limit)
        used = reading.used
        self.state = "max" if used >= top else "high" if used >= high else "ok"
        if self.state != "ok" and not self.paused:
            self.paused = True
            log_event(log, WARNING, "memory above the high threshold: pausing claims and handing reserved jobs back",
                      used_mb=used // MiB, high_mb=high // MiB, limit_mb=reading.limit // MiB, source=reading.source)
        elif self.paused and used < resume:
            self.paused = False
            log_event(log, INFO, "memory back below the high threshold: resuming claims", used_mb=used // MiB,
                      resume_below_mb=resume // MiB)
        facts: list[Fact] = []
        if self.paused and reserved:
            self.handed_back += 1
            facts.append(HandBack(f"MemoryPressure: handed back unstarted: this worker's memory is at "
                                  f"{used // MiB} MiB of {reading.limit // MiB} MiB, over its high threshold "
                                  f"({high // MiB} MiB)"))
        if self.state == "max" and running and now >= self.next_shed_at:
            newest = max(running, key=lambda r: (r.started_at, r.slot))
            self.next_shed_at = now + self.shed_pause
            self.shed += 1
            log_event(log, WARNING, "memory above the max threshold: stopping the newest running job",
                      used_mb=used // MiB, max_mb=top // MiB, job_id=newest.job_id, slot=newest.slot)
            facts.append(ShedJob(newest.slot, newest.job_id,
                                 f"MemoryPressure: this worker's memory reached {used // MiB} MiB of "
                                 f"{reading.limit // MiB} MiB, over its max threshold ({top // MiB} MiB); this job, "
                                 "the newest running, was stopped so that it can retry elsewhere"))
        return facts

    def heartbeat_fields(self) -> dict | None:
        """The last reading as a heartbeat carries it (None before the first)."""
        reading = self.reading
        if reading is None:
            return None
        return {"used_bytes": reading.used, "limit_bytes": reading.limit, "source": reading.source,
                "pressure": self.state}

    def stats(self) -> dict:
        """Plain data for the published snapshot (/status and the metrics)."""
        out: dict = {"state": self.state, "paused": self.paused, "high": str(self.high), "max": str(self.max),
                     "shed_jobs": self.shed}
        if self.reading is not None:
            high, top, resume = self.thresholds(self.reading.limit)
            out.update(used_bytes=self.reading.used, limit_bytes=self.reading.limit, source=self.reading.source,
                       high_bytes=high, max_bytes=top, resume_bytes=resume)
        return out
