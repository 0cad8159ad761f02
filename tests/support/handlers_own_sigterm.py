"""A handler module that installs its own SIGTERM handler at import, as a standalone worker script would
(tests/integration/test_child_signal.py): the daemon's replaces it, so its shutdown code never runs."""

from __future__ import annotations

import os
import signal
import time


def _shutdown(signum, frame):
    with open(os.environ["OWN_SIGTERM_FLAG"], "w") as f:
        f.write("the module's own handler ran")


signal.signal(signal.SIGTERM, _shutdown)


def handle(ctx):
    try:
        while not ctx.signal.is_set():
            time.sleep(0.05)
        return {"stopped": True}
    finally:
        with open(os.environ["OWN_SIGTERM_FLAG"] + ".finally", "w") as f:
            f.write("finally ran")
