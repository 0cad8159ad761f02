"""The child pool in-process: a real ChildPool whose children are fakes (a fake proc and channel), with helpers
that start, ready, feed and end them. No process is started; the clock is plain floats."""

from __future__ import annotations

from support.parent_fakes import FakeSelector, Hooks, Signals, Spawner, make_cfg, no_process_is_touched

from supervisor.job import Job
from supervisor.parent.pool import ChildPool

T0 = 100.0


class Rig:
    def __init__(self, monkeypatch, **cfg) -> None:
        self.spawner = Spawner()
        self.signals = Signals()
        no_process_is_touched(monkeypatch, self.signals, self.spawner)
        self.sel = FakeSelector()
        self.hooks = Hooks()
        self.pool = ChildPool(make_cfg(**cfg), self.sel, self.hooks)  # type: ignore[arg-type]

    def converge(self, now: float, stopping: bool = False) -> None:
        self.pool.converge(now, stopping_for_good=stopping)

    def ready(self, child, now: float = T0) -> list:
        child.chan.inbox.append({"t": "ready", "pid": child.pid})
        return self.pool.read(child, now)

    def up(self, now: float = T0) -> list:
        """Start every slot and have each child say ready; return the children by slot."""
        self.converge(now)
        for child in list(self.pool.children.values()):
            if child.starting:
                self.ready(child, now)
        return [self.pool.children[s] for s in sorted(self.pool.children)]

    def give(self, child, job_id: str = "a") -> None:
        assert self.pool.give_job(child, Job.parse({"id": job_id, "lease_id": "L"}))

    def done(self, child, job_id: str = "a", now: float = T0) -> list:
        child.chan.inbox.append({"t": "done", "id": job_id, "ok": True, "result": 1})
        return self.pool.read(child, now)

    def exit(self, child, code: int, now: float) -> list:
        child.proc.exitcode = code
        return self.pool.reap(child, now)
