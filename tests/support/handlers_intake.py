"""A handler for the claim-ahead tests (imported by the daemon's children as tests.support.handlers_intake).

`record`: payload {"log": PATH, "secs": S}: append "<job id> <retry_count>" to PATH (one write, so
lines from several children never mix), then sleep S seconds. The file tells which deliveries of a
job ever reached a child, which the server's record alone cannot (a stale copy's result is refused).
"""

from __future__ import annotations

import os
import time


def record(ctx):
    p = ctx.payload if isinstance(ctx.payload, dict) else {}
    fd = os.open(p["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, f"{ctx.job_id} {ctx.retry_count}\n".encode())
    finally:
        os.close(fd)
    time.sleep(float(p.get("secs", 0)))
    return {"retry_count": ctx.retry_count, "pid": os.getpid()}
