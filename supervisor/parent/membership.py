"""Membership in Spooled: register once, heartbeat with the process tree's usage, know whether the API
answers, and say which errors the daemon cannot work past.

`Membership` alone owns the registration and heartbeat state. The arbiter tells it when to register
(`register`) and passes the plain values a heartbeat reports (`heartbeat_due` / `send_heartbeat`), from
which it builds the heartbeat itself; answers come back as facts
(`Registered`, `Fatal`, `ExitNow`, `TakenOver`).

Registration and heartbeats carry this instance's identity (supervisor.parent.identity: host, pid,
start time, a random instance id). Every ROW_CHECK_EVERY seconds (rounded to a heartbeat), just before
this daemon's next heartbeat (so the row shows any other daemon's heartbeat of that interval), the worker
row is read back: a newer instance on it means another daemon took the worker id over, and this one
yields (stops heartbeating, drains, exits 6) instead of fighting over the row. So one that appears later
is found within about ROW_CHECK_EVERY plus an interval (a minute at the usual 10 s), at 0.02 requests/s.

Heartbeat answers: the real server's empty 200, or `{"acknowledged", "next_heartbeat_seconds",
"commands"}` (the documented shape): `next_heartbeat_seconds` (1-300) sets the interval, and a
command this daemon does not know is logged once.
"""

from __future__ import annotations

import logging
import os
from logging import ERROR, INFO, WARNING
from typing import Any

from supervisor import __version__, exitcodes
from supervisor.backoff import backoff
from supervisor.client import rest as api
from supervisor.client.transport import Transport
from supervisor.config import Config
from supervisor.ops.budget import DEREGISTER_ATTEMPTS, DEREGISTER_TIMEOUT
from supervisor.ops.logs import log_event
from supervisor.parent import identity
from supervisor.parent.facts import DrainAsked, ExitNow, Fact, Fatal, Registered, Submit, TakenOver
from supervisor.parent.single import OneAtATime

log = logging.getLogger("supervisor")

ROW_CHECK_EVERY = 50.0  # seconds between two reads of the worker row (the takeover check), about


