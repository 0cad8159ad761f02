"""Non-dumpable daemon processes: the API key out of a handler's reach.

A handler runs as the daemon's user, and the kernel lets a process of the same user read another's
`/proc/<pid>/environ` (the environment as it was at exec, whatever `os.environ` holds since), its memory
(`/proc/<pid>/mem`) and attach a debugger, unless that process is not dumpable (`PR_SET_DUMPABLE` 0):
its `/proc` files then belong to root and the ptrace checks need CAP_SYS_PTRACE. So without
--share-api-key the parent and its forkservers are made non-dumpable; the cost is that py-spy, gdb,
`/proc/<pid>/environ` and core dumps of those processes need root.

The flag survives fork and is reset to dumpable by exec. A child forked by a non-dumpable forkserver
would inherit it (its memory could not be measured by the parent, py-spy could not attach, a crash would
leave no core), so each child makes itself dumpable again at its start (`child_main`): it holds nothing
of the key (the forkserver never had it), and the handler's own subprocesses are dumpable after exec.

The parent sets SEAL_ENV while it starts a forkserver; this module, the forkserver's first preload,
pops it and seals the forkserver before it imports anything else.
"""

from __future__ import annotations

import ctypes
import os

PR_SET_DUMPABLE = 4
PR_GET_DUMPABLE = 3
SEAL_ENV = "SPOOLED_SUPERVISOR_SEAL"


def set_dumpable(on: bool) -> bool:
    """Make this process dumpable (`on`) or not; whether the kernel agreed (False off Linux)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_DUMPABLE, 1 if on else 0, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def is_dumpable() -> bool | None:
    """Whether this process is dumpable (None: cannot tell)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        flag = libc.prctl(PR_GET_DUMPABLE, 0, 0, 0, 0)
    except (OSError, AttributeError):
        return None
    return None if flag < 0 else flag != 0


if os.environ.pop(SEAL_ENV, None) == "1":
    set_dumpable(False)
