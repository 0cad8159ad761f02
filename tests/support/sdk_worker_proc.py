"""The official SDK's SpooledWorker in a process of its own, as an application runs it:
`python tests/support/sdk_worker_proc.py URL` with the key in SPOOLED_API_KEY. SIGTERM stops it gracefully
(the SDK drains and deregisters); every event the worker emits is printed as one line `event: ...`."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

from spooled import SpooledClient
from spooled.worker import SpooledWorker


def main(url: str) -> int:
    client = SpooledClient(api_key=os.environ["SPOOLED_API_KEY"], base_url=url)
    worker = SpooledWorker(client, "sdkw", concurrency=4, poll_interval=0.1, lease_duration=5,
                           heartbeat_fraction=0.2, hostname="sdk-host", worker_id="sdk-worker", shutdown_timeout=5)

    @worker.process
    def handle(ctx):
        if ctx.payload.get("fail"):
            raise RuntimeError("handler exploded")
        if "sleep" in ctx.payload:
            time.sleep(ctx.payload["sleep"])  # outlives two 1 s lease-renewal timers
        return {"double": ctx.payload.get("n", 0) * 2}

    for event in ("started", "error", "stopped"):
        worker.on(event, lambda data, event=event: print(f"event: {event} {data!r}", flush=True))
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=worker.stop).start())
    worker.start()  # blocks until stopped
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
