"""An SDK worker module whose hooks misbehave as TROUBLE says: `<event>=hang` (sleeps for an hour) or
`<event>=raise`, comma-separated. Every hook call is written first, as a JSON line (event, pid, the SDK record's
fields, exceptions by type and text) to HOOKS_OUT. A payload {"big": N} returns N bytes of result; {"fail": ...}
raises ValueError; {"sleep": s} sleeps first."""

from __future__ import annotations

import dataclasses
import json
import os
import time

from spooled import SpooledClient
from spooled.worker import SpooledWorker

EVENTS = ("started", "stopped", "error", "job:claimed", "job:started", "job:completed", "job:failed", "job:lease_lost")
OUT = os.environ.get("HOOKS_OUT", "/dev/null")
TROUBLE = dict(item.split("=", 1) for item in os.environ.get("TROUBLE", "").split(",") if "=" in item)
KEY = "sk_test_" + "0" * 32  # never used: the daemon makes every API call

worker = SpooledWorker(SpooledClient(api_key=KEY, base_url="http://127.0.0.1:9"), queue_name="trouble")


def shown(value):
    if isinstance(value, Exception):
        return {"type": type(value).__name__, "text": str(value)}
    if isinstance(value, dict) and "pad" in value:
        return {"pad_bytes": len(value["pad"])}
    return value


def hook_for(event: str):
    def hook(data) -> None:
        fields = {f.name: shown(getattr(data, f.name)) for f in dataclasses.fields(data)}
        line = {"event": event, "type": type(data).__name__, "pid": os.getpid(), "data": fields}
        with open(OUT, "a") as f:
            f.write(json.dumps(line) + "\n")
        trouble = TROUBLE.get(event)
        if trouble == "hang":
            time.sleep(3600)
        elif trouble == "raise":
            raise RuntimeError(f"the {event} hook fails on purpose")
    return hook


for _event in EVENTS:
    worker.on(_event, hook_for(_event))


@worker.process
def handle(ctx):
    p = ctx.payload
    time.sleep(p.get("sleep", 0))
    if p.get("fail"):
        raise ValueError("asked to fail")
    if p.get("big"):
        return {"pad": "x" * int(p["big"])}
    return {"pid": os.getpid()}
