"""A handler that puts the shared key into its error and its log line, to show neither leaves the daemon."""

import os


def handle_job(ctx):
    key = os.environ["SPOOLED_API_KEY"]
    ctx.log("error", "about to leak", {"key": key})
    raise RuntimeError(f"refused with key {key}")
