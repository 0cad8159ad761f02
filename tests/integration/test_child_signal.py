"""Stopping a child is cooperative first: `ctx.signal` (the official SDK's abort signal) is set and the
handler's `finally` blocks run, then the child dies of SIGTERM as before (JobContext.signal is
a real event)."""

from __future__ import annotations

import pytest
from conftest import wait_for_status, wait_until

pytestmark = pytest.mark.timeout(60)


def test_a_timed_out_job_sees_its_signal_and_its_finally_blocks_run(dev_server, daemon_factory, tmp_path):
    out = tmp_path / "stopped.txt"
    job = dev_server.enqueue("sig", {"out": str(out)}, timeout_seconds=1, max_retries=0)
    d = daemon_factory("sig", handler="tests.support.handlers_signal:hang_and_record", procs=1)
    record = wait_for_status(dev_server, [job], statuses=("deadletter", "failed"), timeout=30)[0]
    assert "JobTimeout" in record["last_error"]
    text = wait_until(lambda: out.exists() and out.read_text(), timeout=10, what="the handler's finally block")
    assert text == "finally ran; signal set=True; watcher saw it=True"
    restarted = wait_until(lambda: d.events("child exited; starting a new one"), timeout=10, what="the replacement")
    assert "killed by SIGTERM" in restarted[0]["cause"]  # it still dies of the SIGTERM, as before


def test_a_handler_modules_own_sigterm_handler_is_replaced_by_the_daemons(dev_server, daemon_factory, tmp_path):
    """docs/handlers.md#signals: a module that installs signal.signal(SIGTERM, ...) at import gets the daemon's
    stop all the same (ctx.signal, JobStopped, its finally block); its own shutdown code never runs."""
    flag = tmp_path / "own-handler"
    job = dev_server.enqueue("own-sig", {}, timeout_seconds=1, max_retries=0)
    daemon_factory("own-sig", handler="tests.support.handlers_own_sigterm:handle", procs=1,
                   env={"OWN_SIGTERM_FLAG": str(flag)})
    record = wait_for_status(dev_server, [job], statuses=("deadletter", "failed"), timeout=30)[0]
    assert "JobTimeout" in record["last_error"]
    wait_until(lambda: (tmp_path / "own-handler.finally").exists(), timeout=10, what="the handler's finally block")
    assert not flag.exists()
