"""Child processes as the parent sees them: spawn, stop in two stages, decode how they died.

Children come from the multiprocessing forkserver (started before the parent has any
thread), so none is ever forked from a threaded process. Each has a socketpair `Channel`.
Each child leads its own process group (pgid == pid, set first thing in the child), so stopping a
child signals everything its handler started in that group; see supervisor.child.group.
"""

from __future__ import annotations

import enum
import logging
import multiprocessing
import os
import random
import signal
import socket
from dataclasses import dataclass, field
from logging import WARNING
from multiprocessing import resource_tracker

import psutil

from supervisor.child import forkservers
from supervisor.child.group import KEEPER_TITLE, group_members
from supervisor.child.main import BOOT_ERROR_EXIT, child_main
from supervisor.child.wire import Channel, Drop, JobFrame, Stop
from supervisor.config import Config
from supervisor.job import Job
from supervisor.ops.logs import log_event, scrub
from supervisor.ops.procmem import TreeMemory

log = logging.getLogger("supervisor")

_CONTEXT = multiprocessing.get_context("forkserver")
_group_grace = 3.0  # seconds a child's keeper gives its group between SIGTERM and SIGKILL


def set_group_grace(grace: float) -> None:
    """Set the grace the keeper of every child started from now on gives its group (--kill-grace)."""
    global _group_grace
    _group_grace = max(0.0, float(grace))


class ChildState(enum.Enum):
    """Where a child is in its life, as the parent sees it."""

    STARTING = "starting"  # importing the handler
    IDLE = "idle"  # waiting for a job
    BUSY = "busy"  # running `job_id`
    STOPPING = "stopping"  # asked to go; reaped when it exits


