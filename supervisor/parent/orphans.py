"""Processes the daemon adopts as a child subreaper: reap them as they die, kill them at shutdown.

With PR_SET_CHILD_SUBREAPER set, anything below the daemon whose parent dies (a handler's double-forked
daemon, a keeper whose child ended, a grandchild left in a stopped child's group) is re-parented to the
daemon instead of init. Our real children are few and known: the multiprocessing forkserver and
resource tracker (multiprocessing waitpid()s them itself; handler children are the forkserver's, not
ours). So we list our direct children from /proc and only ever waitpid() a pid that is not a known one;
never waitpid(-1), which could steal a status multiprocessing is waiting for.

What the daemon adopts is attributed to the child it came from (`owner`: the process group it stayed in,
else the job mark its environment carries from exec): counted in that child's memory (`family_memory`)
and stopped when that child goes (`stop_owned`). A job's own processes are stopped by the child when the
job ends (supervisor.child.group.JobProcesses); what the handler's module started in a forkserver at
its import is stopped at shutdown (`kill_forkserver_strays`). No child is ever made a subreaper.
"""

from __future__ import annotations

import ctypes
import logging
import os
import re
import signal
import time
from collections.abc import Iterable
from logging import INFO, WARNING

from supervisor.child import forkservers
from supervisor.child.group import JOB_MARK_ENV, KEEPER_TITLE, process_stat, stop_processes
from supervisor.ops.logs import log_event
from supervisor.ops.procmem import TreeMemory, descendants, tree_memory
from supervisor.parent.childproc import describe_pid, gone, multiprocessing_helper_pids

log = logging.getLogger("supervisor")

PR_SET_CHILD_SUBREAPER = 36
PR_GET_CHILD_SUBREAPER = 37


