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
    _title(f"{KEEPER_TITLE} {slot}")  # the keeper is born with its title: no moment where the parent could
    # take it for a handler's process (the child sets its own title again right after)
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


def _title(text: str) -> None:
    try:
        import setproctitle

        setproctitle.setproctitle(text)
    except Exception:  # cosmetic but for telling the keeper apart
        pass


def _keep(child_pid: int, slot: int, grace: float) -> None:
    """The keeper's whole life: wait for the child to die, then empty the group."""
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGTTIN, signal.SIGTTOU):
        signal.signal(sig, signal.SIG_IGN)
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


# -- what a job started --------------------------------------------------------------------------------
JOB_MARK_ENV = "SPOOLED_SUPERVISOR_JOB"  # "<child pid>.<job number>" (0: the child's start-up), inherited on exec
MAX_WINDOW = 4096  # pids allocated during a job beyond this: scan all of /proc instead
STOP_WAIT = 0.2  # seconds the child waits for its job's processes to go before it hands the rest to a timer


def _last_pid() -> int | None:
    try:
        with open("/proc/sys/kernel/ns_last_pid", "rb") as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


def _pid_max() -> int:
    try:
        with open("/proc/sys/kernel/pid_max", "rb") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 1 << 22


def process_stat(pid: int) -> tuple[str, int, int, int] | None:
    """(state, ppid, pgid, start time in clock ticks since boot) of a process (not a thread); None if gone."""
    return _stat(pid)


def _stat(pid: int) -> tuple[str, int, int, int] | None:
    """(state, ppid, pgid, start time in clock ticks since boot) of a process (not a thread); None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        with open(f"/proc/{pid}/status", "rb") as f:
            tgid = next((line.split()[1] for line in f if line.startswith(b"Tgid:")), b"")
    except OSError:
        return None
    if tgid != str(pid).encode():
        return None  # a thread: its id is a pid too, and signalling it would signal its whole process
    fields = stat[stat.rfind(b")") + 2:].split()
    try:
        return fields[0].decode(), int(fields[1]), int(fields[2]), int(fields[19])
    except (IndexError, ValueError):
        return None


def _marked(pid: int, mark: bytes) -> bool:
    """Whether the process's environment (as of its exec) carries JOB_MARK_ENV=`mark`."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return b"\x00" + JOB_MARK_ENV.encode() + b"=" + mark + b"\x00" in b"\x00" + f.read()
    except OSError:
        return False


def holds_socket(pid: int, inode: int) -> bool:
    """Whether the process holds the socket of that inode open (a fork keeps every descriptor)."""
    target = f"socket:[{inode}]"
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for name in names:
        try:
            if os.readlink(f"/proc/{pid}/fd/{name}") == target:
                return True
        except OSError:
            continue
    return False


class JobProcesses:
    """The processes one job starts, found when it ends, however they were detached: still below the child,
    in its process group (`&`, nohup, a double fork), exec'd with the job's mark in their environment
    (`setsid`, a new session), or forked holding the child's socket to the parent. Only pids allocated
    while the job ran are looked at (the kernel's last pid before and after), so a job that starts
    nothing costs two small reads."""

    def __init__(self, socket_inode: int | None, number: int):
        self.child = os.getpid()
        self.inode = socket_inode
        self.mark = f"{self.child}.{number}"
        os.environ[JOB_MARK_ENV] = self.mark
        self.first_pid = _last_pid()
        self.since = _boot_ticks()

    def started(self, exclude: frozenset[int] = frozenset()) -> list[int]:
        """The live processes the job started (pids allocated since it began, started since, ours)."""
        last = _last_pid()
        if self.first_pid is None or last is None:
            candidates = [int(n) for n in os.listdir("/proc") if n.isdigit()]
        elif last == self.first_pid:
            return []
        else:
            span = (last - self.first_pid) % _pid_max()
            candidates = ([int(n) for n in os.listdir("/proc") if n.isdigit()] if span > MAX_WINDOW else
                          [(self.first_pid + i) % _pid_max() for i in range(1, span + 1)])
        found: dict[int, tuple[str, int, int, int]] = {}
        for pid in candidates:
            if pid in exclude or pid == self.child or pid <= 1:
                continue
            st = _stat(pid)
            if st is not None and st[0] != "Z" and st[3] >= self.since:
                found[pid] = st
        ours = []
        mark = self.mark.encode()
        for pid, (_state, _ppid, pgid, _start) in found.items():
            if pgid == self.child or self._below_child(pid, found) or _marked(pid, mark) or \
                    (self.inode is not None and holds_socket(pid, self.inode)):
                ours.append(pid)
        return ours

    def _below_child(self, pid: int, found: dict[int, tuple[str, int, int, int]]) -> bool:
        seen = 0
        while pid in found and seen < 64:
            pid = found[pid][1]
            seen += 1
        return pid == self.child


def _boot_ticks() -> int:
    """Now, in the clock ticks since boot that /proc/<pid>/stat gives processes' start times in."""
    return int(time.clock_gettime(time.CLOCK_BOOTTIME) * os.sysconf("SC_CLK_TCK"))


def stop_processes(pids: list[int], grace: float, wait: float = STOP_WAIT) -> None:
    """SIGTERM `pids` (and the groups they lead), wait up to `wait`, then leave a timer that SIGKILLs
    whoever is left after `grace` (the caller goes on meanwhile)."""
    if not pids:
        return
    starts = {pid: st[3] for pid in pids if (st := _stat(pid)) is not None}
    for pid in starts:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + min(wait, grace)
    while time.monotonic() < deadline:
        if not _alive(starts):
            return
        time.sleep(0.01)
    left = _alive(starts)
    if not left:
        return
    if grace <= wait:
        for pid in left:
            _signal(pid, signal.SIGKILL)
        return
    import threading

    def kill_rest() -> None:
        for pid in _alive(left):
            _signal(pid, signal.SIGKILL)

    timer = threading.Timer(grace - wait, kill_rest)
    timer.daemon = True
    timer.start()


def _alive(starts: dict[int, int]) -> dict[int, int]:
    """Those of `starts` (pid -> start time) still alive and still the same process."""
    out = {}
    for pid, start in starts.items():
        st = _stat(pid)
        if st is not None and st[0] != "Z" and st[3] == start:
            out[pid] = start
    return out


def _signal(pid: int, sig: int) -> None:
    try:
        if os.getpgid(pid) == pid and pid != os.getpgid(0):
            os.killpg(pid, sig)  # it leads a group of its own (setsid): what it started there goes too
        else:
            os.kill(pid, sig)
    except OSError:
        pass
