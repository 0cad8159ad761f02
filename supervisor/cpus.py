"""How many CPUs this process may really use: the affinity mask capped by the cgroup CPU quota.

`granted_cpus()` is what the default `--procs` is sized to. A pod limited to 2 CPUs on a 64-core node,
or a daemon started under `taskset -c 0` / systemd `CPUAffinity=`, gets 2 (or 1) children, not 64.
"""

from __future__ import annotations

import math
import os
from pathlib import Path


def affinity_cpus() -> int:
    """CPUs in this process's affinity mask (the host's count where the platform has no mask)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _cgroup_lines(proc_self: Path) -> list[tuple[str, list[str], str]]:
    """/proc/self/cgroup as (hierarchy id, controllers, path) rows; [] when unreadable."""
    try:
        text = (proc_self / "cgroup").read_text()
    except OSError:
        return []
    rows = []
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            rows.append((parts[0], [c for c in parts[1].split(",") if c], parts[2]))
    return rows


def _leaf_to_mount(mount: Path, path: str) -> list[Path]:
    """The existing directories from this process's cgroup up to the mount point. A container without a cgroup
    namespace shows the host's path, absent under its mount, which is then the container's own cgroup."""
    dirs = [mount]
    for part in [p for p in path.split("/") if p]:
        dirs.append(dirs[-1] / part)
    return [d for d in reversed(dirs) if d.is_dir()]


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _v2_quota(dirs: list[Path]) -> float | None:
    """The tightest `cpu.max` ("QUOTA PERIOD" or "max PERIOD") along the path, in CPUs; None = unlimited."""
    best: float | None = None
    for d in dirs:
        text = _read(d / "cpu.max")
        if not text:
            continue
        fields = text.split()
        try:
            if fields[0] == "max":
                continue
            quota, period = int(fields[0]), int(fields[1]) if len(fields) > 1 else 100_000
        except (ValueError, IndexError):
            continue
        if quota > 0 and period > 0:
            best = quota / period if best is None else min(best, quota / period)
    return best


def _v1_quota(dirs: list[Path]) -> float | None:
    """The tightest `cpu.cfs_quota_us / cpu.cfs_period_us` along the path, in CPUs; -1 or missing = unlimited."""
    best: float | None = None
    for d in dirs:
        quota_text, period_text = _read(d / "cpu.cfs_quota_us"), _read(d / "cpu.cfs_period_us")
        try:
            quota, period = int(quota_text or "-1"), int(period_text or "0")
        except ValueError:
            continue
        if quota > 0 and period > 0:
            best = quota / period if best is None else min(best, quota / period)
    return best


def cgroup_quota(root: str | Path = "/sys/fs/cgroup", proc_self: str | Path = "/proc/self") -> float | None:
    """This process's cgroup CPU quota in CPUs (v2 `cpu.max`, else v1 CFS quota); None when there is none."""
    root, rows = Path(root), _cgroup_lines(Path(proc_self))
    if (root / "cgroup.controllers").is_file():  # cgroup v2 mounted at root
        path = next((p for hid, ctrls, p in rows if hid == "0" and not ctrls), "/")
        return _v2_quota(_leaf_to_mount(root, path))
    for _, ctrls, path in rows:
        if "cpu" in ctrls:
            mount = next((m for m in (root / ",".join(ctrls), root / "cpu", root / "cpu,cpuacct") if m.is_dir()), None)
            return _v1_quota(_leaf_to_mount(mount, path)) if mount else None
    unified = root / "unified"  # hybrid layout: v2 only under unified/, and no v1 cpu controller
    if (unified / "cgroup.controllers").is_file():
        path = next((p for hid, ctrls, p in rows if hid == "0" and not ctrls), "/")
        return _v2_quota(_leaf_to_mount(unified, path))
    return None


def granted_cpus(root: str | Path = "/sys/fs/cgroup", proc_self: str | Path = "/proc/self",
                 affinity: int | None = None) -> tuple[int, str]:
    """(CPUs this process may use, one line saying where the number came from, for the start-up log).

    The affinity mask, capped by the cgroup quota rounded up; at least 1. `affinity` overrides the mask (tests).
    """
    host = os.cpu_count() or 1
    mask = affinity_cpus() if affinity is None else affinity
    quota = cgroup_quota(root, proc_self)
    if quota is not None and math.ceil(quota) < mask:
        count = max(1, math.ceil(quota))
        return count, f"procs={count} from cgroup quota {quota:.1f} CPUs; host has {host}"
    count = max(1, mask)
    if count < host:
        return count, f"procs={count} from the affinity mask ({count} of {host} CPUs)"
    return count, f"procs={count} from the CPU count ({host}; no affinity mask or cgroup quota limits it)"
