"""Child processes as the parent sees them: spawn, stop in two stages, decode how they died.

Children come from the multiprocessing forkserver (started before the parent has any
thread), so none is ever forked from a threaded process. Each has a socketpair `Channel`.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import socket
from dataclasses import dataclass, field
from multiprocessing import forkserver

import psutil

from supervisor.child.main import BOOT_ERROR_EXIT, child_main
from supervisor.child.wire import Channel

_CONTEXT = multiprocessing.get_context("forkserver")


def start_forkserver() -> None:
    """Start the forkserver now, while the parent is still single-threaded and the key is out of its environment."""
    _CONTEXT.set_forkserver_preload(["supervisor.child.main"])
    forkserver.ensure_running()


@dataclass
class Child:
    slot: int
    proc: multiprocessing.process.BaseProcess
    chan: Channel
    started_at: float
    job_quota: int = 0  # 0 = no limit
    state: str = "starting"  # starting -> idle <-> busy; stopping once asked to go
    job_id: str | None = None
    jobs_done: int = 0
    retire: str | None = None  # replace after the current job, for this reason
    stop_reason: str | None = None
    kill_at: float | None = None  # SIGKILL at this time if it has not exited
    rss: int | None = None
    rss_at_breach: int | None = None
    boot_error: str | None = None
    pid: int | None = None
    watching_writes: bool = False
    _ps: psutil.Process | None = field(default=None, repr=False)

    def ps(self) -> psutil.Process | None:
        if self._ps is None and self.pid:
            try:
                self._ps = psutil.Process(self.pid)
            except psutil.Error:
                return None
        return self._ps

    def read_rss(self) -> int | None:
        try:
            proc = self.ps()
            self.rss = proc.memory_info().rss if proc else None
        except psutil.Error:
            self.rss = None
        return self.rss


def job_quota(max_jobs: int) -> int:
    """`max_jobs` plus up to 10% jitter, so children recycle at different times."""
    if max_jobs <= 0:
        return 0
    return max_jobs + random.randint(0, max(0, max_jobs // 10))


def spawn_child(slot: int, now: float, handler: str, worker_id: str, max_result_bytes: int, max_jobs: int) -> Child:
    parent_end, child_end = socket.socketpair()
    proc = _CONTEXT.Process(
        target=child_main,
        args=(child_end, handler, slot, worker_id, max_result_bytes, os.getpid()),
        name=f"spooled-child-{slot}",
    )
    try:
        proc.start()
    finally:
        child_end.close()
    return Child(slot=slot, proc=proc, chan=Channel(parent_end), started_at=now,
                 job_quota=job_quota(max_jobs), pid=proc.pid)


def signal_child(child: Child, sig: int) -> None:
    try:
        if child.pid:
            os.kill(child.pid, sig)
    except ProcessLookupError:
        pass


def stop_child(child: Child, reason: str, now: float, grace: float, graceful: bool = False) -> None:
    """Ask a child to go: a `stop` frame if idle and `graceful`, otherwise SIGTERM; SIGKILL after `grace`."""
    if child.state == "stopping":
        return
    child.state = "stopping"
    child.stop_reason = reason
    child.kill_at = now + grace
    if graceful:
        try:
            child.chan.send({"t": "stop"})
            return
        except OSError:
            pass
    signal_child(child, signal.SIGTERM)
    if grace <= 0:
        signal_child(child, signal.SIGKILL)


def death_cause(exitcode: int | None) -> str:
    """Say how a child ended, e.g. 'killed by SIGKILL (possibly out of memory)'."""
    if exitcode is None:
        return "ended with an unknown status"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        text = f"killed by {name}"
        if -exitcode == signal.SIGKILL:
            text += " (possibly out of memory)"
        elif -exitcode == signal.SIGSEGV:
            text += " (segmentation fault)"
        return text
    if exitcode == BOOT_ERROR_EXIT:
        return f"exited with code {exitcode} (handler import failed)"
    return f"exited with code {exitcode}"
