"""A running daemon whose worker id is taken over by a newer instance yields, and heartbeat
answers of the documented shape are followed.

The takeover is staged the way it happens: a newer daemon's heartbeat lands on the row, carrying its
own instance id and a later start time. The older daemon sees it when it reads the row back, stops
claiming, finishes what it holds, exits 6 and does not deregister (that would hand the newer daemon's
jobs back to the queue).
"""

from __future__ import annotations

import pytest
from conftest import DevServer, wait_for_status, wait_until

from supervisor import exitcodes
from supervisor.client.rest import Secret, SpooledAPI
from supervisor.config import Config
from supervisor.parent.membership import Membership

pytestmark = pytest.mark.timeout(150)


def test_a_daemon_whose_row_is_taken_over_drains_exits_6_and_leaves_the_row_alone(tmp_path):
    server = DevServer(str(tmp_path / "dev.db"), extra=["--heartbeat-interval", "1"]).start()
    from conftest import Daemon

    d = Daemon(server, "shared", procs=1, worker_id="same-id").start()
    try:
        d.wait_ready(timeout=30)
        job = server.enqueue("shared", {"do": "sleep", "secs": 2})
        wait_until(lambda: server.job(job)["status"] == "processing", timeout=15, what="the job running")
        newer = {"instance_id": "f" * 16, "host": "elsewhere", "pid": 4242, "started_at": "2999-01-01T00:00:00Z"}

        def newer_heartbeat():
            r = server.request("POST", "/api/v1/workers/same-id/heartbeat",
                               json={"current_jobs": 0, "status": "healthy", "metadata": newer})
            return r.status_code == 200 and any(
                "is in use by another live daemon (instance " + "f" * 16 + " on host elsewhere, pid 4242" in line
                and "this older daemon yields" in line for line in d.out.lines)

        # The row is read back about every 50 s (membership.ROW_CHECK_EVERY): found within a minute.
        wait_until(newer_heartbeat, timeout=65, interval=0.3, what="the daemon to notice the newer instance")
        assert d.wait(30) == exitcodes.WORKER_ID_IN_USE
        assert wait_for_status(server, [job], timeout=5)[0]["status"] == "completed"  # what it held, it finished
        assert not d.events("deregistered")
        row = server.worker("same-id")
        assert row["status"] != "offline" and row["metadata"]["instance_id"] == "f" * 16
    finally:
        d.stop()
        server.stop()


def _membership(submitted: list) -> Membership:
    cfg = Config(api_url="http://127.0.0.1:9", api_key=Secret("sp_test_0123456789"), queues=("q",), handler="m:f",
                 worker_id="w", hostname="h", procs=2)
    client = SpooledAPI(cfg.api_url, cfg.api_key)
    return Membership(cfg, client, lambda call, followup, first=False: submitted.append((call, followup)))


def test_a_heartbeat_answer_with_next_heartbeat_seconds_sets_the_interval():
    sent: list = []
    m = _membership(sent)
    m.on_register({"heartbeat_interval_secs": 10}, None, now=100.0)
    assert m.heartbeat_interval == 10.0
    m.send_heartbeat(100.0, current_jobs=0, status="healthy", procs=1, busy=0, children=1, cpu=0.0, mem=0.0)
    m.on_heartbeat({"acknowledged": True, "next_heartbeat_seconds": 3, "commands": []}, None, now=100.2)
    assert m.heartbeat_interval == 3.0 and m.next_heartbeat_at == pytest.approx(103.2)
    m.on_heartbeat({"acknowledged": True, "next_heartbeat_seconds": 100000}, None, now=110.0)
    assert m.heartbeat_interval == 300.0  # bounded
    m.on_heartbeat(None, None, now=111.0)  # the real server's empty 200 changes nothing
    assert m.heartbeat_interval == 300.0


def test_unknown_heartbeat_commands_are_logged_once_and_never_fail(caplog):
    sent: list = []
    m = _membership(sent)
    m.on_register({}, None, now=0.0)
    for t in (1.0, 2.0):
        assert m.on_heartbeat({"acknowledged": True, "commands": [{"type": "reboot"}, "weird"]}, None, now=t) == []
    logged = [r for r in caplog.records if "does not know" in r.getMessage()]
    assert len(logged) == 2 and m.commands_seen == {"reboot", "weird"}


def test_a_heartbeat_answer_that_says_should_drain_asks_for_a_drain():
    from supervisor.parent.facts import DrainAsked

    m = _membership([])
    m.on_register({}, None, now=0.0)
    assert m.on_heartbeat({"acknowledged": True, "should_drain": False}, None, now=1.0) == []
    assert m.on_heartbeat({"acknowledged": True, "should_drain": True}, None, now=2.0) == [DrainAsked()]
