"""The memory of a process tree: a child, every process it started, and what is left in its process group.

A sample reads each process's RSS (/proc/PID/statm, some 10 us). RSS counts pages shared with other
processes (such as a model preloaded in the forkserver) in full in each, so when the tree's RSS is over
a threshold the sample reads PSS instead (/proc/PID/smaps_rollup: shared pages split among their
sharers), which is what a cap is checked against. PSS costs a walk of the process's page tables, some
3 ms for a process holding 150 MiB, which is why it is read only then. The tree is walked through
/proc/PID/task/TID/children, so a sample costs in proportion to the tree, not to the host. A process
whose parent died is re-parented to the daemon and leaves the tree: the daemon attributes it to the child
it came from (supervisor.parent.orphans) and passes it here as an extra root, so it is still counted.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

PAGE = os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True)
class TreeMemory:
    """Bytes held by a process tree, how many processes besides its root it counts, and whether the
    figure is PSS or RSS (`kind`)."""

    bytes: int
    subprocesses: int
    kind: str = "rss"


def resident(pid: int) -> int | None:
    """RSS of `pid` in bytes; None if it is gone."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * PAGE
    except (OSError, ValueError, IndexError):
        return None


def proportional(pid: int) -> int | None:
    """PSS of `pid` in bytes, or its RSS where smaps_rollup is missing; None if it is gone."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            for line in f:
                if line.startswith(b"Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resident(pid)


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


def tree_memory(pid: int, exclude: frozenset[int] = frozenset(), pss_above: int | None = None,
                extra_roots: tuple[int, ...] = ()) -> TreeMemory | None:
    """The memory of `pid` and every process below it, and of each of `extra_roots` and the processes below
    it (what left the tree but is known to be its own), the pids in `exclude` not counted (e.g. a keeper):
    their RSS, or their PSS when the RSS is over `pss_above` bytes. None when `pid` is gone."""
    pids = [pid] + [p for p in (descendants(pid) or []) if p not in exclude]
    for root in extra_roots:
        pids += [p for p in [root, *(descendants(root) or [])] if p not in exclude and p not in pids]
    sample = _total(pids, resident)
    if sample is not None and pss_above is not None and sample.bytes > pss_above:
        sample = _total(pids, proportional, "pss")
    return sample


def _total(pids: list[int], read, kind: str = "rss") -> TreeMemory | None:
    own = read(pids[0])
    if own is None:
        return None
    total, counted = own, 0
    for sub in pids[1:]:
        size = read(sub)
        if size is not None:
            total += size
            counted += 1
    return TreeMemory(total, counted, kind)
