"""The child pool: start children, read their frames, reap the dead, converge to the target size.

`ChildPool` alone owns the children and every fact about them (target size, respawn back-off,
boot failures, restarts, recycling, memory checks). It knows nothing of jobs or the API: what
happens to a child comes back to the arbiter as facts (`ChildReady`, `JobDone`, `ChildLost`).
"""

from __future__ import annotations

import logging
import selectors
import signal
import time
from collections.abc import Callable
from logging import DEBUG, ERROR, INFO, WARNING
from typing import Any

import psutil

from supervisor import sdkworker
from supervisor.backoff import backoff
from supervisor.child.forkservers import ready, renew_forkserver, retire_forkservers
from supervisor.child.wire import BadFrame, BootError, Done, Dropped, Ready, Settled, Started
from supervisor.config import Config
from supervisor.job import Job
from supervisor.ops.cgroup import MemorySource
from supervisor.ops.logs import log_event
from supervisor.ops.nullhooks import NullHooks
from supervisor.ops.procmem import TreeMemory
from supervisor.parent.childproc import Child, death_cause, kill_group, shared_env, signal_child, spawn_child
from supervisor.parent.facts import ChildLost, ChildReady, Fact, JobDone, JobReturned, JobSettled, JobStarted
from supervisor.parent.orphans import family_memory, stop_owned

log = logging.getLogger("supervisor")

BOOT_TIMEOUT = 60.0  # a child that is not ready by then is killed and counted as a boot failure
MEMORY_CHECK_EVERY = 1.0  # each child's process tree is sampled this often, busy or idle
GRACE_SAMPLES = 3  # samples in a row over --max-memory-per-child before a running job is stopped
MiB = 2**20
CONVERGE_EVERY = 0.25  # also converge at once whenever a child, a signal or a replacement changes the pool
DEGRADED_FOR = 60.0  # `degraded` this long after a boot failure, or while 3 crashes fall in it
MAX_PROCS = 1000
READ_BUDGET = 1024 * 1024  # bytes read from one child per turn of the loop at most (a bigger result takes turns)
EXPECTED_STOPS = ("shutdown", "resize", "max_jobs", "max_memory", "reload", "memory_pressure")


def _number(value: object, default: float) -> float:
    """A time a child sent, never later than `default` (now); `default` if it sent none."""
    return min(float(value), default) if isinstance(value, (int, float)) and not isinstance(value, bool) else default


class HandlerImportFailed(Exception):
    """The first child could not import the handler: nothing will ever run; carries the traceback."""


