"""The arbiter's membership in Spooled: register once, heartbeat with the process tree's usage,
and stop on errors the daemon cannot work past.

A mixin of `Arbiter`, which owns the state; only the parent's loop calls these methods.
"""

from __future__ import annotations

import logging
import os
import time
from logging import ERROR, INFO, WARNING

import psutil

from supervisor import __version__, exitcodes
from supervisor.backoff import backoff
from supervisor.client import rest as api
from supervisor.ops.logs import log_event

log = logging.getLogger("supervisor")

DEGRADED_FOR = 60.0  # report `degraded` this long after a boot failure, or while 3 crashes fall in it


class Membership:
    def register(self) -> None:
        self.register_attempts += 1
        metadata = {"procs": self.target, "pid": os.getpid(), "version": __version__, "runtime": "spooled-supervisor"}
        self.submit(("register",), self.api.register_call(self.cfg.queue, self.cfg.worker_id, self.cfg.hostname,
                                                           self.target, metadata))

    def on_register(self, answer, error, now: float) -> None:
        if error is None:
            self.registered = True
            self.register_attempts = 0
            self.api_ok_at = now
            self.heartbeat_interval = float(max(1, int((answer or {}).get("heartbeat_interval_secs") or 10)))
            log_event(log, INFO, "registered", worker_id=self.cfg.worker_id, queue=self.cfg.queue,
                      heartbeat_interval=self.heartbeat_interval)
            self.next_heartbeat_at = now + self.heartbeat_interval
            self.maybe_announce_ready()
            return
        if isinstance(error, api.Unauthorized):
            return self.fatal(exitcodes.AUTH, error)
        if isinstance(error, api.Conflict):
            log_event(log, ERROR, f"worker id {self.cfg.worker_id!r} belongs to another organization; choose "
                                  "another --worker-id", error=str(error))
            self.exit_code = exitcodes.WORKER_ID_CONFLICT
            return
        if isinstance(error, api.Rejected):
            log_event(log, ERROR, "registration refused; fix the configuration", error=str(error))
            self.exit_code = exitcodes.CONFIG
            return
        wait = backoff(self.register_attempts, 1.0, 60.0)
        if isinstance(error, api.QuotaExceeded):
            log_event(log, WARNING, "worker cap reached (429 QUOTA_EXCEEDED); stale workers free their slot after "
                                    "about 2 minutes, retrying registration", error=str(error), retry_in=round(wait, 1))
        else:
            if isinstance(error, api.RateLimited) and error.retry_after:
                wait = max(wait, float(error.retry_after))
            log_event(log, WARNING, "registration failed; retrying", error=str(error), retry_in=round(wait, 1))
        if not self.draining:
            self.after(wait, self.register)
        else:
            self.finish(self.drain_code)

    def worker_status(self) -> str:
        """`draining`, `degraded` while children are crash-looping, else `healthy`."""
        if self.draining:
            return "draining"
        now = time.monotonic()
        crashes = sum(1 for t in list(self.recent_crashes) if now - t < DEGRADED_FOR)  # also read by /status
        if (self.boot_failures and now - self.last_boot_failure < DEGRADED_FOR) or crashes >= 3:
            return "degraded"
        return "healthy"

    def send_heartbeat(self, now: float) -> None:
        """Send the worker heartbeat when it is due; one at a time, on the interval the API gave."""
        if not self.registered or self.heartbeat_inflight or now < self.next_heartbeat_at:
            return
        self.heartbeat_inflight = True
        self.next_heartbeat_at = now + self.heartbeat_interval
        cpu, mem = self.tree_usage()
        busy = sum(1 for c in self.children.values() if c.state == "busy")
        metadata = {"procs": self.target, "busy": busy, "children": len(self.children), "pid": os.getpid(),
                    "version": __version__, "cpu_percent": cpu, "memory_percent": mem}
        self.submit(("heartbeat",), self.api.heartbeat_call(self.cfg.worker_id, len(self.inflight),
                                                             self.worker_status(), metadata, cpu, mem))

    def on_heartbeat(self, error, now: float) -> None:
        self.heartbeat_inflight = False
        if error is None or self.exit_code is not None:
            return
        if isinstance(error, api.Rejected) and error.status == 404:
            log_event(log, WARNING, "the API no longer knows this worker; registering again")
            self.registered = False
            self.next_heartbeat_at = float("inf")
            self.register()
        elif isinstance(error, api.Unauthorized):
            self.fatal(exitcodes.AUTH, error)
        else:
            self.next_heartbeat_at = min(self.next_heartbeat_at, now + min(self.heartbeat_interval, 2.0))
            log_event(log, WARNING, "heartbeat failed", error=str(error))

    def tree_usage(self) -> tuple[float, float]:
        """CPU percent (of one core, summed) and memory percent of the parent and its children."""
        cpu = mem = 0.0
        procs = [self._ps_self] + [p for p in (c.ps() for c in self.children.values()) if p is not None]
        for proc in procs:
            try:
                cpu += proc.cpu_percent(None)
                mem += proc.memory_percent()
            except psutil.Error:
                pass
        return round(cpu, 1), round(mem, 2)

    def fatal(self, code: int, error) -> None:
        """An error the daemon cannot work past (401): stop claiming, deliver what is in flight, exit `code`."""
        log_event(log, ERROR, f"stopping: {exitcodes.NAMES.get(code, code)}", error=str(error))
        if not self.registered:
            self.exit_code = code
        elif self.draining:
            self.drain_code = code
        else:
            self.begin_drain(time.monotonic(), code)
