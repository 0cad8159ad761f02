"""An SDK worker module with a hook on every event, each writing what it got (the event, the SDK record's type
and fields, the pid it ran in) as a JSON line to HOOKS_OUT, and a `job:started` hook that always raises.

`worker` is a SpooledWorker; `async_worker` an AsyncSpooledWorker with the same hooks (and an async one).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import time

from spooled import AsyncSpooledClient, SpooledClient
from spooled.worker import AsyncSpooledWorker, SpooledWorker

EVENTS = ("started", "stopped", "error", "job:claimed", "job:started", "job:completed", "job:failed", "job:lease_lost")
OUT = os.environ.get("HOOKS_OUT", "/dev/null")
KEY = "sk_test_" + "0" * 32  # never used: the daemon makes every API call

worker = SpooledWorker(SpooledClient(api_key=KEY, base_url="http://127.0.0.1:9"), queue_name="hooks")
async_worker = AsyncSpooledWorker(AsyncSpooledClient(api_key=KEY, base_url="http://127.0.0.1:9"),
                                  queue_name="hooks-async")


def record(event: str):
    def hook(data) -> None:
        fields = {f.name: getattr(data, f.name) for f in dataclasses.fields(data)}
        line = {"event": event, "type": type(data).__name__, "pid": os.getpid(),
                "data": {k: (type(v).__name__ if isinstance(v, Exception) else v) for k, v in fields.items()}}
        with open(OUT, "a") as f:
            f.write(json.dumps(line) + "\n")
    return hook


def broken_hook(data) -> None:
    raise RuntimeError("this hook always fails")


for w in (worker, async_worker):
    for event in EVENTS:
        w.on(event, record(event))
    w.on("job:started", broken_hook)


def work(ctx) -> dict:
    if ctx.payload.get("fail"):
        raise ValueError("asked to fail")
    time.sleep(ctx.payload.get("sleep", 0))
    return {"pid": os.getpid(), "n": ctx.payload.get("n")}


@worker.process
def handle(ctx):
    return work(ctx)


@async_worker.process
async def handle_async(ctx):
    await asyncio.sleep(0)
    return work(ctx)