@dataclass(eq=False)
class Child:
    """One child process as the parent sees it. Only these methods change its state."""

    slot: int  # its place in the pool, 0..target-1
    proc: multiprocessing.process.BaseProcess
    chan: Channel  # the parent's end of its socketpair
    started_at: float
    job_quota: int = 0  # replace after this many jobs; 0 = no limit
    pid: int | None = None
    keeper_pid: int | None = None  # the keeper of its process group, as the child reported when ready
    state: ChildState = ChildState.STARTING
    job_id: str | None = None  # the job it runs now
    held_id: str | None = None  # the job sent ahead, which it starts when the running one ends
    recalling: bool = False  # a `drop` for the held job is on its way
    jobs_done: int = 0
    replace_reason: str | None = None  # replace it once idle, for this reason (reload, max_jobs, max_memory, resize)
    stop_reason: str | None = None  # why it was asked to stop
    kill_at: float | None = None  # SIGKILL at this time if it has not exited
    rss: int | None = None  # its process tree's memory at the last sample, in bytes (as `memory.bytes`)
    generation: int = 0  # the forkserver it came from (a reload with --preload starts a new one)
    memory: TreeMemory | None = None  # its process tree's memory at the last sample
    over_cap: int = 0  # samples in a row its tree was over --max-memory-per-child during a job
    sent_kill: bool = False  # the daemon sent it SIGKILL
    boot_error: str | None = None  # the traceback of a failed handler import
    watching_writes: bool = False  # the selector watches its socket for writability
    idle_since: float = 0.0  # when it last became idle: the child idle longest takes the next job
    _ps: psutil.Process | None = field(default=None, repr=False)

    # -- state changes --
    def became_ready(self, now: float, keeper_pid: int | None = None) -> None:
        self.keeper_pid = keeper_pid
        if self.state is ChildState.STARTING:
            self.state, self.idle_since = ChildState.IDLE, now

    def start_job(self, job: Job) -> bool:
        """Send `job` to this idle child; False if its socket is gone (the sentinel reports the death)."""
        try:
            self.chan.send_job(job)
        except OSError:
            return False
        self.state, self.job_id = ChildState.BUSY, job.id
        return True

    def hold_job(self, job: Job, start_by: float) -> bool:
        """Send `job` ahead to this busy child, to start when its job ends if that is before `start_by`
        (monotonic), else to give back; False if its socket is gone."""
        try:
            self.chan.send(JobFrame(job, True, start_by))
        except OSError:
            return False
        self.held_id, self.recalling = job.id, False
        return True

    def recall_job(self, job_id: str) -> bool:
        """Ask for the held job `job_id` back (`dropped`), unless it started meanwhile; True if asked."""
        if self.held_id != job_id or self.recalling:
            return False
        try:
            self.chan.send(Drop(job_id))
        except OSError:
            return False  # it is dying: the reap returns the job
        self.recalling = True
        return True

    def answered(self, now: float, next_id: str | None = None) -> None:
        """The child answered for its job; `next_id` is the held job it started at once."""
        self.jobs_done += 1
        self.job_id = None
        self.over_cap = 0
        if next_id is not None:
            self.job_started(next_id)
        self._idle_if_free(now)

    def job_started(self, job_id: str) -> None:
        """The child started its held job."""
        if self.held_id == job_id:
            self.held_id, self.recalling = None, False
        if self.state is not ChildState.STOPPING:
            self.job_id = job_id

    def job_returned(self, now: float, job_id: str) -> None:
        """The child gave its held job back unstarted."""
        if self.held_id == job_id:
            self.held_id, self.recalling = None, False
        self._idle_if_free(now)

    def _idle_if_free(self, now: float) -> None:
        if self.state is ChildState.BUSY and self.job_id is None and self.held_id is None:
            self.state, self.idle_since = ChildState.IDLE, now

    def mark_for_replacement(self, reason: str) -> bool:
        """Replace this child once it is idle; True if this is news."""
        if self.replace_reason:
            return False
        self.replace_reason = reason
        return True

    def note_boot_error(self, text: str) -> None:
        self.boot_error = text

    def note_memory(self, sample: TreeMemory | None, over_cap: bool) -> int:
        """Record a sample of its tree's memory; return how many samples in a row it was over the cap
        during a job (0 when not busy or not over)."""
        self.memory = sample
        self.rss = sample.bytes if sample is not None else None
        self.over_cap = self.over_cap + 1 if over_cap and self.busy else 0
        return self.over_cap

    def begin_stop(self, reason: str, now: float, grace: float, graceful: bool = False) -> None:
        """Ask the child to go: a `stop` frame if `graceful` (it is idle), otherwise SIGTERM; SIGKILL
        after `grace`. Its job, if any, is no longer its business."""
        if self.state is ChildState.STOPPING:
            return
        self.state = ChildState.STOPPING
        self.stop_reason = reason
        self.job_id = None
        self.kill_at = now + grace
        log_group_members(self, reason)
        if graceful:
            try:
                self.chan.send(Stop())
                return
            except OSError:
                pass
        signal_child(self, signal.SIGTERM)
        if grace <= 0:
            signal_child(self, signal.SIGKILL)
            self.sent_kill = True

    def write_interest_changed(self) -> bool:
        """Follow whether a frame is still going out; True when the selector must be told."""
        if self.chan.wants_write == self.watching_writes:
            return False
        self.watching_writes = self.chan.wants_write
        return True

    def kill_if_due(self, now: float) -> bool:
        """SIGKILL a child that outlived its grace after SIGTERM; True if it was sent."""
        if self.kill_at is None or now < self.kill_at:
            return False
        signal_child(self, signal.SIGKILL)
        self.kill_at = None
        self.sent_kill = True
        return True

    # -- reading --
    @property
    def idle(self) -> bool:
        return self.state is ChildState.IDLE

    @property
    def busy(self) -> bool:
        return self.state is ChildState.BUSY

    @property
    def may_hold(self) -> bool:
        """Busy with a job, holding none, and staying after it: it may be sent its next job."""
        return (self.state is ChildState.BUSY and self.job_id is not None and self.held_id is None
                and self.stays_after_job)

    @property
    def stays_after_job(self) -> bool:
        """Not due for replacement or a reload, and not at its job quota once its job ends."""
        return self.replace_reason is None and not (self.job_quota and self.jobs_done + 1 >= self.job_quota)

    @property
    def starting(self) -> bool:
        return self.state is ChildState.STARTING

    @property
    def stopping(self) -> bool:
        return self.state is ChildState.STOPPING

    def ps(self) -> psutil.Process | None:
        if self._ps is None and self.pid:
            try:
                self._ps = psutil.Process(self.pid)
            except psutil.Error:
                return None
        return self._ps


