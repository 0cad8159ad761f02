"""A handler whose first importing child comes up at once and every later one only after SLOW_START_SECS
(default 4): the first child may run jobs while the others still start. SLOW_START_DIR holds the marker."""

from __future__ import annotations

import os
import time

_marker = os.path.join(os.environ.get("SLOW_START_DIR", "/nonexistent"), "first")
try:
    os.close(os.open(_marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
except FileExistsError:
    time.sleep(float(os.environ.get("SLOW_START_SECS", "4")))
except OSError:
    pass


def handle(ctx) -> dict:
    return {"pid": os.getpid()}
