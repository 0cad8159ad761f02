"""A model-serving handler for benchmarks/memory.py: a "model" of $BENCH_MODEL_MB MiB (default 150) of
pseudo-random bytes is built when the module is imported, as loading weights would; `infer(ctx)` does a
fixed amount of CPU work that reads it: a SHA-256 over payload {"mb": n, "at": i} MiB of it, from the
i-th MiB on (wrapping). The same function runs under the daemon and under multiprocessing.Pool."""

from __future__ import annotations

import hashlib
import os
import random

MiB = 2**20
MODEL = random.Random(25).randbytes(int(os.environ.get("BENCH_MODEL_MB", "150")) * MiB)
_ZEROS = bytes(MiB)  # what a model-less job hashes, MiB by MiB: it allocates nothing per job


def digest(mb: int, at: int) -> str:
    """SHA-256 of `mb` MiB of the model from its `at`-th MiB (wrapping); a constant if there is no model."""
    if not MODEL:
        h = hashlib.sha256()
        for _ in range(mb):
            h.update(_ZEROS)
        return h.hexdigest()
    size = len(MODEL)
    start = (at * MiB) % size
    view = memoryview(MODEL)
    h = hashlib.sha256()
    left = mb * MiB
    while left:
        chunk = view[start:start + left]
        h.update(chunk)
        left -= len(chunk)
        start = 0
    return h.hexdigest()


def infer(ctx):
    payload = ctx.payload or {}
    return {"sha": digest(int(payload.get("mb", 8)), int(payload.get("at", 0)))}
