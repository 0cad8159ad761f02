"""Handlers the benchmarks run, the same function under every runner (daemon, SDK, Pool).

`burn(ctx)`: payload {"ms": d} burns d ms of this *thread's* CPU time and returns {"t0": wall
time the handler started}; payload {"stamp": 1} returns {"t0": ...} at once; {} is a no-op
(returns None, so no result is sent).

Why thread CPU time and not `supervisor.demo_handlers.burn` (process CPU time): under the
SDK's thread pool, process_time() also counts the sibling handler threads, so two threads
would each stop after about d/2 ms of their own work and the SDK would look twice as fast
as it is. In a single-threaded child, thread and process CPU time are the same.
"""

from __future__ import annotations

import time


def burn_ms(ms: float) -> int:
    end = time.thread_time() + ms / 1000.0
    acc = 0
    while time.thread_time() < end:
        for i in range(500):
            acc = (acc * 31 + i) % 1_000_003
    return acc


def burn(ctx):
    t0 = time.time()
    payload = ctx.payload or {}
    ms = payload.get("ms")
    if ms is not None:
        burn_ms(float(ms))
        return {"t0": t0}
    if payload.get("stamp"):
        return {"t0": t0}
    return None
