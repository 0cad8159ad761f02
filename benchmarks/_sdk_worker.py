"""Run the official `spooled` SDK worker (SpooledWorker) on one queue until SIGTERM.

    SPOOLED_API_KEY=... python benchmarks/_sdk_worker.py URL QUEUE CONCURRENCY POLL_INTERVAL WORKER_ID

Prints `started` once registered; SIGTERM calls worker.stop() from another thread.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from spooled import SpooledClient  # noqa: E402
from spooled.worker import SpooledWorker  # noqa: E402

from benchmarks.handlers import burn  # noqa: E402


def main() -> int:
    url, queue, concurrency, poll, worker_id = sys.argv[1:6]
    client = SpooledClient(api_key=os.environ["SPOOLED_API_KEY"], base_url=url)
    worker = SpooledWorker(client, queue_name=queue, concurrency=int(concurrency), poll_interval=float(poll),
                           worker_id=worker_id)
    worker.process(burn)
    worker.on("started", lambda data: print("started", flush=True))
    signal.signal(signal.SIGTERM, lambda *a: threading.Thread(target=worker.stop, daemon=True).start())
    worker.start()
    client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