def become_subreaper() -> bool:
    """Make this process a child subreaper (call before the forkserver starts). False if refused."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    except (OSError, AttributeError) as exc:
        log_event(log, WARNING, "cannot become a child subreaper; processes that escape a child's group "
                                "will be re-parented to init", error=str(exc))
        return False
    return True


def is_subreaper() -> bool:
    flag = ctypes.c_int(0)
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(flag), 0, 0, 0) == 0 and flag.value == 1


def direct_children() -> dict[int, str]:
    """This process's direct children and their state letter (`Z` for a zombie), from
    /proc/self/task/*/children (every thread's children), falling back to scanning /proc."""
    pids: set[int] = set()
    try:
        for tid in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{tid}/children") as f:
                pids.update(int(p) for p in f.read().split())
    except OSError:
        pids = _scan_for_children(os.getpid())
    states = {}
    for pid in pids:
        state = _state_and_ppid(pid)
        if state is not None and state[1] == os.getpid():
            states[pid] = state[0]
    return states


def _state_and_ppid(pid: int) -> tuple[str, int] | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rfind(b")") + 2:].split()
    return fields[0].decode(), int(fields[1])


def _scan_for_children(ppid: int) -> set[int]:
    found = set()
    for name in os.listdir("/proc"):
        if name.isdigit():
            state = _state_and_ppid(int(name))
            if state is not None and state[1] == ppid:
                found.add(int(name))
    return found


def adopted(known_pids: Iterable[int] = ()) -> dict[int, str]:
    """Direct children that are neither in `known_pids` nor multiprocessing's helpers: pid -> state."""
    skip = set(known_pids) | multiprocessing_helper_pids()
    return {pid: state for pid, state in direct_children().items() if pid not in skip}


def reap_adopted(known_pids: Iterable[int] = ()) -> list[tuple[int, int]]:
    """waitpid() every adopted process that has exited (zombies only, WNOHANG); return (pid, status).
    Cheap (a few small /proc reads): call on SIGCHLD and about once a second."""
    reaped = []
    for pid, state in adopted(known_pids).items():
        if state != "Z":
            continue
        try:
            got, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            continue
        if got:
            reaped.append((got, status))
    return reaped


def kill_adopted(known_pids: Iterable[int] = (), grace: float = 3.0) -> list[str]:
    """At shutdown, after the children are stopped: SIGTERM every live adopted process, wait up to `grace`,
    SIGKILL the rest, reap them all. Logs and returns what was killed (keepers are not listed: they are
    ours and go with their group)."""
    live = [pid for pid, state in adopted(known_pids).items() if state != "Z"]
    described = {pid: describe_pid(pid) for pid in live}
    escaped = [text for pid, text in described.items() if KEEPER_TITLE not in text and not gone(text, pid)]
    if escaped:
        log_event(log, WARNING, "killing processes that escaped their child's process group", processes=escaped,
                  grace=grace)
    _signal_all(live, signal.SIGTERM)
    termed = set(live)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        reap_adopted(known_pids)
        now_live = [pid for pid, state in adopted(known_pids).items() if state != "Z"]
        if not now_live:
            break
        _signal_all([pid for pid in now_live if pid not in termed], signal.SIGTERM)  # their orphans, adopted too
        termed.update(now_live)
        time.sleep(0.05)
    _kill_until_gone(known_pids, 2.0)
    return escaped


def _signal_all(pids: Iterable[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def _kill_until_gone(known_pids: Iterable[int], timeout: float) -> None:
    """SIGKILL and reap adopted processes until none is left (a killed one's own orphans come to us too)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        reap_adopted(known_pids)
        live = [pid for pid, state in adopted(known_pids).items() if state != "Z"]
        if not live and not adopted(known_pids):
            return
        _signal_all(live, signal.SIGKILL)
        time.sleep(0.02)


# -- attributing what the daemon adopts to the child it came from -------------------------------------
_MARK = re.compile(rb"(?:^|\x00)" + JOB_MARK_ENV.encode() + rb"=(\d+)\.\d+(?:\x00|$)")
_owners: dict[tuple[int, int], int | None] = {}  # (pid, start time) -> the child pid it came from (None: none)


def owner(pid: int) -> int | None:
    """The pid of the child an adopted process came from: the process group it is in (`&`, nohup, a double
    fork leave it there), or else the job mark in its environment (what a job or a child's start-up
    exec'd, in a session of its own or not). None: no child's."""
    st = process_stat(pid)
    if st is None:
        return None
    key = (pid, st[3])
    if key not in _owners:
        found: int | None = None
        if st[2] != os.getpgid(0) and st[2] != pid:
            found = st[2]
        else:
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    m = _MARK.search(f.read())
                found = int(m.group(1)) if m else None
            except OSError:
                found = None
        if len(_owners) > 10_000:
            _owners.clear()
        _owners[key] = found
    return _owners[key]


def owned_by(child_pid: int) -> tuple[int, ...]:
    """The live adopted processes that came from the child `child_pid` (not below it any more)."""
    return tuple(pid for pid, state in adopted().items() if state != "Z" and owner(pid) == child_pid)


def family_memory(pid: int, exclude: frozenset[int] = frozenset(), pss_above: int | None = None) -> TreeMemory | None:
    """The memory a child answers for: its tree, and what left the tree but came from it (`owned_by`)."""
    return tree_memory(pid, exclude, pss_above, owned_by(pid))


def stop_owned(child_pid: int, grace: float) -> list[int]:
    """SIGTERM what the child `child_pid` (gone now) left outside its tree and group, SIGKILL it after
    `grace` (on a timer: the loop does not wait); return the pids."""
    pids = [p for p in owned_by(child_pid) if process_stat(p) is not None]
    stop_processes(pids, grace, wait=0.0)
    return pids


def kill_forkserver_strays(grace: float = 3.0) -> list[str]:
    """At shutdown, after the children are stopped: what still runs below a forkserver was started by the
    handler's module at its import (--preload). SIGTERM it, wait up to `grace`, SIGKILL the rest; returns
    what was stopped (described)."""
    strays = [p for server in forkservers.pids() for p in (descendants(server) or []) if _running(p)]
    if not strays:
        return []
    described = [describe_pid(p) for p in strays]
    log_event(log, INFO, "stopping processes the handler's module started at its import", processes=described)
    for pid in strays:
        try:
            os.kill(pid, signal.SIGTERM)
        except OSError:
            pass
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(_running(p) for p in strays):
        time.sleep(0.05)
    for pid in strays:
        if _running(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    return described


def _running(pid: int) -> bool:
    state = _state_and_ppid(pid)
    return state is not None and state[0] != "Z"