def job_quota(max_jobs: int) -> int:
    """`max_jobs` plus up to 10% jitter, so children recycle at different times."""
    if max_jobs <= 0:
        return 0
    return max_jobs + random.randint(0, max(0, max_jobs // 10))


def multiprocessing_helper_pids() -> set[int]:
    """Pids of the daemon's own children that multiprocessing waits for itself (the forkserver and the
    resource tracker): nobody else may reap them (supervisor.parent.orphans excludes them)."""
    tracker = getattr(resource_tracker._resource_tracker, "_pid", None)
    return forkservers.pids() | ({tracker} if tracker else set())


def shared_env(cfg: Config) -> dict[str, str]:
    """What children add to their environment: the API key and URL with --share-api-key, else nothing."""
    if not cfg.share_api_key:
        return {}
    return {"SPOOLED_API_KEY": cfg.api_key.value, "SPOOLED_API_URL": cfg.api_url}


FRAME_SLACK = 1024 * 1024  # what a frame may hold beside a result


def spawn_child(slot: int, now: float, handler: str, worker_id: str, max_result_bytes: int, max_jobs: int,
                env: dict[str, str] | None = None, generation: int = 0) -> Child:
    parent_end, child_end = socket.socketpair()
    proc = _CONTEXT.Process(
        target=child_main,
        args=(child_end, handler, slot, worker_id, max_result_bytes, os.getpid(), _group_grace, env),
        name=f"spooled-child-{slot}",
    )
    try:
        forkservers.start_process(proc, generation)
    finally:
        child_end.close()
    # a child's largest frame is its result's (which it refuses past max_result_bytes) or a boot traceback
    return Child(slot=slot, proc=proc, chan=Channel(parent_end, 2 * max_result_bytes + FRAME_SLACK), started_at=now,
                 job_quota=job_quota(max_jobs), pid=proc.pid, generation=generation)


def leads_group(pid: int) -> bool:
    """True once the child `pid` is the leader of its own process group (it sets that up first thing)."""
    try:
        return os.getpgid(pid) == pid
    except OSError:
        return False


def signal_child(child: Child, sig: int) -> None:
    """Send `sig` to the child's whole process group; to the child alone while it has not set one up yet
    (before that it runs no handler code, and its group is still the daemon's)."""
    if not child.pid:
        return
    try:
        if leads_group(child.pid):
            os.killpg(child.pid, sig)
        else:
            os.kill(child.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def group_besides_child(child: Child) -> list[str]:
    """The processes in the child's group other than the child and its keeper, described for a log line."""
    if not child.pid or not leads_group(child.pid):
        return []
    return _split_keeper(child, group_members(child.pid, exclude=frozenset({child.pid})))[1]


def log_group_members(child: Child, reason: str) -> None:
    """Log what will be stopped along with the child, when its handler left anything in its group."""
    others = group_besides_child(child)
    if others:
        log_event(log, WARNING, "stopping a child with the processes in its group", slot=child.slot,
                  child_pid=child.pid, reason=reason, processes=others)


def kill_group(child: Child) -> list[int]:
    """Call when a child has been reaped, before any new child is started: log and stop what is left of
    its process group. The child's keeper empties the group itself (SIGTERM, grace, SIGKILL); if the
    keeper is gone too, SIGKILL the group now. Returns the pids that were left.

    Safe against pid reuse: while any member of group `child.pid` lives, Linux does not reuse that pid,
    and only a new child of ours (started later) could lead a new group with that number."""
    if not child.pid:
        return []
    left = group_members(child.pid, exclude=frozenset({child.pid}))
    if not left:
        return []
    keeper, others = _split_keeper(child, left)
    if others:
        log_event(log, WARNING, "stopping processes left in a finished child's process group", slot=child.slot,
                  child_pid=child.pid, processes=others, by="keeper" if keeper else "parent")
    if not keeper:
        try:
            os.killpg(child.pid, signal.SIGKILL)
        except OSError:
            pass
    return left


def _split_keeper(child: Child, pids: list[int]) -> tuple[list[str], list[str]]:
    """Describe `pids` of the child's group as (its keeper, the others). The keeper is known by the pid
    the child reported (its title is set a moment after it forks), or by its title."""
    keeper: list[str] = []
    others: list[str] = []
    for pid in pids:
        text = describe_pid(pid)
        if gone(text, pid):
            continue  # gone, or exiting, since the group was listed (a keeper that just emptied it, say)
        (keeper if pid == child.keeper_pid or KEEPER_TITLE in text else others).append(text)
    return keeper, others


def gone(text: str, pid: int) -> bool:
    """Whether `describe_pid`'s `text` says the process is gone or exiting (no command line left: a
    process whose memory is already released shows none, keepers on their way out among them)."""
    return text == str(pid) or text.endswith(": ")


def describe_pid(pid: int) -> str:
    """`pid name: cmdline` for a log line (cut at 200 characters); just the pid if it is gone."""
    try:
        proc = psutil.Process(pid)
        text = f"{pid} {proc.name()}: {' '.join(proc.cmdline())}"
    except psutil.Error:
        return str(pid)
    return scrub(text)[:200]  # a command line may carry the key: scrubbed before it is cut


def death_cause(exitcode: int | None, oom: bool | None = None, killed_by_daemon: bool = False) -> str:
    """Say how a child ended, e.g. 'killed by the kernel OOM killer (SIGKILL)'. For a SIGKILL, `oom` says
    whether the OOM kill counter rose meanwhile (None: no counter to read), `killed_by_daemon` whether the
    daemon sent it (a child that outlived its grace)."""
    if exitcode is None:
        return "ended with an unknown status"
    if exitcode == -signal.SIGKILL:
        if killed_by_daemon:
            return "killed by SIGKILL (by the daemon, after the grace period)"
        if oom:
            return "killed by the kernel OOM killer (SIGKILL)"
        return "killed by signal 9 (not by the daemon)" + ("" if oom is False else "; possibly out of memory")
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        text = f"killed by {name}"
        if -exitcode == signal.SIGSEGV:
            text += " (segmentation fault)"
        return text
    if exitcode == BOOT_ERROR_EXIT:
        return f"exited with code {exitcode} (handler import failed)"
    return f"exited with code {exitcode}"
