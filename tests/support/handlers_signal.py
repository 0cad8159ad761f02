"""A handler that hangs past its timeout and records, on the way out, what the daemon's stop told it."""

from __future__ import annotations

import threading
import time
from pathlib import Path


def hang_and_record(ctx):
    out = Path(ctx.payload["out"])
    seen = threading.Event()
    watcher = threading.Thread(target=lambda: seen.set() if ctx.signal.wait(60) else None, daemon=True)
    watcher.start()
    try:
        while True:
            time.sleep(0.05)
    finally:  # runs because the stop raises JobStopped in this frame
        watcher.join(2)
        out.write_text(f"finally ran; signal set={ctx.signal.is_set()}; watcher saw it={seen.is_set()}")
