"""A handler module that configures logging itself at import, as a script would (basicConfig with its own
format). Used by tests/integration/test_child_logging.py."""

from __future__ import annotations

import logging

logging.basicConfig(format="OWN %(levelname)s %(name)s %(message)s", level=logging.INFO)
lib = logging.getLogger("userlib")


def handle(ctx):
    ctx.log("info line", step=2)
    lib.info("library info line")
    return {"ok": True}
