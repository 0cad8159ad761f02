"""Handlers for tests/integration/test_host_safety.py (imported by the daemon's children as
tests.support.handlers_hosts).

Every process they start carries HOSTS_TEST_MARKER=<payload marker> in its environment, so a test finds
them all by scanning /proc/*/environ, whatever became of their parents.
"""

from __future__ import annotations

import os
import subprocess
import time


def _env(marker: str) -> dict:
    return dict(os.environ, HOSTS_TEST_MARKER=marker)


def start_sleeps(marker: str, escape: bool = False) -> None:
    """One plain `sleep`, one double-forked into the background (it stays in the child's process group),
    and with `escape` one double-forked into a new session (it leaves the group)."""
    subprocess.Popen(["sleep", "300"], env=_env(marker))
    subprocess.run(["sh", "-c", "(sleep 300 &)"], env=_env(marker), check=True)
    if escape:
        subprocess.run(["sh", "-c", "(sleep 300 &)"], env=_env(marker), check=True, start_new_session=True)


def handle(ctx):
    """`do`: `hang` (start the sleeps, then hang), `return` (start them and return), `quick` (just return)."""
    do = ctx.payload.get("do")
    if do in ("hang", "return"):
        start_sleeps(ctx.payload["marker"], bool(ctx.payload.get("escape")))
    if do == "hang":
        time.sleep(300)
    if do == "quick":
        time.sleep(float(ctx.payload.get("secs", 0)))
    return {"pid": os.getpid(), "retry_count": ctx.retry_count}
