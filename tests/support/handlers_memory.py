"""Handlers for the memory tests (imported by the daemon's children, or its forkserver with --preload).

At import it builds a "model" of $MEMORY_MODEL_MB MiB (default 0) of real, touched pages, and reads
$MEMORY_VERSION_FILE (if set) so a reload test can see which code a child runs; $MEMORY_IMPORT_SECS makes
the import that much slower.
`handle` payloads: {"do": "model"} reads the model; {"do": "alloc", "mb": N, "secs": S} holds N MiB in the
child for S seconds; {"do": "sub_alloc", "mb": N, "secs": S} starts a subprocess that does that and waits
for it (a tree the cap must count); {"do": "version", "secs": S} says which code ran it, and when it started,
after S seconds (default 0).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

MiB = 2**20
MODEL = b"0123456789abcdef" * (int(os.environ.get("MEMORY_MODEL_MB", "0")) * MiB // 16)
_version_file = os.environ.get("MEMORY_VERSION_FILE")
VERSION = open(_version_file).read().strip() if _version_file else ""
time.sleep(float(os.environ.get("MEMORY_IMPORT_SECS", "0")))  # a model that takes this long to load
if os.environ.get("MEMORY_IMPORT_LOG"):  # every import of this module appended as a pid
    with open(os.environ["MEMORY_IMPORT_LOG"], "a") as _log:
        _log.write(f"{os.getpid()}\n")

ALLOC = "import sys, time; b = bytearray(int(sys.argv[1]) * 2**20); b[::4096] = b'x' * len(b[::4096]); " \
        "print('ready', flush=True); time.sleep(float(sys.argv[2]))"


def hold(mb: int, secs: float) -> None:
    block = bytearray(mb * MiB)
    block[::4096] = b"x" * len(block[::4096])  # touch every page so it counts
    time.sleep(secs)


def handle(ctx):
    p = ctx.payload if isinstance(ctx.payload, dict) else {}
    do = p.get("do")
    if do == "model":
        total = sum(MODEL[i] for i in range(0, len(MODEL), 4096))  # reads a byte of every page
        return {"model_mb": len(MODEL) // MiB, "sum": total, "pid": os.getpid()}
    if do == "alloc":
        hold(int(p["mb"]), float(p.get("secs", 0)))
        return {"pid": os.getpid()}
    if do == "sub_alloc":
        proc = subprocess.Popen([sys.executable, "-c", ALLOC, str(p["mb"]), str(p.get("secs", 30))])
        if p.get("pidfile"):
            with open(p["pidfile"], "w") as f:
                f.write(str(proc.pid))
        return {"code": proc.wait(), "pid": os.getpid()}
    started = time.time()
    time.sleep(float(p.get("secs", 0)))
    return {"version": VERSION, "pid": os.getpid(), "started": started}
