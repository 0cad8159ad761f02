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