class Membership:
    """This daemon's worker row: registration (one at a time, retried), heartbeats built from the values the
    loop passes, the takeover check, and whether the API answers; answers come back as facts."""

    def __init__(self, cfg: Config, client: Transport, submit: Submit):
        self.cfg = cfg
        self.api = client  # builds the calls
        self.submit = submit  # the arbiter's HTTP client
        self.registered = False  # the API knows this worker now
        self.registration = OneAtATime()  # a registration on the wire
        self.register_at: float | None = None  # (re)register at this time
        self.register_attempts = 0  # failed registrations in a row
        self.procs = cfg.procs  # max_concurrency told at registration
        self.heartbeat_interval = 10.0  # as the API asked at registration
        self.heartbeat = OneAtATime()  # a heartbeat on the wire
        self.next_heartbeat_at = float("inf")
        self.api_ok_at: float | None = None  # the last time the API answered at all
        self.identity = identity.instance_metadata()  # who this daemon is, in its metadata
        self.row_check_at: float | None = None  # read the worker row back at this time (takeover check)
        self.row_check = OneAtATime()  # a read of the worker row on the wire
        self.row_read_at = float("-inf")  # when the worker row was last read back
        self.yielded = False  # a newer instance took the worker id over: no more heartbeats, no deregister
        self.commands_seen: set[str] = set()  # heartbeat commands already logged as unknown

    # ------------------------------------------------------------ reading
    def next_deadline(self) -> float | None:
        times = [t for t in (self.register_at, self.row_check_at) if t is not None]
        if self.registered and not self.heartbeat.busy and not self.yielded:
            times.append(self.next_heartbeat_at)
        return min(times) if times else None

    def stats(self) -> dict:
        """Plain data for the published snapshot: registered, and when the API last answered (monotonic)."""
        return {"registered": self.registered, "api_ok_at": self.api_ok_at}

    def heartbeat_due(self, now: float) -> bool:
        return self.registered and not self.heartbeat.busy and not self.yielded and now >= self.next_heartbeat_at

    def api_answered(self, now: float) -> None:
        """Any answer from the API (an error included, but not a network failure): it is reachable."""
        self.api_ok_at = now

    def heartbeat_soon(self, now: float) -> None:
        """Send the next heartbeat now (e.g. to say `draining` at once)."""
        self.next_heartbeat_at = min(self.next_heartbeat_at, now)

    # ------------------------------------------------------------ registering
    def register(self, procs: int, now: float | None = None) -> None:
        """Register (again) with `procs` as the worker's concurrency."""
        if not self.registration.start():
            return
        self.procs, self.register_at = procs, None
        self.register_attempts += 1
        metadata = {"procs": procs, "pid": os.getpid(), "version": __version__, "runtime": "spooled-supervisor",
                    "queues": list(self.cfg.queues), **self.identity}
        call = self.api.register_call(self.cfg.first_queue, self.cfg.worker_id, self.cfg.hostname, procs, metadata,
                                      list(self.cfg.queues))
        self.submit(call, self.registration.followup(self.on_register, self.recover_register))

    def register_if_due(self, now: float, procs: int) -> None:
        """(Re)register when a retry is due, with the pool's current size."""
        if self.register_at is not None and now >= self.register_at:
            self.register(procs, now)

    def on_register(self, answer: Any, error: api.ApiError | None, now: float) -> list[Fact]:
        """The registration's answer: registered, or retry on a back-off, or a fact the daemon cannot work past."""
        if error is None:
            self.registered = True
            self.register_attempts = 0
            self.api_ok_at = now
            self.heartbeat_interval = float(max(1, int((answer or {}).get("heartbeat_interval_secs") or 10)))
            log_event(log, INFO, "registered", worker_id=self.cfg.worker_id, queue=self.cfg.first_queue,
                      heartbeat_interval=self.heartbeat_interval)
            self.next_heartbeat_at = now + self.heartbeat_interval
            return [Registered()]
        if isinstance(error, api.Unauthorized):
            return [Fatal(exitcodes.AUTH, str(error))]
        if isinstance(error, api.Conflict):
            log_event(log, ERROR, f"worker id {self.cfg.worker_id!r} belongs to another organization; choose "
                                  "another --worker-id", error=str(error))
            return [ExitNow(exitcodes.WORKER_ID_CONFLICT)]
        if isinstance(error, api.Rejected):
            log_event(log, ERROR, "registration refused; fix the configuration", error=str(error))
            return [ExitNow(exitcodes.CONFIG)]
        wait = backoff(self.register_attempts, 1.0, 60.0)
        if isinstance(error, api.QuotaExceeded):
            log_event(log, WARNING, "worker cap reached (429 QUOTA_EXCEEDED); stale workers free their slot after "
                                    "about 2 minutes, retrying registration", error=str(error), retry_in=round(wait, 1))
        else:
            if isinstance(error, api.RateLimited) and error.retry_after:
                wait = max(wait, float(error.retry_after))
            log_event(log, WARNING, "registration failed; retrying", error=str(error), retry_in=round(wait, 1))
        self.register_at = now + wait
        return []

    def recover_register(self, now: float) -> None:
        """Handling the registration's answer raised: register again in 5 s unless registered."""
        if not self.registered:
            self.register_at = now + 5.0

    def deregister(self) -> None:
        """Leave the worker row, which hands back to the queue any job this worker still holds; nothing to do
        when never registered or when a newer daemon took the row over. It blocks, bounded: DEREGISTER_ATTEMPTS
        tries of at most DEREGISTER_TIMEOUT each (supervisor.ops.budget), while nothing else is left to serve."""
        if self.registered and not self.yielded:
            timeout = min(self.cfg.api_timeout, DEREGISTER_TIMEOUT)
            for attempt in range(1, DEREGISTER_ATTEMPTS + 1):
                try:
                    self.api.deregister(self.cfg.worker_id, timeout=timeout)
                    log_event(log, INFO, "deregistered", worker_id=self.cfg.worker_id)
                    break
                except api.Unavailable as exc:
                    log_event(log, WARNING, "deregister failed", error=str(exc), attempt=attempt)
                except Exception as exc:
                    log_event(log, WARNING, "deregister refused", error=str(exc))
                    break
        self.deregistered()

    def deregistered(self) -> None:
        """No longer registered, and no registration due."""
        self.registered = False
        self.register_at = None

    # ------------------------------------------------------------ heartbeats
    def send_heartbeat(self, now: float, *, current_jobs: int, status: str, procs: int, busy: int, children: int,
                       cpu: float, mem: float, memory: dict | None = None) -> None:
        """Send the worker heartbeat, one at a time, on the interval the API gave: `current_jobs` held, the
        worker `status`, the pool (`procs` wanted, `busy`, `children` alive), the process tree's `cpu` and `mem`
        percent and the daemon's `memory` reading (if any); this part adds who the daemon is."""
        self.heartbeat.start()
        self.next_heartbeat_at = now + self.heartbeat_interval
        metadata = {"procs": procs, "busy": busy, "children": children, "pid": os.getpid(), "version": __version__,
                    "cpu_percent": cpu, "memory_percent": mem, "queues": list(self.cfg.queues), **self.identity,
                    "heartbeat_interval": self.heartbeat_interval}
        if memory is not None:
            metadata["memory"] = memory
        call = self.api.heartbeat_call(self.cfg.worker_id, current_jobs, status, metadata, cpu, mem)
        self.submit(call, self.heartbeat.followup(self.on_heartbeat))

    def on_heartbeat(self, answer: Any, error: api.ApiError | None, now: float) -> list[Fact]:
        """A heartbeat's answer: follow what it says; re-register if the API forgot us; retry soon on failure."""
        if error is None:
            facts = self._follow_answer(answer, now)
            due = max(now, self.next_heartbeat_at - self.heartbeat_interval / 10)  # just before the next one
            if self.row_check_at is None and due >= self.row_read_at + ROW_CHECK_EVERY - self.heartbeat_interval / 2:
                self.row_check_at = due
            return facts
        if isinstance(error, api.Rejected) and error.status == 404:
            log_event(log, WARNING, "the API no longer knows this worker; registering again")
            self.registered = False
            self.next_heartbeat_at = float("inf")
            self.register_at = now  # register_if_due sends it this turn, with the pool's current size
        elif isinstance(error, api.Unauthorized):
            return [Fatal(exitcodes.AUTH, str(error))]
        else:
            self.next_heartbeat_at = min(self.next_heartbeat_at, now + min(self.heartbeat_interval, 2.0))
            log_event(log, WARNING, "heartbeat failed", error=str(error))
        return []

    def _follow_answer(self, answer: Any, now: float) -> list[Fact]:
        """The documented heartbeat answer: follow `next_heartbeat_seconds`, log unknown commands once,
        and drain when it says `should_drain` (as the gRPC API's heartbeat answer can)."""
        if not isinstance(answer, dict):
            return []  # the real server's empty 200
        secs = answer.get("next_heartbeat_seconds")
        if isinstance(secs, (int, float)) and not isinstance(secs, bool) and secs > 0:
            interval = float(max(1.0, min(300.0, secs)))
            if interval != self.heartbeat_interval:
                log_event(log, INFO, "heartbeat interval changed by the API", heartbeat_interval=interval)
                self.heartbeat_interval = interval
                self.next_heartbeat_at = now + interval
        for command in answer.get("commands") or []:
            name = str(command.get("type") or command.get("command") or command) if isinstance(command, dict) \
                else str(command)
            if name not in self.commands_seen:
                self.commands_seen.add(name)
                log_event(log, WARNING, "heartbeat answer carries a command this daemon does not know; ignored",
                          command=name[:200])
        if answer.get("should_drain") is True:
            log_event(log, WARNING, "the API asks this worker to drain (should_drain)")
            return [DrainAsked()]
        return []

    # ------------------------------------------------------------ the worker row
    def check_row_if_due(self, now: float) -> None:
        """Read the worker row back (about every ROW_CHECK_EVERY, just before a heartbeat) to see whether a
        newer instance took the worker id over."""
        if self.row_check_at is None or now < self.row_check_at or self.yielded or not self.row_check.start():
            return
        self.row_check_at, self.row_read_at = None, now
        self.submit(self.api.get_worker_call(self.cfg.worker_id), self.row_check.followup(self.on_row))

    def on_row(self, row: Any, error: api.ApiError | None, now: float) -> list[Fact]:
        """The worker row read back: a newer instance on it means yield the worker id to it."""
        if error is not None or not isinstance(row, dict):
            return []  # never act on a read that failed
        other = identity.taken_over_by(row, self.identity)
        if other is None:
            return []
        self.yielded = True
        log_event(log, ERROR, identity.in_use_message(self.cfg.worker_id, other) + "; this older daemon yields: "
                  "it stops claiming, drains and exits without deregistering")
        return [TakenOver(other)]

