"""The forkservers children are started from (multiprocessing's, and newer ones started by a reload).

Children come from a forkserver, a clean single-threaded process, never from the threaded parent. The
first one is multiprocessing's own, started before the parent has any thread. With --preload it imports
the handler's module before forking any child (supervisor.child.preload), so a reload must start a new
one to import changed code: the children started from then on come from it, while the older one lives
on until the last child it started is gone (a forkserver's children die with it, PR_SET_PDEATHSIG).

multiprocessing knows only its module-level forkserver; `start_process` points it at another one for
the duration of one `Process.start()` (the daemon's loop is the only thread that starts children).
"""

from __future__ import annotations

import os
import sys
from multiprocessing import forkserver
from multiprocessing.process import BaseProcess

from supervisor.child.preload import PRELOAD_ENV, preload_order

_servers: dict[int, forkserver.ForkServer] = {}  # generation -> its forkserver
_current = 0  # the generation new children come from


def start_forkserver(preload: str | None = None) -> None:
    """Start multiprocessing's forkserver now, while the parent is single-threaded and the key is out of its
    environment. With `preload` (a handler spec) it imports the handler's module before forking any child;
    the parent itself never does."""
    _start(forkserver._forkserver, preload)
    _servers[0] = forkserver._forkserver


def renew_forkserver(preload: str | None) -> int:
    """Start a new forkserver (importing `preload`'s module afresh) for the children started from now on;
    return its generation. The older ones stay until `retire_forkservers` finds their children gone."""
    global _current
    server = forkserver.ForkServer()
    _start(server, preload)
    _current += 1
    _servers[_current] = server
    return _current


def retire_forkservers(in_use: set[int]) -> list[int]:
    """Stop every forkserver, but the current one, that no live child came from; return their generations."""
    done = [gen for gen in _servers if gen != _current and gen not in in_use]
    for gen in done:
        try:
            _servers.pop(gen)._stop()  # type: ignore[attr-defined]  # private, undeclared
        except OSError:
            pass
    return done


def pids() -> set[int]:
    """The forkservers' pids (multiprocessing reaps them itself: nobody else may)."""
    found = {getattr(server, "_forkserver_pid", None) for server in (forkserver._forkserver, *_servers.values())}
    return {pid for pid in found if pid}


def start_process(proc: BaseProcess, generation: int) -> None:
    """`proc.start()` from the forkserver of `generation`."""
    server = _servers.get(generation)
    if server is None or server is forkserver._forkserver:
        proc.start()
        return
    connect = forkserver.connect_to_new_process
    forkserver.connect_to_new_process = server.connect_to_new_process
    try:
        proc.start()
    finally:
        forkserver.connect_to_new_process = connect


def _start(server: forkserver.ForkServer, preload: str | None) -> None:
    """Start `server`; the preload order goes through the environment (spawned by exec, it inherits it),
    set with putenv only for the time of the start."""
    server.set_forkserver_preload(["supervisor.child.main"] + (["supervisor.child.preload"] if preload else []))
    if preload:
        os.putenv(PRELOAD_ENV, preload_order(preload, sys.path))
    try:
        server.ensure_running()
    finally:
        if preload:
            os.unsetenv(PRELOAD_ENV)
