"""A child's process group: the child leads its own, and a tiny keeper process cleans it up when the child dies.

The parent stops a child by signalling its whole group, so everything a handler started in the group
goes with it. The keeper covers what the parent cannot: when the child dies for any reason (its job
ended by a stop frame, a crash, an OOM kill, or PR_SET_PDEATHSIG after the daemon itself was
SIGKILLed), the keeper, forked from the child before any handler code runs and told of its death by its
own PR_SET_PDEATHSIG, sends SIGTERM to what is left of the group, waits up to the grace period, then
SIGKILLs the group (itself included). A process that leaves the group (setsid, setpgid) escapes both;
the daemon, a child subreaper, adopts it when its parent dies and kills it at shutdown.
"""

from __future__ import annotations

import ctypes
import os
import resource
import signal
import time

PR_SET_PDEATHSIG = 1
KEEPER_TITLE = "spooled-supervisor: keeper of child"
POLL = 0.05


def lead_own_group() -> bool:
    """Make this process the leader of a new process group (its pgid becomes its pid); True if it is."""
    try:
        os.setpgid(0, 0)
    except OSError:
        pass
    return os.getpgid(0) == os.getpid()


def group_members(pgid: int, exclude: frozenset[int] = frozenset()) -> list[int]:
    """Pids of the live (not zombie) processes in process group `pgid`, read from /proc."""
    members = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in exclude:
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2:].split()  # after "pid (comm) ": state ppid pgrp ...
        if len(fields) > 2 and fields[0] != b"Z" and int(fields[2]) == pgid:
            members.append(int(name))
    return members


def _prctl(option: int, arg: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, arg, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl failed")


def start_keeper(slot: int, grace: float) -> int | None:
    """Fork the keeper of this process's group (call right after `lead_own_group`, before any handler
    code and before any thread); return its pid, or None if it could not be started. Never starts one
    in a group this process does not lead: it would empty the daemon's group."""
    child_pid = os.getpid()
    if os.getpgid(0) != child_pid:
        return None
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR2})
    try:
        pid = os.fork()
    except OSError:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR2})
        return None
    if pid:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR2})
        return pid
    try:
        _keep(child_pid, slot, grace)
    finally:
        os._exit(0)
    return None  # not reached


def _keep(child_pid: int, slot: int, grace: float) -> None:
    """The keeper's whole life: wait for the child to die, then empty the group."""
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGTTIN, signal.SIGTTOU):
        signal.signal(sig, signal.SIG_IGN)
    try:
        import setproctitle

        setproctitle.setproctitle(f"{KEEPER_TITLE} {slot}")
    except Exception:  # cosmetic
        pass
    _close_inherited_fds()  # never hold the child's socket or anything else open
    try:
        _prctl(PR_SET_PDEATHSIG, signal.SIGUSR2)
    except OSError:
        return
    if os.getppid() == child_pid:  # not dead yet: wait until it is
        signal.sigwait({signal.SIGUSR2})
    if os.getpgid(0) == child_pid:
        empty_group(child_pid, grace, exclude=frozenset({os.getpid()}))


def _close_inherited_fds() -> None:
    """Close every descriptor above stderr: those listed in /proc/self/fd (a closerange up to a limit of a
    million descriptors takes a second where close_range(2) is missing), else up to the limit."""
    try:
        fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        os.closerange(3, _fd_limit())
        return
    for fd in fds:
        if fd > 2:
            try:
                os.close(fd)
            except OSError:
                pass  # the listing's own descriptor, already closed


def _fd_limit() -> int:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if 0 < soft <= 1 << 20 else 1 << 20


def empty_group(pgid: int, grace: float, exclude: frozenset[int] = frozenset()) -> None:
    """SIGTERM the group, wait up to `grace` seconds for it to empty, then SIGKILL it."""
    if not group_members(pgid, exclude):
        return
    try:
        os.killpg(pgid, signal.SIGTERM)
    except OSError:
        return
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if not group_members(pgid, exclude):
            return
        time.sleep(POLL)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:
        pass
