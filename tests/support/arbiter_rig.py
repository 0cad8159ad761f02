"""The arbiter in-process: a real Arbiter whose HTTP client, deregistration, selector and pool shutdown are
fakes, with helpers that walk it to a phase (started, running, holding a job). The clock is plain floats."""

from __future__ import annotations

import os

from support.parent_fakes import (
    FakeSelector,
    Hooks,
    Signals,
    Spawner,
    Submit,
    make_api,
    make_cfg,
    no_process_is_touched,
)

from supervisor.parent.arbiter import Arbiter, Phase

T0 = 100.0


class Rig:
    def __init__(self, monkeypatch, **cfg) -> None:
        self.spawner = Spawner()
        self.signals = Signals()
        no_process_is_touched(monkeypatch, self.signals, self.spawner)
        self.hooks = Hooks()
        self.arb = Arbiter(make_cfg(**cfg), make_api(), self.hooks)
        self.submit = Submit()
        monkeypatch.setattr(self.arb.loop_transport, "submit",
                            lambda followup, call, first=False: self.submit(call, followup, first))
        monkeypatch.setattr(self.arb.pool, "sel", FakeSelector())  # fake children have no file descriptors
        self.deregistered: list[tuple[str, float | None]] = []
        monkeypatch.setattr(self.arb.transport, "deregister", lambda worker_id, timeout=None: self.deregistered.append(
            (worker_id, timeout)))
        self.shutdowns = 0
        monkeypatch.setattr(self.arb.pool, "shutdown", self._shutdown)

    def _shutdown(self) -> None:
        self.shutdowns += 1

    def close(self) -> None:
        self.arb.loop_transport.close()
        self.arb.sel.close()
        os.close(self.arb.wake_r)
        os.close(self.arb.wake_w)

    def start(self, now: float = T0) -> None:
        """Start the children and have them say ready (the first one triggers the registration)."""
        self.arb.pool.converge(now, stopping_for_good=False)
        for child in list(self.arb.pool.children.values()):
            child.chan.inbox.append({"t": "ready"})
            self.arb.route(self.arb.pool.read(child, now), now)

    def running(self, now: float = T0) -> None:
        """Started and registered."""
        self.start(now)
        _, followup, _ = self.submit.take("register")
        self.arb.route(followup.answer({"heartbeat_interval_secs": 10}, None, now), now)
        assert self.arb.phase is Phase.RUNNING

    def answer(self, route: str, result=None, err=None, now: float = T0) -> None:
        _, followup, _ = self.submit.take(route)
        self.arb.route(followup.answer(result, err, now), now)

    def run_job(self, job_id: str = "a", now: float = T0, **fields) -> None:
        """Claim `job_id` and hand it to a child."""
        self.arb.feed_children(now)
        self.answer("claim", [{"id": job_id, "lease_id": f"L-{job_id}", "queue_name": "q", **fields}], now=now)
        self.arb.feed_children(now)
        assert self.arb.jobs.inflight.get(job_id).slot is not None

    def signal(self, *sigs: int, now: float = T0) -> None:
        for sig in sigs:
            self.arb.signals.put_nowait(sig)
        self.arb.handle_signals(now)

    def child_of(self, job_id: str):
        return next(c for c in self.arb.pool.children.values() if c.job_id == job_id)