class ChildPool:
    """The children: starts, feeds, reads, reaps and replaces them to match the target size; owns everything
    about them and answers with facts (see the module docstring)."""

    def __init__(self, cfg: Config, sel: selectors.BaseSelector, hooks: NullHooks, memory: MemorySource | None = None,
                 measure: Callable[[int, frozenset[int], int | None], TreeMemory | None] = family_memory):
        self.cfg = cfg
        self.memory = memory  # where the kernel's OOM kills are counted; None: they are not
        self.measure = measure  # the memory of a child's process tree (PSS above the cap, else RSS)
        self.generation = 0  # the forkserver new children come from
        self.oom_seen = memory.oom_kills() if memory is not None else None  # the OOM kill counter, last read
        self.oom_unclaimed = 0  # OOM kills counted and not yet matched to a dead child
        self.oom_kills = 0  # children the kernel OOM killer killed
        self.sel = sel  # the arbiter's selector: children's sockets and sentinels are watched there
        self.hooks = hooks
        self.children: dict[int, Child] = {}  # slot -> the live child in it
        self.settle_watchers: dict[int, Child] = {}  # pid -> a child told how its jobs settle (for its SDK hooks)
        self.target: int = cfg.procs  # how many children we want
        self.respawn_at: dict[int, float] = {}  # slot -> earliest restart after a failed start
        self.boot_failures: dict[int, int] = {}  # slot -> failed starts in a row
        self.boot_errors: dict[int, str] = {}  # slot -> why its last start failed (while it keeps failing)
        self.restarts: dict[int, int] = {}  # slot -> children replaced there so far
        self.last_boot_failure = -1e9
        self.recent_crashes: list[float] = []  # when children crashed, the last DEGRADED_FOR seconds
        self.any_ready = False  # some child has imported the handler
        self.changed = True  # something happened that converge must look at
        self.next_converge_at = 0.0
        self.next_memory_check = 0.0
        self.ps_parent = psutil.Process()  # this process, for the heartbeat's CPU and memory of the tree

    # ------------------------------------------------------------ reading
    def idle_count(self) -> int:
        """How many children may take a job now (`idle_children`, counted without ordering them)."""
        proven = self.reload_proven()
        return sum(1 for c in self.children.values() if self._may_take_job(c, proven))

    def idle_children(self) -> list[Child]:
        """Children that may take a job now (see `_may_take_job`), the longest idle first: a child whose
        jobs end just as each claim's answer comes must not take every job while another waits (with
        claims for idle children only, it would, for seconds)."""
        proven = self.reload_proven()
        idle = [c for c in self.children.values() if self._may_take_job(c, proven)]
        if len(idle) > 1:
            idle.sort(key=lambda c: c.idle_since)
        return idle

    def reload_proven(self) -> bool:
        """A reload's new code is proven: some child started since the reload (due for nothing) is up, its
        forkserver is ready and no slot is backing off after a failed start. Until then the children due
        for the reload keep working (new code that does not import must not take them all down); from
        then on each takes no more work and is replaced the moment its job ends (see converge)."""
        if not any(c.replace_reason == "reload" for c in self.children.values()):
            return False
        return (not self.boot_failures and ready(self.generation)
                and any(c.replace_reason is None and (c.idle or c.busy) for c in self.children.values()))

    @staticmethod
    def _may_take_job(child: Child, reload_proven: bool) -> bool:
        """Idle, and not due for replacement; one due for a reload works until the reload is proven."""
        return child.idle and (child.replace_reason is None
                               or (child.replace_reason == "reload" and not reload_proven))

    def holding_children(self) -> list[Child]:
        """Busy children that may be sent their next job now, to start when theirs ends."""
        return [c for c in self.children.values() if c.may_hold]

    def busy_count(self) -> int:
        return sum(1 for c in self.children.values() if c.busy)

    def all_up(self) -> bool:
        """Every slot has a child and none is still starting."""
        return len(self.children) >= self.target and not any(c.starting for c in self.children.values())

    def all_up_since(self, since: float) -> bool:
        """Every slot has a child, up, and started at or after `since` (so a reload then has reached all)."""
        return self.all_up() and all(c.started_at >= since for c in self.children.values())

    def degraded(self, now: float) -> bool:
        """Children are crash-looping: a boot failure lately, or 3 crashes within DEGRADED_FOR."""
        crashes = sum(1 for t in list(self.recent_crashes) if now - t < DEGRADED_FOR)  # also read by /status
        return bool(self.boot_failures and now - self.last_boot_failure < DEGRADED_FOR) or crashes >= 3

    def tree_usage(self) -> tuple[float, float]:
        """CPU percent (of one core, summed, since the last call) and memory percent of this process (the
        parent) and its children, for the heartbeat."""
        cpu = mem = 0.0
        procs = [self.ps_parent] + [p for p in (c.ps() for c in list(self.children.values())) if p is not None]
        for proc in procs:
            try:
                cpu += proc.cpu_percent(None)
                mem += proc.memory_percent()
            except psutil.Error:
                pass
        return round(cpu, 1), round(mem, 2)

    def stats(self) -> dict:
        """Plain data for the published snapshot: the pool's size, its OOM kills, one row per child, and one per
        slot whose child keeps failing to start (its failures in a row, last error and monotonic retry time)."""
        rows: list[dict] = []
        for child in sorted(self.children.values(), key=lambda c: c.slot):
            mem = child.memory
            rows.append({
                "slot": child.slot, "pid": child.pid, "state": child.state.value, "job_id": child.job_id,
                "job_runtime_secs": None, "rss_bytes": child.rss, "jobs_done": child.jobs_done,
                "restarts": self.restarts.get(child.slot, 0), "memory_bytes": mem.bytes if mem else None,
                "subprocesses": mem.subprocesses if mem else None, "memory_kind": mem.kind if mem else None,
            })
        failing = [{"slot": slot, "failures": failures, "last_error": self.boot_errors.get(slot, ""),
                    "retry_at": self.respawn_at.get(slot)} for slot, failures in sorted(self.boot_failures.items())]
        return {"procs": self.target, "oom_kills": self.oom_kills, "children": rows, "failing": failing}

    def next_deadline(self, now: float) -> float | None:
        times = [c.kill_at for c in self.children.values() if c.kill_at is not None]
        times += [max(t, self.next_converge_at) for slot, t in self.respawn_at.items()
                  if slot not in self.children and slot < self.target]
        if self.changed:
            times.append(now)
        if len(self.children) < self.target and not ready(self.generation):
            times.append(self.next_converge_at)  # look again soon: the forkserver is importing the handler
        return min(times) if times else None

    # ------------------------------------------------------------ changes asked from outside
    def resize(self, delta: int) -> int:
        """Grow or shrink the target by `delta` (kept within 1..MAX_PROCS); return the new target."""
        self.target = max(1, min(MAX_PROCS, self.target + delta))
        self.changed = True
        return self.target

    def reload(self) -> None:
        """Replace every child: one first, then, once its new child is up, every other as its job ends (see
        converge); with --preload they come from a new forkserver, which imports the handler's module afresh."""
        if self.cfg.preload:
            self.generation = renew_forkserver(self.cfg.handler)
        self.replace_all("reload")

    def replace_all(self, reason: str) -> None:
        """Replace every child once it is idle (a reload: one first, then the others, see converge)."""
        for child in self.children.values():
            self.replace(child, reason)
        self.changed = True

    def replace(self, child: Child, reason: str) -> None:
        if child.mark_for_replacement(reason):
            self.changed = True

    def give_job(self, child: Child, job: Job) -> bool:
        """Hand `job` to an idle child; False if it could not take it."""
        if not child.start_job(job):
            return False
        self._watch_writes(child)
        return True

    def hold_job(self, child: Child, job: Job, start_by: float) -> bool:
        """Send `job` ahead to a busy child, to start before `start_by`; False if it could not take it."""
        if not child.hold_job(job, start_by):
            return False
        self._watch_writes(child)
        return True

    def tell_settled(self, fact: JobSettled) -> None:
        """Tell the child that ran `fact.job_id` how it settled (a `settled` frame), if it asked and lives."""
        child = self.settle_watchers.get(fact.pid)
        if child is None:
            return
        try:
            child.chan.send(Settled(fact.job_id, fact.settled_as, fact.error, fact.operation))
        except OSError:
            return  # it is dying: the sentinel reports it
        self._watch_writes(child)

    def recall_job(self, slot: int, job_id: str) -> None:
        """Ask the child on `slot` to give back its held job `job_id` (answered by a `JobReturned`, or a
        `JobStarted` if it had started it)."""
        child = self.children.get(slot)
        if child is not None and child.recall_job(job_id):
            self._watch_writes(child)

    def stop_job_child(self, slot: int, job_id: str, reason: str, now: float) -> None:
        """Stop the child on `slot` if it still runs `job_id` (SIGTERM, then SIGKILL after the grace)."""
        child = self.children.get(slot)
        if child is not None and child.job_id == job_id:
            child.begin_stop(reason, now, self.cfg.kill_grace)
            self.changed = True

    # ------------------------------------------------------------ the loop's turns
    def converge(self, now: float, stopping_for_good: bool) -> None:
        """Make the children match the target: respawn empty slots, stop extra and due ones."""
        if not self.changed and now < self.next_converge_at:
            return
        self.changed, self.next_converge_at = False, now + CONVERGE_EVERY
        for slot in [s for s in self.respawn_at if s >= self.target]:
            del self.respawn_at[slot]  # resized away: nothing to respawn there
            self.boot_failures.pop(slot, None)
            self.boot_errors.pop(slot, None)
        for slot in range(self.target):
            if slot not in self.children and now >= self.respawn_at.get(slot, 0.0) and not stopping_for_good:
                self._start_child(slot, now)
        # A reload first replaces one child (the first idle one), and waits while its forkserver is still
        # importing, that new child is starting, the old one is being stopped, or a slot is backing off
        # after a failed start (new code that does not import). Once a child started since is up (the
        # reload is proven), every child due for it is replaced the moment it is idle, in parallel: they
        # take no more work (idle_children), so each is new within its job's end and a start-up, and
        # the proven child keeps the throughput above zero.
        proven = self.reload_proven()
        replacing = bool(self.boot_failures) or not ready(self.generation) or any(
            c.starting or (c.stopping and c.stop_reason == "reload") for c in self.children.values())
        for child in list(self.children.values()):
            if child.slot >= self.target and (child.idle or child.starting):
                child.begin_stop("resize", now, self.cfg.kill_grace, graceful=child.idle)
            elif child.slot >= self.target and child.busy:
                self.replace(child, "resize")
            elif child.replace_reason and child.idle:
                if child.replace_reason == "reload" and replacing and not proven:
                    continue  # the first alone, so new code that does not import costs one child at most
                log_event(log, INFO, "replacing child", slot=child.slot, pid=child.pid, reason=child.replace_reason,
                          jobs_done=child.jobs_done, rss=child.rss)
                child.begin_stop(child.replace_reason, now, self.cfg.kill_grace, graceful=True)
                replacing = True
            elif child.starting and now - child.started_at > BOOT_TIMEOUT:
                log_event(log, ERROR, "child did not become ready in time; killing it", slot=child.slot, pid=child.pid)
                child.begin_stop("boot_failed", now, 0.0)
        if self.generation:
            retire_forkservers({c.generation for c in self.children.values()})

    def enforce(self, now: float) -> list[Fact]:
        """SIGKILL children past their grace; every MEMORY_CHECK_EVERY, sample memory and apply the cap."""
        for child in self.children.values():
            if child.kill_if_due(now):
                log_event(log, WARNING, "child ignored SIGTERM; sending SIGKILL", slot=child.slot, pid=child.pid,
                          reason=child.stop_reason)
        if now < self.next_memory_check:
            return []
        self.next_memory_check = now + MEMORY_CHECK_EVERY
        return self._check_memory(now)

    def read(self, child: Child, now: float, budget: int | None = READ_BUDGET) -> list[Fact]:
        """Read what the child sent (at most `budget` bytes; None: all of it): `ready`, `done` and
        `boot_error` frames, as facts."""
        try:
            messages = child.chan.receive(budget)
        except BadFrame as exc:
            self._unwatch(child.chan.sock)
            return self._stop_bad_frame(child, str(exc), now)
        except (EOFError, OSError):
            self._unwatch(child.chan.sock)
            return []
        facts: list[Fact] = []
        for frame in messages:
            match frame:
                case Done():
                    facts += self._done(child, frame, now)
                case Ready():
                    if frame.wants_settled and child.pid:  # its SDK worker has hooks for those events
                        self.settle_watchers[child.pid] = child
                    facts.append(ready := self._ready(child, now, frame.keeper))
                    if ready.first and frame.about is not None:
                        self._report_handler(frame.about)
                case Started():
                    child.job_started(frame.id)
                    facts.append(JobStarted(child.slot, frame.id, _number(frame.at, now)))
                case Dropped():
                    child.job_returned(now, frame.id)
                    self.changed = self.changed or bool(child.replace_reason and child.idle)
                    facts.append(JobReturned(child.slot, frame.id))
                case BootError():
                    child.note_boot_error(frame.error)
        return facts

    def flush(self, child: Child) -> None:
        try:
            child.chan.flush()
        except OSError:
            return  # the sentinel will tell us it died
        self._watch_writes(child)

    def reap(self, child: Child, now: float) -> list[Fact]:
        """The child has exited: read what it left in the pipe, plan a respawn, and say what became of
        its job (`ChildLost`). Raises HandlerImportFailed if the first child could not import the handler."""
        if self.children.get(child.slot) is not child:
            return []  # already handled
        # Drain the pipe first: a result sent just before dying still counts (bounded: a process the job left
        # behind may hold the socket and write on).
        facts = self.read(child, now, 4 * self.cfg.max_result_bytes + READ_BUDGET)
        child.proc.join(0)
        kill_group(child)  # what its handler left in its process group goes too, before any new child starts
        stop_owned(child.pid or 0, self.cfg.kill_grace)  # and what it started in sessions of their own
        cause = self._death_cause(child)
        was_starting = child.starting or child.stop_reason == "boot_failed"
        if child.held_id is not None:  # sent ahead and never started: it waits for another child
            facts.append(JobReturned(child.slot, child.held_id))
        self._forget(child)
        self.restarts[child.slot] = self.restarts.get(child.slot, 0) + 1
        facts.append(ChildLost(child.slot, f"ChildProcessDied: the child process running this job (pid {child.pid}) "
                                           f"{cause}", "crashed"))
        if was_starting:
            self._boot_failed(child, cause, now)
        elif child.stopping and child.stop_reason in EXPECTED_STOPS:
            self.respawn_at.pop(child.slot, None)
            if child.stop_reason != "shutdown":
                self.hooks.child_restarted(child.stop_reason)
            log_event(log, DEBUG, "child stopped", slot=child.slot, pid=child.pid, reason=child.stop_reason,
                      cause=cause)
        else:
            reason = child.stop_reason or "crashed"
            if reason == "crashed":
                self.recent_crashes = [t for t in self.recent_crashes if now - t < DEGRADED_FOR] + [now]
            self.respawn_at.pop(child.slot, None)
            self.hooks.child_restarted(reason)
            level = INFO if child.stop_reason in ("timeout", "lease_lost") else WARNING
            log_event(log, level, "child exited; starting a new one", slot=child.slot, pid=child.pid, cause=cause,
                      reason=reason)
        return facts

    def kill_all(self) -> None:
        for child in list(self.children.values()):
            signal_child(child, signal.SIGKILL)

    def shutdown(self) -> None:
        """Ask every child to stop, SIGKILL what is left after the grace period, and reap them all. Blocks
        for at most the kill grace (plus 2 s for a SIGKILLed child to be reaped)."""
        now = time.monotonic()
        for child in list(self.children.values()):
            child.begin_stop("shutdown", now, self.cfg.kill_grace, graceful=child.idle)
        deadline = now + self.cfg.kill_grace
        for child in list(self.children.values()):
            child.proc.join(max(0.0, deadline - time.monotonic()))
            if child.proc.exitcode is None:
                signal_child(child, signal.SIGKILL)
                child.proc.join(2.0)
            kill_group(child)
            stop_owned(child.pid or 0, self.cfg.kill_grace)
            self._forget(child)

    # ------------------------------------------------------------ inside
    def _ready(self, child: Child, now: float, keeper_pid: int | None = None) -> ChildReady:
        child.became_ready(now, keeper_pid)
        self.boot_failures.pop(child.slot, None)
        self.boot_errors.pop(child.slot, None)
        self.changed = True
        first, self.any_ready = not self.any_ready, True
        return ChildReady(child.slot, first)

    def _report_handler(self, about: dict) -> None:
        """Once, from the first child up: what was taken from the handler's SDK worker and what was not."""
        given = None if self.cfg.queue_source else self.cfg.queues
        for text, fields in sdkworker.report(self.cfg.handler, about, given):
            log_event(log, INFO if "taken" in fields else WARNING, text, **fields)

    def _done(self, child: Child, frame: Done, now: float) -> list[Fact]:
        following = frame.next
        child.answered(now, following)
        if child.replace_reason and child.idle:
            self.changed = True  # converge this very turn, before feed_children would hand it a job
        if child.job_quota and child.jobs_done >= child.job_quota:
            self.replace(child, "max_jobs")
        if self.cfg.max_memory_per_child_mb and child.pid:
            sample = self.measure(child.pid, self._not_counted(child), self.cfg.max_memory_per_child_mb * MiB)
            child.note_memory(sample, False)
            if sample is not None and sample.bytes > self.cfg.max_memory_per_child_mb * MiB:
                self.replace(child, "max_memory")
        done = JobDone(child.slot, frame.id, frame.ok, frame.result if frame.ok else frame.error)
        if following is None:
            return [done]
        return [done, JobStarted(child.slot, following, _number(frame.started, now))]

    def _boot_failed(self, child: Child, cause: str, now: float) -> None:
        failures = self.boot_failures.get(child.slot, 0) + 1
        self.boot_failures[child.slot] = failures
        self.boot_errors[child.slot] = child.boot_error or cause
        self.last_boot_failure = now
        delay = backoff(failures, 0.5, 30.0)
        self.respawn_at[child.slot] = now + delay
        self.hooks.child_restarted("boot_failed")
        if not self.any_ready and child.boot_error is not None:
            raise HandlerImportFailed(child.boot_error)
        log_event(log, ERROR, "child failed while starting; backing off", slot=child.slot, pid=child.pid,
                  cause=cause, retry_in=round(delay, 2), failures=failures, error=(child.boot_error or "")[:500])

    def _check_memory(self, now: float) -> list[Fact]:
        """Sample each child's process tree. Enforce --max-memory-per-child on it: a child over the cap is
        replaced once idle; over it for GRACE_SAMPLES samples in a row during a job, it is stopped with its
        group and the job failed."""
        cap = self.cfg.max_memory_per_child_mb * MiB
        facts: list[Fact] = []
        for child in list(self.children.values()):
            if child.stopping or not child.pid:
                continue
            sample = self.measure(child.pid, self._not_counted(child), cap or None)
            over = bool(cap) and sample is not None and sample.bytes > cap
            if child.note_memory(sample, over) >= GRACE_SAMPLES and sample is not None:
                facts.append(self._stop_over_cap(child, sample, now))
            elif over:
                self.replace(child, "max_memory")  # replaced once idle (by converge)
        self._note_oom_count()
        return facts

    def _stop_over_cap(self, child: Child, sample: TreeMemory, now: float) -> ChildLost:
        used, cap = sample.bytes // MiB, self.cfg.max_memory_per_child_mb
        log_event(log, ERROR, "a job's processes stayed over the memory cap; stopping the child and its group",
                  slot=child.slot, pid=child.pid, memory_mb=used, cap_mb=cap, subprocesses=sample.subprocesses,
                  job_id=child.job_id)
        child.begin_stop("max_memory", now, self.cfg.kill_grace)
        self.changed = True
        n = sample.subprocesses
        tree = f"child and {n} subprocess" + ("" if n == 1 else "es") if n else "the child alone"
        return ChildLost(child.slot, f"MemoryLimitExceeded: the job used {used} MiB, {used - cap} MiB over the cap "
                                     f"of {cap} MiB ({tree}); its processes were stopped", "failed")

    def _stop_bad_frame(self, child: Child, what: str, now: float) -> list[Fact]:
        """The child sent what is no frame (its handler wrote on the socket, say): nothing more it sends can be
        read, so it is killed now and its job fails saying so."""
        if child.stopping:
            return []
        log_event(log, ERROR, "a child sent what the parent cannot read; killing it", slot=child.slot,
                  pid=child.pid, job_id=child.job_id, error=what)
        child.begin_stop("bad_frame", now, 0.0)
        self.changed = True
        return [ChildLost(child.slot, f"ChildProtocolError: the child process running this job (pid {child.pid}) "
                                      f"sent {what} on its socket to the daemon; it was killed", "failed")]

    @staticmethod
    def _not_counted(child: Child) -> frozenset[int]:
        return frozenset({child.keeper_pid}) if child.keeper_pid else frozenset()

    def _death_cause(self, child: Child) -> str:
        """How the child ended; a SIGKILL the daemon did not send is told apart by the OOM kill counter."""
        code = child.proc.exitcode
        oom = None
        if code == -signal.SIGKILL and not child.sent_kill:
            oom = self._oom_killed()
            if oom:
                self.oom_kills += 1
                self.hooks.child_oom_killed()
        return death_cause(code, oom, child.sent_kill)

    def _oom_killed(self) -> bool | None:
        """Whether the kernel OOM killer accounts for a SIGKILLed child: one OOM kill counted since the last
        read and not matched to another child yet. None when there is no counter."""
        count = self.memory.oom_kills() if self.memory is not None else None
        if count is None or self.oom_seen is None:
            self.oom_seen = count
            return None
        self.oom_unclaimed += max(0, count - self.oom_seen)
        self.oom_seen = count
        if self.oom_unclaimed:
            self.oom_unclaimed -= 1
            return True
        return False

    def _note_oom_count(self) -> None:
        """Take the counter as the new baseline while no child lies dead unreaped (an OOM kill counted
        now belongs to some other process in the cgroup)."""
        if self.memory is None or any(c.proc.exitcode is not None for c in self.children.values()):
            return
        self.oom_seen, self.oom_unclaimed = self.memory.oom_kills(), 0

    def _start_child(self, slot: int, now: float) -> None:
        if not ready(self.generation):
            return  # its forkserver is still importing the handler: converge tries again shortly
        try:
            child = spawn_child(slot, now, self.cfg.handler, self.cfg.worker_id,
                                self.cfg.max_result_bytes, self.cfg.max_jobs_per_child, env=shared_env(self.cfg),
                                generation=self.generation)
        except OSError as exc:  # out of processes or memory: back off like a child that failed to start
            failures = self.boot_failures[slot] = self.boot_failures.get(slot, 0) + 1
            self.last_boot_failure = now
            self.respawn_at[slot] = now + backoff(failures, 0.5, 30.0)
            self.boot_errors[slot] = f"could not start a child: {exc}"
            log_event(log, ERROR, "could not start a child", slot=slot, error=str(exc), failures=failures)
            return
        self.children[slot] = child
        self.sel.register(child.chan.sock, selectors.EVENT_READ, ("chan", child))
        self.sel.register(child.proc.sentinel, selectors.EVENT_READ, ("sentinel", child))
        log_event(log, DEBUG, "child started", slot=slot, pid=child.pid)

    def _forget(self, child: Child) -> None:
        self.changed = True
        if child.pid is not None and self.settle_watchers.get(child.pid) is child:
            del self.settle_watchers[child.pid]
        if self.children.get(child.slot) is child:
            del self.children[child.slot]
        self._unwatch(child.chan.sock)
        self._unwatch(child.proc.sentinel)
        child.chan.close()
        try:
            child.proc.close()
        except ValueError:
            pass

    def _unwatch(self, fileobj: Any) -> None:
        try:
            self.sel.unregister(fileobj)
        except (KeyError, ValueError):
            pass

    def _watch_writes(self, child: Child) -> None:
        """Watch the child's socket for writability only while a frame is still going out."""
        if not child.write_interest_changed():
            return
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if child.watching_writes else 0)
        try:
            self.sel.modify(child.chan.sock, events, ("chan", child))
        except (KeyError, ValueError):
            pass
