"""Handlers as real children run them: a coroutine handler runs to completion, and `ctx.log` / `ctx.progress`
reach the daemon's log."""

from __future__ import annotations

import pytest
from conftest import (
    wait_for_status,
)

CHAOS = "tests.support.handlers_chaos"


DONE = ("completed", "failed", "deadletter")


# ---------------------------------------------------------------- handlers
@pytest.mark.timeout(60)
def test_coroutine_handler_is_run_to_completion(dev_server, daemon_factory):
    daemon_factory("q-async", handler=f"{CHAOS}:coro", procs=1, worker_id="w-async")
    job_id = dev_server.enqueue("q-async", {"n": 7})
    job = wait_for_status(dev_server, [job_id], DONE, timeout=30)[0]
    assert job["status"] == "completed" and job["result"]["async"] is True and job["result"]["payload"] == {"n": 7}


@pytest.mark.timeout(60)
def test_ctx_log_and_ctx_progress_reach_the_daemons_log(dev_server, daemon_factory):
    d = daemon_factory("q-chatty", handler=f"{CHAOS}:chatty", procs=1, worker_id="w-chatty")
    job_id = dev_server.enqueue("q-chatty", {})
    assert wait_for_status(dev_server, [job_id], DONE, timeout=30)[0]["status"] == "completed"
    started = d.out.wait_for(r'"msg":"resizing started"')
    assert job_id in started.string and '"step":1' in started.string
    half = d.out.wait_for(r'"msg":"progress 50%: half way"')
    assert job_id in half.string and '"progress":50' in half.string
    d.out.wait_for(r'"msg":"progress 100%"')
