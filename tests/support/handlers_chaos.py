"""Extra handlers for the resilience tests (imported by the daemon's children as tests.support.handlers_chaos).

`flaky_boot`: importing this module fails while the file named by $CHAOS_BOOT_FAIL_FLAG exists,
so a test can make every *new* child die while starting. `slow_first` (CPU) and `sleep_first`: long only
on the first delivery. `leak`: keeps what it allocates in a module global, so the child's RSS stays high
after the job (for --max-memory-per-child). `coro`: a coroutine handler. `chatty`: ctx.log and ctx.progress.
$CHAOS_BOOT_LOG: every child appends its start time (the import) to that file.
"""

from __future__ import annotations

import os
import time

from supervisor.demo_handlers import burn_cpu, misbehave

if os.environ.get("CHAOS_BOOT_LOG"):  # every child's import (its start) appended as a Unix time
    with open(os.environ["CHAOS_BOOT_LOG"], "a") as _log:
        _log.write(f"{time.time()}\n")

_FLAG = os.environ.get("CHAOS_BOOT_FAIL_FLAG")
if _FLAG and os.path.exists(_FLAG):
    raise RuntimeError(f"boot failure requested by {_FLAG}")

_KEPT: list[bytearray] = []


def handle(ctx):
    """`misbehave`, plus {"do": "leak", "mb": N}: allocate N MiB, touch it, keep it for the child's life."""
    p = ctx.payload if isinstance(ctx.payload, dict) else {}
    if p.get("do") == "leak":
        block = bytearray(int(p.get("mb", 64)) * 2**20)
        for i in range(0, len(block), 4096):  # touch every page so it counts in RSS
            block[i] = 1
        _KEPT.append(block)
        return {"kept_mb": sum(len(b) for b in _KEPT) // 2**20, "pid": os.getpid()}
    if p.get("do") == "sleep_first":  # a long sleep on the first delivery only (a copy to lose the lease of)
        if ctx.retry_count == 0:
            time.sleep(float(p.get("secs", 30)))
        return {"retry_count": ctx.retry_count, "pid": os.getpid(), "lease_id": ctx.lease_id}
    if p.get("do") == "slow_first":  # long CPU work on the first delivery only
        if ctx.retry_count == 0:
            burn_cpu(float(p.get("ms", 30000)))
        return {"retry_count": ctx.retry_count, "pid": os.getpid()}
    return misbehave(ctx)


async def coro(ctx):
    """A coroutine handler: awaited to completion in the child."""
    import asyncio

    await asyncio.sleep(0.01)
    return {"async": True, "payload": ctx.payload, "pid": os.getpid()}


def chatty(ctx):
    """Uses the SDK's ctx.log and ctx.progress, then returns."""
    ctx.log("resizing started", step=1)
    ctx.progress(50, "half way")
    ctx.progress(100)
    return {"logged": True}
