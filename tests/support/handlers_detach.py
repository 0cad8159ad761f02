"""Handlers that start processes and detach them the everyday ways, for the tests of what a job started.

At import, $DETACH_IMPORT_PIDFILE (if set) makes the module start a `sleep` in a session of its own and
write its pid there (what a module's import starts: a child's start-up, or the forkserver's with --preload).
`detach` payload: {"how": "amp" | "nohup" | "setsid" | "double_fork" | "double_fork_setsid", "mb": N,
"pidfile": PATH, "hold": S}: starts a process holding N MiB (touched) that writes its pid to PATH and
sleeps, detached that way; then the job waits S seconds (0: returns at once)."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time

HOG = ("import os, sys, time; b = bytearray(int(sys.argv[1]) * 2**20); b[::4096] = b'x' * len(b[::4096]); "
       "open(sys.argv[2] + '.tmp', 'w').write(str(os.getpid())); os.rename(sys.argv[2] + '.tmp', sys.argv[2]); "
       "time.sleep(600)")

_import_pidfile = os.environ.get("DETACH_IMPORT_PIDFILE")
if _import_pidfile:
    subprocess.Popen([sys.executable, "-c", HOG, "1", _import_pidfile], start_new_session=True,
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _hog_in_this_process(mb: int, pidfile: str) -> None:
    block = bytearray(mb * 2**20)
    block[::4096] = b"x" * len(block[::4096])
    with open(pidfile + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.rename(pidfile + ".tmp", pidfile)
    time.sleep(600)


def detach(ctx):
    p = ctx.payload
    how, mb, pidfile = p["how"], int(p.get("mb", 1)), p["pidfile"]
    cmd = f"{shlex.quote(sys.executable)} -c {shlex.quote(HOG)} {mb} {shlex.quote(pidfile)}"
    if how == "amp":
        os.system(f"{cmd} &")
    elif how == "nohup":
        os.system(f"nohup {cmd} >/dev/null 2>&1 &")
    elif how == "setsid":
        os.system(f"setsid {cmd} >/dev/null 2>&1 &")
    elif how in ("double_fork", "double_fork_setsid"):
        first = os.fork()
        if first == 0:
            try:
                if how == "double_fork_setsid":
                    os.setsid()
                if os.fork() == 0:
                    _hog_in_this_process(mb, pidfile)
            finally:
                os._exit(0)
        os.waitpid(first, 0)
    deadline = time.monotonic() + 20
    while not os.path.exists(pidfile) and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(float(p.get("hold", 0)))
    return {"pid": int(open(pidfile).read())}


def tracked(ctx):
    """Uses shared memory, which needs multiprocessing's resource tracker (started lazily when none was passed
    down); returns which tracker it used."""
    from multiprocessing import resource_tracker, shared_memory

    block = shared_memory.SharedMemory(create=True, size=1024)
    try:
        block.buf[0] = 7
    finally:
        block.close()
        block.unlink()
    tracker = resource_tracker._resource_tracker
    return {"tracker": tracker._pid or tracker._fd}  # the child's own tracker, or the one its forkserver passed
