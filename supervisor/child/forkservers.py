"""The forkservers children are started from (multiprocessing's, and newer ones started by a reload).

Children come from a forkserver, a clean single-threaded process, never from the threaded parent. The
first one is multiprocessing's own, started before the parent has any thread. With --preload it imports
the handler's module before forking any child (supervisor.child.preload), so a reload must start a new
one to import changed code: the children started from then on come from it, while the older one lives
on until the last child it started is gone (a forkserver's children die with it, PR_SET_PDEATHSIG).

A preloading forkserver may take seconds to import a model, and starting a child waits for its
forkserver to answer: the loop must not stall that long (leases, heartbeats, /healthz). So the forkserver
marks a file once its import is done (or has failed), and `ready` says whether children may be asked of it.

multiprocessing knows only its module-level forkserver; `start_process` points it at another one for
the duration of one `Process.start()` (the daemon's loop is the only thread that starts children).
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from multiprocessing import forkserver
from multiprocessing.process import BaseProcess

from supervisor.child.dumpable import SEAL_ENV
from supervisor.child.preload import PRELOAD_ENV, preload_order

_servers: dict[int, forkserver.ForkServer] = {}  # generation -> its forkserver
_current = 0  # the generation new children come from
_marks: dict[int, str] = {}  # generation -> the directory where its forkserver marks its preload done
_sealed = False  # forkservers make themselves non-dumpable (supervisor.child.dumpable)


def start_forkserver(preload: str | None = None, sealed: bool = False) -> None:
    """Start multiprocessing's forkserver now, while the parent is single-threaded and the key is out of its
    environment. With `preload` (a handler spec) it imports the handler's module before forking any child;
    the parent itself never does. `sealed`: this and every later forkserver make themselves non-dumpable
    first thing."""
    global _sealed
    _sealed = sealed
    _servers[0] = forkserver._forkserver
    _start(0, preload)


def renew_forkserver(preload: str | None) -> int:
    """Start a new forkserver (importing `preload`'s module afresh) for the children started from now on;
    return its generation. The older ones stay until `retire_forkservers` finds their children gone."""
    global _current
    _current += 1
    _servers[_current] = forkserver.ForkServer()
    _start(_current, preload)
    return _current


def ready(generation: int) -> bool:
    """Whether the forkserver of `generation` may be asked for a child without a wait: it preloads nothing,
    has finished its import, or is dead (then multiprocessing starts a plain one)."""
    mark = _marks.get(generation)
    if mark is None or os.path.exists(os.path.join(mark, "ready")):
        return True
    pid = getattr(_servers.get(generation), "_forkserver_pid", None)
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except (OSError, IndexError):
        return True


def retire_forkservers(in_use: set[int]) -> list[int]:
    """Stop every forkserver, but the current one, that no live child came from; return their generations.
    One still importing is left for later: it would notice it is asked to stop only once its import ends,
    and the stop waits for it to exit."""
    done = [gen for gen in _servers if gen != _current and gen not in in_use and ready(gen)]
    for gen in done:
        try:
            _servers.pop(gen)._stop()  # type: ignore[attr-defined]  # private, undeclared
        except OSError:
            pass
        shutil.rmtree(_marks.pop(gen, ""), ignore_errors=True)
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


def _start(generation: int, preload: str | None) -> None:
    """Start the forkserver of `generation`; the preload order goes through the environment (spawned by
    exec, it inherits it), set with putenv only for the time of the start."""
    server = _servers[generation]
    server.set_forkserver_preload(["supervisor.child.dumpable", "supervisor.child.main"]
                                  + (["supervisor.child.preload"] if preload else []))
    if _sealed:
        os.putenv(SEAL_ENV, "1")
    if preload:
        mark = _marks[generation] = tempfile.mkdtemp(prefix="spooled-preload-")
        atexit.register(shutil.rmtree, mark, True)
        os.putenv(PRELOAD_ENV, preload_order(preload, sys.path, os.path.join(mark, "ready")))
    try:
        server.ensure_running()
    finally:
        os.unsetenv(SEAL_ENV)
        if preload:
            os.unsetenv(PRELOAD_ENV)
