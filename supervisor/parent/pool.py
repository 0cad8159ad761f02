"""The arbiter's child pool: start children, read their frames, reap the dead, converge to the target.

A mixin of `Arbiter`, which owns the state (`children`, `target`, `respawn_at`, `boot_failures`, ...);
only the parent's loop calls these methods.
"""

from __future__ import annotations

import logging
import selectors
from logging import DEBUG, ERROR, INFO, WARNING

from supervisor import exitcodes
from supervisor.backoff import backoff
from supervisor.ops.logs import log_event
from supervisor.parent.childproc import Child, death_cause, spawn_child, stop_child
from supervisor.parent.membership import DEGRADED_FOR

log = logging.getLogger("supervisor")

BOOT_TIMEOUT = 60.0  # a child that is not ready by then is killed and counted as a boot failure
MEMORY_CHECK_EVERY = 1.0


class ChildPool:
    def idle_children(self) -> list[Child]:
        """Children that may take a job now (one due for a reload still works until its turn comes)."""
        return [c for c in self.children.values() if c.state == "idle" and c.retire in (None, "reload")]

    def converge(self, now: float) -> None:
        """Make the children match the target: respawn empty slots, retire extra and due ones."""
        for slot in [s for s in self.respawn_at if s >= self.target]:
            del self.respawn_at[slot]  # resized away: nothing to respawn there
            self.boot_failures.pop(slot, None)
        for slot in range(self.target):
            if slot not in self.children and now >= self.respawn_at.get(slot, 0.0) and not self.stopping_for_good():
                self.start_child(slot, now)
        # A reload replaces one child at a time, and waits while a new child is starting, one is being
        # stopped, or a slot is backing off after a failed start (new code that does not import).
        replacing = bool(self.boot_failures) or any(
            c.state == "starting" or (c.state == "stopping" and c.stop_reason == "reload") for c in self.children.values())
        for child in list(self.children.values()):
            if child.slot >= self.target and child.state in ("idle", "starting"):
                stop_child(child, "resize", now, self.cfg.kill_grace, graceful=child.state == "idle")
            elif child.slot >= self.target and child.state == "busy":
                self.retire(child, "resize")
            elif child.retire and child.state == "idle":
                if child.retire == "reload" and replacing:
                    continue  # one at a time, so capacity drops by one child at most
                log_event(log, INFO, "replacing child", slot=child.slot, pid=child.pid, reason=child.retire,
                          jobs_done=child.jobs_done, rss=child.rss)
                stop_child(child, child.retire, now, self.cfg.kill_grace, graceful=True)
                replacing = True
            elif child.state == "starting" and now - child.started_at > BOOT_TIMEOUT:
                log_event(log, ERROR, "child did not become ready in time; killing it", slot=child.slot, pid=child.pid)
                stop_child(child, "boot_failed", now, 0.0)

    def stopping_for_good(self) -> bool:
        return self.exit_code is not None or (self.draining and not self.inflight.jobs)

    def start_child(self, slot: int, now: float) -> None:
        try:
            child = spawn_child(slot, now, self.cfg.handler, self.cfg.worker_id,
                                self.cfg.max_result_bytes, self.cfg.max_jobs_per_child)
        except OSError as exc:
            log_event(log, ERROR, "could not start a child", slot=slot, error=str(exc))
            self.respawn_at[slot] = now + backoff(self.boot_failures.get(slot, 0) + 1, 0.5, 30.0)
            self.next_converge_at = min(self.next_converge_at, self.respawn_at[slot])
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

    def reap_child(self, child: Child, now: float) -> None:
        """The child has exited: read what it left in the pipe, fail its job if it had one, plan a respawn."""
        if self.children.get(child.slot) is not child:
            return  # already handled
        self.read_child(child, now)  # drain the pipe first: a result sent just before dying still counts
        child.proc.join(0)
        code = child.proc.exitcode
        cause = death_cause(code)
        entry = self.inflight.on_child(child.slot)
        was_starting = child.state == "starting" or child.stop_reason == "boot_failed"
        expected = child.state == "stopping" and child.stop_reason in ("shutdown", "resize", "max_jobs", "max_memory", "reload")
        self.forget_child(child)
        self.restarts[child.slot] = self.restarts.get(child.slot, 0) + 1
        if entry is not None:
            log_event(log, ERROR, "child died during a job", cause=cause, **self.job_fields(entry, now))
            self.fail_job(entry, f"ChildProcessDied: the child process running this job (pid {child.pid}) {cause}",
                          now, "crashed")
        if was_starting:
            failures = self.boot_failures.get(child.slot, 0) + 1
            self.boot_failures[child.slot] = failures
            self.last_boot_failure = now
            delay = backoff(failures, 0.5, 30.0)
            self.respawn_at[child.slot] = now + delay
            self.next_converge_at = min(self.next_converge_at, self.respawn_at[child.slot])
            self.hooks.child_restarted("boot_failed")
            if not self.first_child_ready and child.boot_error is not None:
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
                self.recent_crashes = [t for t in self.recent_crashes if now - t < DEGRADED_FOR] + [now]
            self.respawn_at.pop(child.slot, None)
            self.hooks.child_restarted(reason)
            level = INFO if child.stop_reason in ("timeout", "lease_lost") else WARNING
            log_event(log, level, "child exited; starting a new one", slot=child.slot, pid=child.pid, cause=cause,
                      reason=reason)

    def check_memory(self, now: float) -> None:
        """Read every child's RSS; enforce --max-memory-per-child when set."""
        limit = self.cfg.max_memory_per_child_mb * 2**20 or float("inf")
        growth = max(self.cfg.max_memory_per_child_mb * 2**20 // 10, 16 * 2**20)
        for child in list(self.children.values()):
            rss = child.read_rss()
            if rss is None or rss <= limit or child.state == "stopping":
                continue
            self.retire(child, "max_memory")  # replaced once idle (by converge)
            if child.state != "busy":
                continue
            if child.rss_at_breach is None:
                child.rss_at_breach = rss
            elif rss > child.rss_at_breach + growth:
                entry = self.inflight.on_child(child.slot)
                log_event(log, ERROR, "child keeps growing past its memory cap during a job; stopping it",
                          slot=child.slot, pid=child.pid, rss_mb=rss // 2**20, job_id=entry.id if entry else None)
                if entry is None:
                    stop_child(child, "max_memory", now, self.cfg.kill_grace)
                    continue
                self.stop_job(entry, "max_memory", now)
                self.fail_job(entry, f"MemoryLimitExceeded: the child process (pid {child.pid}) grew to "
                                     f"{rss // 2**20} MiB during this job, over the {self.cfg.max_memory_per_child_mb} "
                                     "MiB cap; it was stopped", now)

    def retire(self, child: Child, reason: str) -> None:
        """Mark `child` for replacement once it is idle; `converge` stops it then."""
        if not child.retire:
            child.retire = reason
            self.pool_changed = True
