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
import random
import selectors
import signal
import time
from logging import DEBUG, ERROR, INFO, WARNING
from queue import SimpleQueue

import psutil

from supervisor import __version__, api, exitcodes
from supervisor.children import Child, death_cause, signal_child, spawn_child, start_forkserver, stop_child
from supervisor.config import Config
from supervisor.inflight import Entry, InFlight
from supervisor.loophttp import LoopHTTP
from supervisor.logs import log_event

log = logging.getLogger("supervisor")

BOOT_TIMEOUT = 60.0
MEMORY_CHECK_EVERY = 1.0
TITLE_EVERY = 0.2
CONVERGE_EVERY = 0.25  # also converge at once whenever a child, a signal or a retirement changes the pool
DEGRADED_FOR = 60.0  # report `degraded` this long after a boot failure
HANDLED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGTTIN, signal.SIGTTOU)


def backoff(attempt: int, base: float, cap: float) -> float:
    """Exponential back-off with full jitter in [delay/2, delay]."""
    delay = min(cap, base * (2 ** max(0, attempt - 1)))
    return random.uniform(delay / 2, delay)


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


class Arbiter:
    def __init__(self, cfg: Config, client: api.SpooledAPI, hooks: NullHooks | None = None):
        self.cfg = cfg
        self.api = client
        self.hooks = hooks or NullHooks()
        self.target = cfg.procs
        self.generation = 0
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
        self.stop_now = False
        self.exit_code: int | None = None
        self.first_child_ready = False
        # claiming
        self.claim_inflight = False
        self.next_claim_at = 0.0
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
        """Run until drained or stopped; return the process exit code."""
        start_forkserver()
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
                except Exception:  # a bug must not take down the jobs in flight; log it and go on
                    log.exception("unexpected error in the main loop; carrying on")
                    self.loop_errors += 1
                    if self.loop_errors > 100:
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
        times += [t for slot, t in self.respawn_at.items() if slot not in self.children]
        if self.registered and not self.draining and not self.claim_inflight and self.idle_children():
            times.append(self.next_claim_at)
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
                self.generation += 1
                log_event(log, INFO, "SIGHUP: replacing children one at a time", generation=self.generation)
                for child in self.children.values():
                    child.retire = child.retire or "reload"
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
            for attempt in (1, 2):
                try:
                    self.api.deregister(self.cfg.worker_id)
                    log_event(log, INFO, "deregistered", worker_id=self.cfg.worker_id)
                    break
                except api.Unavailable as exc:
                    log_event(log, WARNING, "deregister failed", error=str(exc), attempt=attempt)
                except api.ApiError as exc:
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

    # --------------------------------------------------------------- children
    def idle_children(self) -> list[Child]:
        """Children that may take a job now (one due for a reload still works until its turn comes)."""
        return [c for c in self.children.values() if c.state == "idle" and c.retire in (None, "reload")]

    def converge(self, now: float) -> None:
        """Make the children match the target: respawn empty slots, retire extra and due ones."""
        for slot in range(self.target):
            if slot not in self.children and now >= self.respawn_at.get(slot, 0.0) and not self.stopping_for_good():
                self.start_child(slot, now)
        replacing = any(c.state == "starting" for c in self.children.values())
        for child in list(self.children.values()):
            if child.slot >= self.target and child.state in ("idle", "starting"):
                stop_child(child, "resize", now, self.cfg.kill_grace, graceful=child.state == "idle")
            elif child.slot >= self.target and child.state == "busy":
                child.retire = child.retire or "resize"
            elif child.retire and child.state == "idle":
                if child.retire == "reload" and replacing:
                    continue  # one at a time, so capacity drops by one child at most
                stop_child(child, child.retire, now, self.cfg.kill_grace, graceful=True)
                replacing = True
            elif child.state == "starting" and now - child.started_at > BOOT_TIMEOUT:
                log_event(log, ERROR, "child did not become ready in time; killing it", slot=child.slot, pid=child.pid)
                stop_child(child, "boot_failed", now, 0.0)

    def stopping_for_good(self) -> bool:
        return self.exit_code is not None or (self.draining and not self.inflight.jobs)

    def start_child(self, slot: int, now: float) -> None:
        try:
            child = spawn_child(slot, self.generation, now, self.cfg.handler, self.cfg.worker_id,
                                self.cfg.max_result_bytes, self.cfg.max_jobs_per_child)
        except OSError as exc:
            log_event(log, ERROR, "could not start a child", slot=slot, error=str(exc))
            self.respawn_at[slot] = now + backoff(self.boot_failures.get(slot, 0) + 1, 0.5, 30.0)
            return
        self.children[slot] = child
        self.sel.register(child.chan.sock, selectors.EVENT_READ, ("chan", child))
        self.sel.register(child.proc.sentinel, selectors.EVENT_READ, ("sentinel", child))
        log_event(log, DEBUG, "child started", slot=slot, pid=child.pid)

    def forget_child(self, child: Child) -> None:
        self.pool_changed = True
        if self.children.get(child.slot) is child:
            del self.children[child.slot]
        for fileobj in (child.chan.sock, child.proc.sentinel):
            try:
                self.sel.unregister(fileobj)
            except (KeyError, ValueError):
                pass
        child.chan.close()
        try:
            child.proc.close()
        except ValueError:
            pass

    def flush_child(self, child: Child) -> None:
        try:
            child.chan.flush()
        except OSError:
            return  # the sentinel will tell us it died
        self._watch_writes(child)

    def _watch_writes(self, child: Child) -> None:
        """Watch the child's socket for writability only while a frame is still going out."""
        if child.chan.wants_write == child.watching_writes:
            return
        child.watching_writes = child.chan.wants_write
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if child.watching_writes else 0)
        try:
            self.sel.modify(child.chan.sock, events, ("chan", child))
        except (KeyError, ValueError):
            pass

    def read_child(self, child: Child, now: float) -> None:
        try:
            messages = child.chan.receive()
        except (EOFError, OSError):
            try:
                self.sel.unregister(child.chan.sock)
            except (KeyError, ValueError):
                pass
            return
        for msg in messages:
            kind = msg.get("t")
            if kind == "ready":
                self.child_ready(child, now)
            elif kind == "done":
                self.child_done(child, msg, now)
            elif kind == "boot_error":
                child.boot_error = msg.get("error") or ""

    def child_ready(self, child: Child, now: float) -> None:
        self.pool_changed = True
        child.state = "idle" if child.state == "starting" else child.state
        self.boot_failures.pop(child.slot, None)
        if not self.first_child_ready:
            self.first_child_ready = True
            self.register()
        self.maybe_announce_ready()

    def maybe_announce_ready(self) -> None:
        if self.announced_ready or not self.registered:
            return
        if all(c.state != "starting" for c in self.children.values()) and len(self.children) >= self.target:
            self.announced_ready = True
            log_event(log, INFO, "ready", worker_id=self.cfg.worker_id, children=len(self.children))
            self.hooks.ready(self.status_line())

    def child_done(self, child: Child, msg: dict, now: float) -> None:
        job_id = msg.get("id")
        child.jobs_done += 1
        child.job_id = None
        if child.state == "busy":
            child.state = "idle"
        entry = self.inflight.get(job_id)
        if entry is None or entry.slot != child.slot:
            log_event(log, DEBUG, "result for a job no longer held; dropped", job_id=job_id, pid=child.pid)
            entry = None
        else:
            outcome = ("complete", msg.get("result")) if msg.get("ok") else ("fail", msg.get("error") or "Job failed")
            entry.extra["duration"] = now - (entry.started_at or now)
            self.inflight.finish(entry, outcome)
        if child.job_quota and child.jobs_done >= child.job_quota:
            child.retire = child.retire or "max_jobs"
        if self.cfg.max_memory_per_child_mb and (child.read_rss() or 0) > self.cfg.max_memory_per_child_mb * 2**20:
            child.retire = child.retire or "max_memory"
        if child.retire and child.state == "idle":
            self.pool_changed = True
            log_event(log, INFO, "replacing child", slot=child.slot, pid=child.pid, reason=child.retire,
                      jobs_done=child.jobs_done, rss=child.rss)
            if child.retire != "reload":
                stop_child(child, child.retire, now, self.cfg.kill_grace, graceful=True)
        self.dispatch_waiting(now)
        self.next_claim_at = min(self.next_claim_at, now)  # claim again as soon as a child frees up,
        self.maybe_claim(now)  # and before reporting: the child waits on the claim, the report can wait
        if entry is not None:
            self.report(entry)

    def reap_child(self, child: Child, now: float) -> None:
        """The child has exited: read what it left in the pipe, fail its job if it had one, plan a respawn."""
        if self.children.get(child.slot) is not child:
            return  # already handled
        self.read_child(child, now)  # drain the pipe first: a result sent just before dying still counts
        child.proc.join(0)
        code = child.proc.exitcode
        cause = death_cause(code)
        entry = self.inflight.on_child(child.slot)
        was_starting = child.state == "starting"
        expected = child.state == "stopping" and child.stop_reason in ("shutdown", "resize", "max_jobs", "max_memory", "reload")
        self.forget_child(child)
        self.restarts[child.slot] = self.restarts.get(child.slot, 0) + 1
        if entry is not None:
            error = f"ChildProcessDied: the child process running this job (pid {child.pid}) {cause}"
            entry.extra["duration"] = now - (entry.started_at or now)
            log_event(log, ERROR, "child died during a job", cause=cause, **self.job_fields(entry, now))
            self.inflight.finish(entry, ("fail", error))
            entry.extra["crashed"] = True
            self.report(entry)
        if was_starting:
            failures = self.boot_failures.get(child.slot, 0) + 1
            self.boot_failures[child.slot] = failures
            self.last_boot_failure = now
            delay = backoff(failures, 0.5, 30.0)
            self.respawn_at[child.slot] = now + delay
            self.hooks.child_restarted("boot_failed")
            if not self.first_child_ready and failures >= 1 and child.boot_error is not None:
                log_event(log, ERROR, f"cannot import handler {self.cfg.handler}:\n{child.boot_error}")
                self.exit_code = exitcodes.HANDLER_IMPORT
                return
            log_event(log, ERROR, "child failed while starting; backing off", slot=child.slot, pid=child.pid,
                      cause=cause, retry_in=round(delay, 2), failures=failures, error=(child.boot_error or "")[-500:])
        elif expected:
            self.respawn_at.pop(child.slot, None)
            if child.stop_reason != "shutdown":
                self.hooks.child_restarted(child.stop_reason)
            log_event(log, DEBUG, "child stopped", slot=child.slot, pid=child.pid, reason=child.stop_reason, cause=cause)
        else:
            reason = child.stop_reason or "crashed"
            if reason == "crashed":
                self.recent_crashes.append(now)
            self.respawn_at.pop(child.slot, None)
            self.hooks.child_restarted(reason)
            level = INFO if child.stop_reason in ("timeout", "lease_lost") else WARNING
            log_event(log, level, "child exited; starting a new one", slot=child.slot, pid=child.pid, cause=cause,
                      reason=reason)

    # ------------------------------------------------------------------- jobs
    def dispatch_waiting(self, now: float) -> None:
        waiting = self.inflight.waiting()
        if not waiting:
            return
        for child, entry in zip(self.idle_children(), waiting):
            try:
                child.chan.send({"t": "job", "job": entry.job})
            except OSError:
                continue  # the sentinel will report the death; the job stays waiting
            self._watch_writes(child)
            child.state, child.job_id = "busy", entry.id
            self.inflight.start(entry, child.slot, child.pid, now)
            log_event(log, DEBUG, "job started", **self.job_fields(entry, now))

    def maybe_claim(self, now: float) -> None:
        if not self.registered or self.draining or self.claim_inflight or now < self.next_claim_at:
            return
        free = len(self.idle_children()) - len(self.inflight.waiting())
        if free <= 0:
            return
        self.claim_inflight = True
        self.submit(("claim", free, now), self.api.claim_call(self.cfg.queue, self.cfg.worker_id, free, self.cfg.lease),
                    first=True)

    def on_claim(self, asked: int, sent_at: float, jobs, error, now: float) -> None:
        self.claim_inflight = False
        if error is not None:
            self.claim_failures += 1
            if isinstance(error, api.Unauthorized):
                return self.fatal(exitcodes.AUTH, error)
            wait = backoff(self.claim_failures, 0.2, max(self.cfg.poll_interval, 5.0))
            if isinstance(error, api.RateLimited) and error.retry_after is not None:
                wait = max(wait, float(error.retry_after))
            log_event(log, WARNING if self.claim_failures <= 3 or self.claim_failures % 20 == 0 else DEBUG,
                      "claim failed", error=str(error), retry_in=round(wait, 2), failures=self.claim_failures)
            self.next_claim_at = now + wait
            return
        self.claim_failures = 0
        for job in jobs:
            self.inflight.add(job, sent_at)
            log_event(log, DEBUG, "job claimed", job_id=job.get("id"), queue=self.cfg.queue, worker_id=self.cfg.worker_id)
        self.hooks.claimed(len(jobs))
        if len(jobs) < asked:
            self.empty_claims += 1
            self.next_claim_at = now + backoff(self.empty_claims, 0.05, self.cfg.poll_interval)
        else:
            self.empty_claims = 0
            self.next_claim_at = now
        self.dispatch_waiting(now)

    def report(self, entry: Entry) -> None:
        """Tell the API how the job ended (complete or fail), once; retried by on_report."""
        if entry.reporting:
            return
        entry.reporting = True
        entry.report_attempts += 1
        kind, value = entry.outcome
        if kind == "complete":
            self.submit(("report", entry.id), self.api.complete_call(entry.id, self.cfg.worker_id, entry.lease_id, value))
        else:
            self.submit(("report", entry.id), self.api.fail_call(entry.id, self.cfg.worker_id, entry.lease_id, value))

    def on_report(self, job_id: str, error, now: float) -> None:
        entry = self.inflight.get(job_id)
        if entry is None:
            return
        entry.reporting = False
        kind, value = entry.outcome
        fields = self.job_fields(entry, now)
        if error is None:
            self.inflight.pop(job_id)
            if kind == "complete":
                outcome = "completed"
            else:
                outcome = entry.extra.get("outcome") or ("crashed" if entry.extra.get("crashed") else "failed")
            self.hooks.job_finished(entry.queue, outcome, entry.extra.get("duration"))
            if kind == "complete":
                log_event(log, INFO, "job completed", **fields)
            else:
                log_event(log, WARNING, "job failed", error=str(value)[:300], **fields)
            return
        if isinstance(error, (api.LeaseLost, api.AlreadyFinished)):
            self.inflight.pop(job_id)
            self.hooks.job_finished(entry.queue, "lease_lost", entry.extra.get("duration"))
            log_event(log, WARNING, f"{kind} refused: this worker no longer holds the job; outcome dropped",
                      error=str(error), **fields)
        elif isinstance(error, api.Unauthorized):
            self.inflight.pop(job_id)
            self.fatal(exitcodes.AUTH, error)
        elif isinstance(error, api.Rejected) and kind == "complete":
            log_event(log, ERROR, "the API refused the result; failing the job instead", error=str(error), **fields)
            entry.outcome = ("fail", f"ResultRejected: the API refused this job's result: {error}")
            self.report(entry)
        elif isinstance(error, api.Rejected):
            self.inflight.pop(job_id)
            log_event(log, ERROR, "the API refused the failure report; job left to its lease", error=str(error), **fields)
        else:
            wait = backoff(entry.report_attempts, 0.2, 15.0)
            if isinstance(error, api.RateLimited) and error.retry_after:
                wait = max(wait, float(error.retry_after))
            log_event(log, WARNING, f"{kind} not delivered yet; will retry", error=str(error),
                      retry_in=round(wait, 2), attempts=entry.report_attempts, **fields)
            self.after(wait, self._retry_report, job_id)

    def _retry_report(self, job_id: str) -> None:
        entry = self.inflight.get(job_id)
        if entry is not None and entry.outcome is not None:
            self.report(entry)

    # -------------------------------------------------------------- deadlines
    def enforce_deadlines(self, now: float) -> None:
        for entry in self.inflight.timed_out(now):
            child = self.children.get(entry.slot)
            timeout = entry.job.get("timeout_seconds")
            log_event(log, WARNING, "job timed out; stopping its child", timeout_seconds=timeout,
                      **self.job_fields(entry, now))
            if child is not None:
                child.job_id = None
                stop_child(child, "timeout", now, self.cfg.kill_grace)
            entry.extra["outcome"] = "timed_out"
            entry.extra["duration"] = now - (entry.started_at or now)
            self.inflight.finish(entry, ("fail", f"JobTimeout: the job ran past its timeout of {timeout} s; "
                                                 f"its child process (pid {entry.pid}) was stopped"))
            self.report(entry)
        for child in self.children.values():
            if child.kill_at is not None and now >= child.kill_at:
                log_event(log, WARNING, "child ignored SIGTERM; sending SIGKILL", slot=child.slot, pid=child.pid,
                          reason=child.stop_reason)
                signal_child(child, signal.SIGKILL)
                child.kill_at = None
        for entry in self.inflight.renewals_due(now):
            entry.renewing = True
            self.submit(("renew", entry.id, now), self.api.renew_lease_call(entry.id, self.cfg.worker_id,
                                                                            entry.lease_id, self.cfg.lease))
        if now >= self.next_memory_check:
            self.next_memory_check = now + MEMORY_CHECK_EVERY
            self.check_memory(now)

    def on_renew(self, job_id: str, sent_at: float, error, now: float) -> None:
        entry = self.inflight.get(job_id)
        if entry is None:
            return
        if error is None:
            self.inflight.renewed(entry, sent_at)
            self.hooks.lease_renewed("ok")
            return
        entry.renewing = False
        if isinstance(error, (api.LeaseLost, api.AlreadyFinished)):
            self.hooks.lease_renewed("lost")
            self.lease_lost(entry, error, now)
        elif isinstance(error, api.Unauthorized):
            self.fatal(exitcodes.AUTH, error)
        else:
            self.hooks.lease_renewed("error")
            entry.renew_at = now + min(2.0, self.cfg.lease / 10.0) * random.uniform(0.5, 1.0)
            log_event(log, WARNING, "lease renewal failed; retrying", error=str(error),
                      lease_left=round(entry.lease_until - now, 2), **self.job_fields(entry, now))

    def job_fields(self, entry: Entry, now: float) -> dict:
        """What every job log line carries: job_id, queue, worker_id, the child's pid and the duration so far."""
        duration = entry.extra.get("duration")
        if duration is None:
            duration = now - entry.started_at if entry.started_at is not None else 0.0
        return {"job_id": entry.id, "queue": entry.queue, "worker_id": self.cfg.worker_id, "pid": entry.pid,
                "duration": round(duration, 4)}

    def lease_lost(self, entry: Entry, error, now: float) -> None:
        """The API says this worker no longer holds the job: stop the work, send nothing more for it."""
        self.inflight.pop(entry.id)
        self.hooks.job_finished(entry.queue, "lease_lost", None)
        child = self.children.get(entry.slot) if entry.slot is not None else None
        log_event(log, WARNING, "lease lost; stopping the job's work", error=str(error), **self.job_fields(entry, now))
        if child is not None and child.job_id == entry.id:
            child.job_id = None
            stop_child(child, "lease_lost", now, self.cfg.kill_grace)

    def check_memory(self, now: float) -> None:
        """Read every child's RSS; enforce --max-memory-per-child when set."""
        limit = self.cfg.max_memory_per_child_mb * 2**20 or float("inf")
        growth = max(self.cfg.max_memory_per_child_mb * 2**20 // 10, 16 * 2**20)
        for child in list(self.children.values()):
            rss = child.read_rss()
            if rss is None or rss <= limit or child.state == "stopping":
                continue
            if child.state == "idle":
                log_event(log, INFO, "child over its memory cap; replacing it", slot=child.slot, pid=child.pid,
                          rss_mb=rss // 2**20, cap_mb=self.cfg.max_memory_per_child_mb)
                stop_child(child, "max_memory", now, self.cfg.kill_grace, graceful=True)
            elif child.state == "busy":
                child.retire = child.retire or "max_memory"
                if child.rss_at_breach is None:
                    child.rss_at_breach = rss
                elif rss > child.rss_at_breach + growth:
                    entry = self.inflight.on_child(child.slot)
                    log_event(log, ERROR, "child keeps growing past its memory cap during a job; stopping it",
                              slot=child.slot, pid=child.pid, rss_mb=rss // 2**20, job_id=entry.id if entry else None)
                    child.job_id = None
                    stop_child(child, "max_memory", now, self.cfg.kill_grace)
                    if entry is not None:
                        entry.extra["duration"] = now - (entry.started_at or now)
                        self.inflight.finish(entry, ("fail", f"MemoryLimitExceeded: the child process (pid {child.pid}) "
                                                             f"grew to {rss // 2**20} MiB during this job, over the "
                                                             f"{self.cfg.max_memory_per_child_mb} MiB cap; it was stopped"))
                        self.report(entry)

    # -------------------------------------------------------- worker lifecycle
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
        self.recent_crashes = [t for t in self.recent_crashes if now - t < DEGRADED_FOR]
        if (self.boot_failures and now - self.last_boot_failure < DEGRADED_FOR) or len(self.recent_crashes) >= 3:
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

    # ------------------------------------------------------------ API results
    def handle_api_results(self, now: float) -> None:
        for tag, result, error in self.http.done():
            if error is None or not isinstance(error, api.Unavailable):
                self.api_ok_at = now
            if error is not None and not isinstance(error, api.ApiError):
                log.exception("unexpected error in an API call", exc_info=error)
                error = api.Unavailable(0, "CLIENT_ERROR", f"{type(error).__name__}: {error}")
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
