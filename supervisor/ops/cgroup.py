"""Reading the memory the daemon really has: its cgroup's limit, usage and OOM kills, else the host's.

`MemorySource.detect()` finds the daemon's own memory cgroup from /proc/self/cgroup: cgroup v2
(`memory.max`, `memory.current`, `memory.events`) or v1 (`memory.limit_in_bytes`, `memory.usage_in_bytes`,
`memory.oom_control`). A cgroup without a limit, or none at all, is measured against the host
(`MemTotal` and `MemAvailable` of /proc/meminfo). Every read is a few small files; nothing here raises.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
UNLIMITED = 1 << 60  # v1 says "no limit" with a huge number (9223372036854771712), v2 with "max"


@dataclass(frozen=True)
class MemoryReading:
    """Bytes in use and the limit they count against; `source` says where they came from
    (cgroup2, cgroup1 or host)."""

    used: int
    limit: int
    source: str

    @property
    def fraction(self) -> float:
        return self.used / self.limit if self.limit > 0 else 0.0


class MemorySource:
    """One cgroup directory (or none: the host) read on demand. `version` is 2, 1 or 0 (host only)."""

    def __init__(self, cgroup_dir: Path | None, version: int, meminfo: Path = Path("/proc/meminfo"),
                 vmstat: Path = Path("/proc/vmstat")):
        self.dir = cgroup_dir
        self.version = version if cgroup_dir is not None else 0
        self.meminfo = meminfo
        self.vmstat = vmstat

    @classmethod
    def detect(cls, proc_cgroup: Path = Path("/proc/self/cgroup"), root: Path = CGROUP_ROOT) -> MemorySource:
        """The memory cgroup of this process: v2 if its unified directory has `memory.current`, else the
        v1 memory controller's directory, else none."""
        try:
            lines = proc_cgroup.read_text().splitlines()
        except OSError:
            lines = []
        for line in lines:
            hier, _, rest = line.partition(":")
            controllers, _, path = rest.partition(":")
            rel = path.lstrip("/")
            if hier == "0" and controllers == "":
                for base in (root, root / "unified"):
                    if (base / rel / "memory.current").is_file():
                        return cls(base / rel, 2)
            if "memory" in controllers.split(","):
                for candidate in (root / "memory" / rel, root / "memory"):
                    if (candidate / "memory.usage_in_bytes").is_file():
                        return cls(candidate, 1)
        return cls(None, 0)

    def read(self) -> MemoryReading | None:
        """The cgroup's usage and limit; the host's when the cgroup sets no limit; None if unreadable."""
        if self.dir is not None:
            names = ("memory.current", "memory.max") if self.version == 2 else \
                ("memory.usage_in_bytes", "memory.limit_in_bytes")
            used, limit = _number(self.dir / names[0]), _number(self.dir / names[1])
            if used is not None and limit is not None and limit < UNLIMITED:
                return MemoryReading(used, limit, f"cgroup{self.version}")
        return self._host()

    def oom_kills(self) -> int | None:
        """How many processes the kernel OOM killer has killed so far in the cgroup (without one: on the
        host, from /proc/vmstat); None if unreadable."""
        if self.dir is None:
            path = self.vmstat
        else:
            path = self.dir / ("memory.events" if self.version == 2 else "memory.oom_control")
        try:
            text = path.read_text()
        except OSError:
            return None
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill" and value.strip().isdigit():
                return int(value)
        return None

    def _host(self) -> MemoryReading | None:
        fields: dict[str, int] = {}
        try:
            with open(self.meminfo) as f:
                for line in f:
                    key, _, rest = line.partition(":")
                    if key in ("MemTotal", "MemAvailable"):
                        fields[key] = int(rest.split()[0]) * 1024
        except (OSError, ValueError, IndexError):
            return None
        if "MemTotal" not in fields or "MemAvailable" not in fields:
            return None
        return MemoryReading(fields["MemTotal"] - fields["MemAvailable"], fields["MemTotal"], "host")


def _number(path: Path) -> int | None:
    """An integer file (v2's "max" counts as no limit); None if unreadable."""
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if text == "max":
        return UNLIMITED
    return int(text) if text.isdigit() else None
