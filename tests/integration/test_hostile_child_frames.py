"""A handler that writes on its child's socket to the daemon (it can: the socket is open in its process):
what it writes is no frame, so the parent kills that child, fails its job saying why, starts a new child and
goes on; the other jobs are untouched."""

from __future__ import annotations

import pytest
from conftest import wait_for_status

pytestmark = pytest.mark.timeout(90)


@pytest.mark.parametrize("what", ["garbage", "huge", "large"])
def test_a_handler_that_writes_no_frame_fails_its_job_and_the_daemon_goes_on(dev_server, daemon_factory, what):
    queue = f"hostile-frames-{what}"
    d = daemon_factory(queue, handler="tests.support.handlers_socket:handle", procs=2).wait_ready()
    bad = dev_server.enqueue(queue, {"write": what}, max_retries=0)
    (failed,) = wait_for_status(dev_server, [bad], statuses=("deadletter", "failed"))
    assert failed["last_error"].startswith("ChildProtocolError: the child process running this job"), failed
    assert "it was killed" in failed["last_error"]
    good = [dev_server.enqueue(queue, {"n": i}) for i in range(6)]
    done = wait_for_status(dev_server, good)
    assert all(j["result"] == {"ok": True} and j["retry_count"] == 0 for j in done)
    (line,) = d.wait_events("a child sent what the parent cannot read; killing it")
    assert line["job_id"] == bad and ("not JSON" in line["error"] if what == "garbage" else "over the" in line["error"])
    d.wait_events("child exited; starting a new one")
    assert d.proc.poll() is None
