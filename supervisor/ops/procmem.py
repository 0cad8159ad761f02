"""The memory of a process tree: a child, every process it started, and what is left in its process group.

Each process counts its PSS (from /proc/PID/smaps_rollup: pages shared with other processes, such as a
model preloaded in the forkserver, are split among them) where the kernel offers it, else its RSS. The
tree is walked through /proc/PID/task/TID/children, so a sample costs in proportion to the tree, not to
the host. A process whose parent died is re-parented to the daemon and leaves the tree: it is no longer
counted (it is still stopped with the child's group).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

PAGE = os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True)
class TreeMemory:
    """Bytes held by a process tree and how many processes besides its root it counts."""

    bytes: int
    subprocesses: int


def process_memory(pid: int) -> int | None:
    """PSS of `pid` in bytes, or its RSS where smaps_rollup is missing; None if it is gone."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            for line in f:
                if line.startswith(b"Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * PAGE
    except (OSError, ValueError, IndexError):
        return None


def descendants(pid: int) -> list[int] | None:
    """Every process below `pid` (children, their children, ...); None if /proc cannot say."""
    found: list[int] = []
    todo = [pid]
    while todo:
        parent = todo.pop()
        try:
            tids = os.listdir(f"/proc/{parent}/task")
        except OSError:
            if parent == pid:
                return None
            continue
        for tid in tids:
            try:
                with open(f"/proc/{parent}/task/{tid}/children", "rb") as f:
                    kids = [int(k) for k in f.read().split()]
            except FileNotFoundError:
                continue
            except OSError:
                return None
            found.extend(kids)
            todo.extend(kids)
    return found


def tree_memory(pid: int, exclude: frozenset[int] = frozenset()) -> TreeMemory | None:
    """The memory of `pid` and every process below it (the pids in `exclude` not counted, e.g. a keeper);
    None when `pid` is gone."""
    own = process_memory(pid)
    if own is None:
        return None
    below = [p for p in (descendants(pid) or []) if p not in exclude]
    total, counted = own, 0
    for sub in below:
        size = process_memory(sub)
        if size is not None:
            total += size
            counted += 1
    return TreeMemory(total, counted)
