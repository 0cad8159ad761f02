"""The daemon's `ready` line comes once it is registered with a child up (the first claim can be made): before
any job's line when jobs wait at start, even while other children still start, and with an empty queue too."""

from __future__ import annotations

import signal

import pytest
from conftest import wait_for_status

pytestmark = pytest.mark.timeout(60)

HANDLER = "tests.support.handlers_slow_start:handle"


def test_ready_comes_before_the_first_job_even_while_a_child_still_starts(dev_server, daemon_factory, tmp_path):
    ids = [dev_server.enqueue("ready-first", {}) for _ in range(3)]
    d = daemon_factory("ready-first", handler=HANDLER, procs=2, env={"SLOW_START_DIR": str(tmp_path)})
    wait_for_status(dev_server, ids)
    d.wait_events("job completed", count=3)
    msgs = [r.get("msg") for r in d.records()]
    assert msgs.count("ready") == 1
    assert msgs.index("registered") < msgs.index("ready") < msgs.index("job completed")
    (ready,) = d.events("ready")
    assert (ready["children"], ready["procs"]) == (1, 2)  # the second child sleeps through its import
    (every,) = d.wait_events("every child is up")
    assert every["children"] == 2
    d.signal(signal.SIGTERM)
    assert d.wait() == 0
    assert [r.get("msg") for r in d.records()].count("ready") == 1  # not again once every child is up


def test_ready_is_logged_with_an_empty_queue(dev_server, daemon_factory):
    d = daemon_factory("ready-empty", handler="supervisor.demo_handlers:noop", procs=2)
    (ready,) = d.wait_events("ready")
    assert ready["procs"] == 2 and 1 <= ready["children"] <= 2
    d.wait_ready()  # and `every child is up` after it, when the second came later
    assert not d.events("job completed")
    d.signal(signal.SIGTERM)
    assert d.wait() == 0
