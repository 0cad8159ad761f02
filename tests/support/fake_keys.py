"""Made-up keys shaped like a production one (`sp_live_...`), for the tests that check such a key is never
adopted or echoed. They are built at run time, so no key-shaped literal is committed for a scanner to flag."""

from __future__ import annotations


def live_shaped(body: str) -> str:
    """A key that looks like a production key and ends in `body`."""
    return "sp_" + "live_" + body
