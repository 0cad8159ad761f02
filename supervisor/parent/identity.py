"""One live daemon per worker id: this daemon's instance identity, and the decisions that use it.

Each daemon puts `instance_metadata()` into its registration and heartbeat metadata. Before
registering, `commands/run.py` reads the worker row and asks `other_live_instance`; while running,
the membership asks `taken_over_by` about every 50 s, just before a heartbeat. Both decisions are pure: they take the
worker row as `GET /api/v1/workers/{id}` returns it (its `status`, `last_heartbeat` and
`metadata` fields) and the current wall-clock time.
"""

from __future__ import annotations

import os
import secrets
import socket
import time
from collections.abc import Callable
from datetime import UTC, datetime

DEFAULT_HEARTBEAT_INTERVAL = 10.0  # the API's default heartbeat interval, used when the row does not say
RECENT_INTERVALS = 2.0  # a heartbeat this many intervals old or newer is recent
WAIT_INTERVALS = 1.25  # watch a recent heartbeat this many intervals (plus WAIT_SLACK) for it to advance
WAIT_SLACK = 1.0
MAX_WAIT = 60.0

_instance: dict | None = None


def instance_metadata(now: float | None = None) -> dict:
    """This process's identity, made once (at the first call, `now` = wall-clock start time):
    `{"host", "pid", "started_at" (RFC 3339 UTC), "instance_id" (random)}` plus `boot_id`, `pid_ns` and
    `pid_start` (kernel boot, pid namespace, process start tick) so that a successor in the same pid
    namespace can tell at once that this process is gone. Always the same dict contents."""
    global _instance
    if _instance is None:
        started = time.time() if now is None else now
        _instance = {"host": socket.gethostname(), "pid": os.getpid(), "started_at": rfc3339(started),
                     "instance_id": secrets.token_hex(8), **local_facts()}
    return dict(_instance)


def local_facts(pid: int | None = None) -> dict:
    """`boot_id`, `pid_ns` and `pid_start` of this process (or of `pid`'s start tick); None where unreadable."""
    return {"boot_id": _read("/proc/sys/kernel/random/boot_id"), "pid_ns": _readlink("/proc/self/ns/pid"),
            "pid_start": process_start(os.getpid() if pid is None else pid)}


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip() or None
    except OSError:
        return None


def _readlink(path: str) -> str | None:
    try:
        return os.readlink(path)
    except OSError:
        return None


def process_start(pid: int) -> int | None:
    """The start time of process `pid` in clock ticks since boot (/proc/<pid>/stat field 22), or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        return int(stat[stat.rfind(b")") + 2:].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def process_gone(pid: int, start: int | None) -> bool:
    """True only if process `pid` (started at tick `start`) certainly no longer exists in this pid namespace:
    kill(pid, 0) says ESRCH, or the pid now belongs to a process started at another tick. A process we may
    not signal or read (another user, hidden /proc) is not gone."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    now_start = process_start(pid)
    return start is not None and now_start is not None and now_start != start


def predecessor_gone(worker_row: dict | None, here: dict,
                     gone: Callable[[int, int | None], bool] = process_gone) -> bool:
    """True if the row's instance ran in this very pid namespace of this kernel boot (`here` is
    `instance_metadata()`) and its process is gone: a restart on the same host after a crash or SIGKILL,
    which need not wait for the heartbeat to go stale. False whenever that cannot be known for sure."""
    meta = row_metadata(worker_row)
    pid = meta.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    if not here.get("boot_id") or not here.get("pid_ns"):
        return False
    if meta.get("boot_id") != here["boot_id"] or meta.get("pid_ns") != here["pid_ns"]:
        return False
    if pid == here.get("pid"):
        return True  # our own pid, but not our instance: the process it named is gone
    start = meta.get("pid_start")
    return gone(pid, start if isinstance(start, int) else None)


def rfc3339(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse_time(text: object) -> float | None:
    """An RFC 3339 timestamp as Unix seconds; None if missing or unreadable."""
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def row_metadata(row: dict | None) -> dict:
    meta = (row or {}).get("metadata")
    return meta if isinstance(meta, dict) else {}


def row_heartbeat_interval(row: dict | None, default: float = DEFAULT_HEARTBEAT_INTERVAL) -> float:
    """The heartbeat interval the row's owner reported (`metadata.heartbeat_interval`), else `default`."""
    value = row_metadata(row).get("heartbeat_interval")
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value <= 3600:
        return float(value)
    return default


def describe_instance(row: dict) -> str:
    """`instance 3f2a... on host web-1, pid 4242, started 2026-12-01T07:00:00.000Z` from a worker row."""
    meta = row_metadata(row)
    host = meta.get("host") or row.get("hostname") or "?"
    return (f"instance {meta.get('instance_id') or '(no instance id)'} on host {host}, pid {meta.get('pid', '?')}, "
            f"started {meta.get('started_at', '?')}, last heartbeat {row.get('last_heartbeat')}")


def other_live_instance(worker_row: dict | None, own_instance_id: str, now_wall: float,
                        heartbeat_interval: float) -> str | None:
    """A one-line description of another instance that looks alive on this worker row, or None.

    Alive: the row is not `offline` (a clean deregister), its last heartbeat is at most
    RECENT_INTERVALS heartbeat intervals old, and its instance id is not ours (a row without one, from an
    older daemon or another client, counts as another instance). Whether that heartbeat still advances
    is for the caller to watch (`heartbeat_advanced`)."""
    if not worker_row or worker_row.get("status") == "offline":
        return None
    beat = parse_time(worker_row.get("last_heartbeat"))
    if beat is None or now_wall - beat > RECENT_INTERVALS * heartbeat_interval:
        return None
    if row_metadata(worker_row).get("instance_id") == own_instance_id:
        return None
    return describe_instance(worker_row)


def heartbeat_advanced(before: dict | None, after: dict | None) -> bool:
    """True if the row's last heartbeat moved on between two reads."""
    first = parse_time((before or {}).get("last_heartbeat"))
    second = parse_time((after or {}).get("last_heartbeat"))
    return first is not None and second is not None and second > first


def watch_deadline(heartbeat_interval: float) -> float:
    """Seconds to watch a recent foreign heartbeat for it to advance before taking the row over."""
    return min(MAX_WAIT, WAIT_INTERVALS * heartbeat_interval + WAIT_SLACK)


def taken_over_by(worker_row: dict | None, own: dict) -> str | None:
    """For a running daemon, from its periodic read of the row: the description of a NEWER instance on it,
    or None. `own` is `instance_metadata()`. Of two live daemons on one id the older one yields (the
    newer started deliberately, e.g. a replacement), so they never both stop; equal start times are
    broken by instance id."""
    if not worker_row:
        return None
    meta = row_metadata(worker_row)
    other_id = meta.get("instance_id")
    if not other_id or other_id == own["instance_id"]:
        return None
    other_started = parse_time(meta.get("started_at")) or 0.0
    own_started = parse_time(own.get("started_at")) or 0.0
    if (other_started, str(other_id)) > (own_started, own["instance_id"]):
        return describe_instance(worker_row)
    return None


def in_use_message(worker_id: str, other: str) -> str:
    """The one line a daemon exits with when its worker id is in use."""
    return (f"worker id {worker_id!r} is in use by another live daemon ({other}); give every daemon its own "
            "--worker-id / SPOOLED_WORKER_ID (e.g. %H-%i in the systemd template unit, the pod name on Kubernetes)")
