"""The parent process: one loop that owns every child, every job and every API call.

Signal handlers only record the signal. Each turn the loop waits (select) on the children's
sockets and sentinels and on one wake-up pipe written by signal handlers and finished API
calls, then in order: acts on signals, reads children, reaps the dead, takes API results,
enforces deadlines (job timeouts, kills, lease renewals, heartbeat), converges the number
of children, hands waiting jobs to idle children and claims for the idle ones left.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import selectors
import signal
import time
from logging import INFO, WARNING
from queue import SimpleQueue

import psutil

from supervisor import __version__, exitcodes
from supervisor.client import rest as api
from supervisor.client.loophttp import LoopHTTP
from supervisor.config import Config
from supervisor.ops.logs import log_event
from supervisor.parent.childproc import Child, signal_child, stop_child
from supervisor.parent.inflight import InFlight
from supervisor.parent.jobs import JobFlow
from supervisor.parent.membership import Membership
from supervisor.parent.pool import ChildPool

log = logging.getLogger("supervisor")

TITLE_EVERY = 0.2
DEREGISTER_TIMEOUT = 5.0
CONVERGE_EVERY = 0.25  # also converge at once whenever a child, a signal or a retirement changes the pool
HANDLED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGTTIN, signal.SIGTTOU)


class NullHooks:
    """What the arbiter tells the outside world; metrics, notify and titles override these."""

    def job_finished(self, queue: str, outcome: str, duration: float | None) -> None: ...
    def child_restarted(self, reason: str) -> None: ...
    def lease_renewed(self, outcome: str) -> None: ...
    def claimed(self, count: int) -> None: ...
    def ready(self, status: str) -> None: ...
    def status(self, text: str) -> None: ...
    def stopping(self) -> None: ...
    def tick(self, now: float) -> None: ...


class Arbiter(ChildPool, JobFlow, Membership):
    """The parent. State lives here; the pool, job-flow and membership methods come from the mixins."""

    def __init__(self, cfg: Config, client: api.SpooledAPI, hooks: NullHooks | None = None):
        self.cfg = cfg
        self.api = client
        self.hooks = hooks or NullHooks()
        self.target = cfg.procs
        self.reloads = 0
        self.children: dict[int, Child] = {}
        self.inflight = InFlight(cfg.lease)
        self.signals: SimpleQueue = SimpleQueue()
        self.sel = selectors.DefaultSelector()
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)
        self.http = LoopHTTP(client, self.sel, self.wake_w)
        self._timers: list = []
        self._seq = itertools.count()
        # lifecycle
        self.registered = False
        self.announced_ready = False
        self.register_attempts = 0
        self.heartbeat_interval = 10.0
        self.heartbeat_inflight = False
        self.next_heartbeat_at = float("inf")
        self.recent_crashes: list[float] = []
        self.draining = False
        self.drain_deadline: float | None = None
        self.exit_code: int | None = None
        self.first_child_ready = False
        # claiming
        self.claim_inflight = False
        self.reports_after_claim: list = []  # outcomes held back while a claim is on the wire
        self.next_claim_at = 0.0
        self.claim_not_before = 0.0  # after a failed claim: a back-off no freed child may cut short
        self.empty_claims = 0
        self.claim_failures = 0
        # children
        self.respawn_at: dict[int, float] = {}
        self.boot_failures: dict[int, int] = {}
        self.restarts: dict[int, int] = {}
        self.last_boot_failure = -1e9
        self.next_memory_check = 0.0
        self.drain_code = exitcodes.OK
        self.loop_errors = 0
        # observability
        self.loop_at = time.monotonic()
        self.api_ok_at: float | None = None
        self._title = ""
        self.next_title_at = 0.0
        self.pool_changed = True
        self.next_converge_at = 0.0
        self._ps_self = psutil.Process()

    # ------------------------------------------------------------------ entry
    def run(self) -> int:
        """Run until drained or stopped; return the process exit code. The caller has started the
        forkserver (`children.start_forkserver`) before any thread of this process exists."""
        for sig in HANDLED_SIGNALS:
            signal.signal(sig, self._on_signal)
        signal.set_wakeup_fd(self.wake_w, warn_on_full_buffer=False)
        self.sel.register(self.wake_r, selectors.EVENT_READ, ("wake", None))
        now = time.monotonic()
        log_event(log, INFO, "supervisor starting", worker_id=self.cfg.worker_id, queue=self.cfg.queue,
                  procs=self.target, handler=self.cfg.handler, api_url=self.cfg.api_url, version=__version__)
        self.converge(now)
        try:
            while self.exit_code is None:
                try:
                    self.turn()
                    self.loop_errors = 0
                except Exception:  # a bug must not take down the jobs in flight; log it and go on
                    log.exception("unexpected error in the main loop; carrying on")
                    self.loop_errors += 1
                    if self.loop_errors > 100:  # a hundred turns in a row: this will not mend itself
                        raise
                    time.sleep(0.1)
        finally:
            self.shutdown_children()
            signal.set_wakeup_fd(-1)
            self.http.close()
        return self.exit_code

    def _on_signal(self, signum, frame) -> None:
        self.signals.put_nowait(signum)

    def turn(self) -> None:
        now = time.monotonic()
        timeout = max(0.0, min(self.next_wakeup(now), now + 1.0) - now)
        for key, mask in self.sel.select(timeout):
            kind, child = key.data
            if kind == "wake":
                self._drain_wake()
            elif kind == "chan":
                if mask & selectors.EVENT_WRITE:
                    self.flush_child(child)
                if mask & selectors.EVENT_READ:
                    self.read_child(child, time.monotonic())
            elif kind == "sentinel":
                self.reap_child(child, time.monotonic())
            elif kind == "http":
                self.http.on_ready(child, mask, time.monotonic())
        now = time.monotonic()
        self.loop_at = now
        self.handle_signals(now)
        self.http.expire(now)
        self.handle_api_results(now)
        self.run_timers(now)
        self.enforce_deadlines(now)
        self.send_heartbeat(now)
        if self.exit_code is not None:
            return
        if self.pool_changed or now >= self.next_converge_at:
            self.pool_changed, self.next_converge_at = False, now + CONVERGE_EVERY
            self.converge(now)
        self.dispatch_waiting(now)
        self.maybe_claim(now)
        self.maybe_finish_drain(now)
        self.update_title(now)
        self.hooks.tick(now)

    def next_wakeup(self, now: float) -> float:
        times = [now + 1.0]
        if self.next_title_at > now:
            times.append(self.next_title_at)
        if self.http.results:
            times.append(now)
        if self._timers:
            times.append(self._timers[0][0])
        for deadline in (self.inflight.next_deadline(), self.http.next_deadline()):
            if deadline is not None:
                times.append(deadline)
        times += [c.kill_at for c in self.children.values() if c.kill_at is not None]
        times += [t for slot, t in self.respawn_at.items() if slot not in self.children and slot < self.target]
        if self.registered and not self.draining and not self.claim_inflight and self.idle_children():
            times.append(max(self.next_claim_at, self.claim_not_before))
        if self.drain_deadline is not None:
            times.append(self.drain_deadline)
        if self.registered and not self.heartbeat_inflight:
            times.append(self.next_heartbeat_at)
        return min(times)

    def _drain_wake(self) -> None:
        try:
            while os.read(self.wake_r, 4096):
                pass
        except BlockingIOError:
            pass

    def after(self, delay: float, fn, *args) -> None:
        heapq.heappush(self._timers, (time.monotonic() + delay, next(self._seq), fn, args))

    def run_timers(self, now: float) -> None:
        while self._timers and self._timers[0][0] <= now:
            _, _, fn, args = heapq.heappop(self._timers)
            fn(*args)

    def submit(self, tag, call, first: bool = False) -> None:
        self.http.submit(tag, call, first)

    # ---------------------------------------------------------------- signals
    def handle_signals(self, now: float) -> None:
        while not self.signals.empty():
            sig = self.signals.get_nowait()
            self.pool_changed = True
            name = signal.Signals(sig).name
            if sig in (signal.SIGTERM, signal.SIGINT):
                if self.draining:
                    log_event(log, WARNING, "second stop signal: stopping at once", signal=name)
                    self.stop_at_once(now)
                else:
                    log_event(log, INFO, "stop signal: draining", signal=name, inflight=len(self.inflight),
                              drain_timeout=self.cfg.drain_timeout)
                    self.begin_drain(now, exitcodes.OK)
            elif sig == signal.SIGHUP:
                self.reloads += 1
                log_event(log, INFO, "SIGHUP: replacing children one at a time", reload=self.reloads)
                for child in self.children.values():
                    self.retire(child, "reload")
            elif sig == signal.SIGTTIN:
                self.target = min(1000, self.target + 1)
                log_event(log, INFO, "SIGTTIN: one more child", procs=self.target)
            elif sig == signal.SIGTTOU:
                self.target = max(1, self.target - 1)
                log_event(log, INFO, "SIGTTOU: one child fewer", procs=self.target)

    def begin_drain(self, now: float, code: int) -> None:
        if self.draining:
            return
        self.draining = True
        self.drain_code = code
        self.drain_deadline = now + self.cfg.drain_timeout
        self.hooks.stopping()
        self.next_heartbeat_at = now  # tell the API `draining` now

    def stop_at_once(self, now: float) -> None:
        for child in list(self.children.values()):
            signal_child(child, signal.SIGKILL)
        self.finish(self.drain_code)

    def maybe_finish_drain(self, now: float) -> None:
        if not self.draining:
            return
        if not self.inflight.jobs and not self.claim_inflight:
            log_event(log, INFO, "drained: no job in flight")
            self.finish(self.drain_code)
        elif now >= self.drain_deadline:
            busy = [e.id for e in self.inflight.jobs.values()]
            log_event(log, WARNING, "drain timeout: stopping busy children; deregistering hands their jobs back to the queue",
                      jobs=busy)
            self.finish(self.drain_code)

    def finish(self, code: int) -> None:
        """Stop children, deregister (which releases any job still held) and set the exit code."""
        if self.exit_code is not None:
            return
        self.shutdown_children()
        if self.registered:
            # Two short attempts: drain + kill grace + these stay inside systemd's TimeoutStopSec.
            for attempt in (1, 2):
                try:
                    self.api.deregister(self.cfg.worker_id, timeout=min(self.cfg.api_timeout, DEREGISTER_TIMEOUT))
                    log_event(log, INFO, "deregistered", worker_id=self.cfg.worker_id)
                    break
                except api.Unavailable as exc:
                    log_event(log, WARNING, "deregister failed", error=str(exc), attempt=attempt)
                except Exception as exc:
                    log_event(log, WARNING, "deregister refused", error=str(exc))
                    break
            self.registered = False
        self.exit_code = code
        log_event(log, INFO, "supervisor stopped", exit_code=code)

    def shutdown_children(self) -> None:
        """Ask every child to stop, SIGKILL what is left after the grace period, and reap them all."""
        now = time.monotonic()
        for child in list(self.children.values()):
            if child.state == "stopping":
                continue
            stop_child(child, "shutdown", now, self.cfg.kill_grace, graceful=child.state == "idle")
        deadline = now + self.cfg.kill_grace
        for child in list(self.children.values()):
            child.proc.join(max(0.0, deadline - time.monotonic()))
            if child.proc.exitcode is None:
                signal_child(child, signal.SIGKILL)
                child.proc.join(2.0)
            self.forget_child(child)

    # ------------------------------------------------------------ API results
    def handle_api_results(self, now: float) -> None:
        """Hand each finished API call to its `on_*` method; one that fails is logged and undone, not lost."""
        for tag, result, error in self.http.done():
            if error is None or not isinstance(error, api.Unavailable):
                self.api_ok_at = now
            try:
                self.dispatch_result(tag, result, error, now)
            except Exception:
                log.exception("error handling the answer to a %s call; recovering", tag[0])
                self.recover_call(tag, now)

    def dispatch_result(self, tag: tuple, result, error, now: float) -> None:
        kind = tag[0]
        if kind == "claim":
            self.on_claim(tag[1], tag[2], result, error, now)
        elif kind == "report":
            self.on_report(tag[1], error, now)
        elif kind == "renew":
            self.on_renew(tag[1], tag[2], error, now)
        elif kind == "heartbeat":
            self.on_heartbeat(error, now)
        elif kind == "register":
            self.on_register(result, error, now)

    def recover_call(self, tag: tuple, now: float) -> None:
        """Put back the state a call's handler failed to settle, so nothing waits on it for ever."""
        kind = tag[0]
        if kind == "claim":
            self.claim_inflight = False
            self.claim_not_before = now + 1.0
            self.send_held_reports()
        elif kind == "report" and self.inflight.get(tag[1].id) is tag[1]:
            tag[1].reporting = False
            self.after(1.0, self._retry_report, tag[1])
        elif kind == "renew":
            tag[1].renewing = False
        elif kind == "heartbeat":
            self.heartbeat_inflight = False
        elif kind == "register" and not self.registered:
            self.after(5.0, self.register)

    # ----------------------------------------------------------- observation
    def status_line(self) -> str:
        busy = sum(1 for c in self.children.values() if c.state == "busy")
        text = f"queue={self.cfg.queue} busy={busy}/{self.target} inflight={len(self.inflight)}"
        return text + (" draining" if self.draining else "")

    def update_title(self, now: float) -> None:
        """Refresh the process title (and systemd STATUS) at most every TITLE_EVERY seconds."""
        if now < self.next_title_at:
            return
        title = f"spooled-supervisor: parent {self.status_line()}"
        if title != self._title:
            self._title = title
            self.next_title_at = now + TITLE_EVERY
            self.hooks.status(title)

    def snapshot(self) -> dict:
        """A plain-data picture of the daemon for /status and /healthz (read from another thread)."""
        now = time.monotonic()
        children = []
        for child in list(self.children.values()):
            entry = self.inflight.get(child.job_id) if child.job_id else None
            children.append({
                "slot": child.slot, "pid": child.pid, "state": child.state, "job_id": child.job_id,
                "job_runtime_secs": round(now - entry.started_at, 3) if entry and entry.started_at else None,
                "rss_bytes": child.rss, "jobs_done": child.jobs_done, "restarts": self.restarts.get(child.slot, 0),
            })
        return {
            "worker_id": self.cfg.worker_id, "queue": self.cfg.queue, "pid": os.getpid(), "version": __version__,
            "registered": self.registered, "draining": self.draining, "status": self.worker_status(),
            "loop_age_secs": round(now - self.loop_at, 3),
            "api_age_secs": None if self.api_ok_at is None else round(now - self.api_ok_at, 3),
            "procs": self.target, "busy": sum(1 for c in children if c["state"] == "busy"),
            "inflight": len(self.inflight), "children": sorted(children, key=lambda c: c["slot"]),
        }
