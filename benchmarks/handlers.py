"""Handlers the benchmarks run, the same function under every runner (daemon, SDK, Pool).

`burn(ctx)`: payload {"ms": d} burns d ms of this *thread's* CPU time and returns {"t0": wall
time the handler started}; payload {"stamp": 1} returns {"t0": ...} at once; {"sleep_s": s} sleeps s
seconds; {} is a no-op
(returns None, so no result is sent). With "trace": path in the payload, the handler also appends
`pid start end` (time.monotonic(), the same clock in every process) to that file: the gaps between a
child's jobs are read from it.

The burn is `supervisor.demo_handlers.burn_cpu`, which counts thread CPU time: under the SDK's
thread pool, process CPU time would also count the sibling handler threads, so two threads would
each stop after about d/2 ms of their own work and the SDK would look twice as fast as it is.
In a single-threaded child, thread and process CPU time are the same.
"""

from __future__ import annotations

import os
import time

from supervisor.demo_handlers import burn_cpu as burn_ms  # noqa: F401  (run.py's Pool runner uses it)

_traces: dict[str, int] = {}  # trace path -> this process's descriptor for it


def burn(ctx):
    payload = ctx.payload or {}
    trace = payload.get("trace") if isinstance(payload, dict) else None
    if not trace:
        return _burn(payload)
    start = time.monotonic()
    try:
        return _burn(payload)
    finally:
        fd = _traces.get(trace)
        if fd is None:
            fd = _traces[trace] = os.open(trace, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        os.write(fd, f"{os.getpid()} {start:.6f} {time.monotonic():.6f}\n".encode())


def _burn(payload: dict):
    t0 = time.time()
    ms = payload.get("ms")
    if ms is not None:
        burn_ms(float(ms))
        return {"t0": t0}
    if payload.get("stamp"):
        return {"t0": t0}
    if payload.get("sleep_s") is not None:  # wall-clock jobs: the cores do not limit a fleet run
        time.sleep(float(payload["sleep_s"]))
        return {"t0": t0}
    return None
