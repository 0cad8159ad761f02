"""Handlers for a child's start and end: --child-init, atexit entries (registered at import and in the init), a
buffered log handler (MemoryHandler) that writes only when flushed, and a seed of each child's own.

Everything is written under the directory LIFE_OUT names, in files named for the child's pid.
"""

from __future__ import annotations

import atexit
import logging
import logging.handlers
import os
from pathlib import Path

OUT = Path(os.environ.get("LIFE_OUT", "/nonexistent"))
IMPORTED_IN = os.getpid()  # under --preload: the forkserver's pid
SEED: int | None = None
log = logging.getLogger("life")


def _write(name: str, text: str) -> None:
    with open(OUT / f"{name}-{os.getpid()}", "a") as f:
        f.write(text + "\n")


atexit.register(_write, "atexit-import", "bye")  # registered where the module is imported


def init() -> None:
    """--child-init: a seed of this child's own, a buffered log handler, an atexit entry."""
    global SEED
    SEED = int.from_bytes(os.urandom(4), "big")
    _write("init", str(SEED))
    buffered = logging.handlers.MemoryHandler(capacity=10_000, flushLevel=logging.CRITICAL + 10,
                                              target=logging.FileHandler(OUT / f"log-{os.getpid()}"))
    log.addHandler(buffered)
    log.setLevel(logging.INFO)
    log.propagate = False
    atexit.register(_write, "atexit-init", "bye")


_kept: list[bytearray] = []  # {"keep_mb": N}: memory the child keeps after the job (a cap replaces it then)


def handle(ctx):
    log.info("job %s", ctx.job_id)
    if isinstance(ctx.payload, dict) and ctx.payload.get("keep_mb"):
        block = bytearray(int(ctx.payload["keep_mb"]) * 2**20)
        block[::4096] = b"x" * len(block[::4096])  # touched: it counts
        _kept.append(block)
    return {"pid": os.getpid(), "seed": SEED, "imported_in": IMPORTED_IN}


def broken_init() -> None:
    raise ConnectionError("the database is not there")


NOT_CALLABLE = 42


def init_fails_while_blocked() -> None:
    """--child-init that raises while LIFE_OUT/blocked exists (the test creates it after the first child is up)."""
    if os.path.exists(os.path.join(os.environ["LIFE_OUT"], "blocked")):
        raise ConnectionError("the database is not there yet")
