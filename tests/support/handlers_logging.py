"""Handlers that log every way a handler can: `ctx.log` in both forms, a library's `logging` logger, and a
line written while the module is imported. Used by tests/integration/test_child_logging.py."""

from __future__ import annotations

import logging

lib = logging.getLogger("userlib")
lib.warning("imported the handler module")  # before any job: no job_id


def handle(ctx):
    ctx.log("debug", "sdk debug line", {"n": 1})
    ctx.log("info line", step=2)
    lib.info("library info line")
    lib.warning("library warning line")
    logging.getLogger().error("root error line")
    return {"ok": True}
