"""Schedules through the SDK client against the real dev server: every route, the server's answers to bad
input, a schedule fired by the dev server's sweep on a short clock, and its jobs run by the real daemon."""

from __future__ import annotations

import os
import time

import pytest
from conftest import Daemon, DevServer, wait_for_status, wait_until
from spooled import SpooledClient
from spooled.errors import NotFoundError

pytestmark = pytest.mark.timeout(60)
EVERY_SECOND = "* * * * * *"


@pytest.fixture()
def fast(tmp_path):
    s = DevServer(str(tmp_path / "dev.db"), extra=["--schedule-interval", "0.1"]).start()
    yield s
    s.stop()


def sdk(server: DevServer) -> SpooledClient:
    return SpooledClient(api_key=server.api_key, base_url=server.url)


def test_every_schedule_route_through_the_sdk(dev_server):
    c = sdk(dev_server)
    made = c.schedules.create({"name": "nightly", "cron_expression": "0 3 * * *", "queue_name": "reports",
                               "payload_template": {"report": "daily"}, "priority": 5, "tags": {"team": "data"}})
    assert made.name == "nightly" and made.next_run_at is not None
    assert (made.next_run_at.hour, made.next_run_at.minute, made.next_run_at.second) == (3, 0, 0)
    got = c.schedules.get(made.id)
    assert (got.cron_expression, got.timezone, got.queue_name, got.priority, got.max_retries, got.timeout_seconds,
            got.is_active, got.run_count, got.payload_template) == ("0 3 * * *", "UTC", "reports", 5, 3, 300, True, 0,
                                                                      {"report": "daily"})
    assert [s.id for s in c.schedules.list()] == [made.id]
    updated = c.schedules.update(made.id, {"name": "nightly-2", "cron_expression": "0 0 4 * * *", "priority": 9})
    assert (updated.name, updated.cron_expression, updated.priority) == ("nightly-2", "0 0 4 * * *", 9)
    assert updated.next_run_at is not None and updated.next_run_at.hour == 4
    paused = c.schedules.pause(made.id)
    assert not paused.is_active
    assert c.schedules.resume(made.id).is_active
    fired = c.schedules.trigger(made.id)
    job = c.jobs.get(fired.job_id)
    assert (job.queue_name, job.status, job.priority, job.payload) == ("reports", "pending", 9, {"report": "daily"})
    assert c.schedules.get(made.id).run_count == 1
    assert c.schedules.get_history(made.id) == []  # a manual trigger is no scheduled run, as on the server
    c.schedules.delete(made.id)
    with pytest.raises(NotFoundError):
        c.schedules.get(made.id)
    for method, path in (("GET", "x"), ("PUT", "x"), ("DELETE", "x"), ("POST", "x/pause"), ("POST", "x/resume"),
                         ("POST", "x/trigger"), ("GET", "x/history")):
        r = dev_server.request(method, f"/api/v1/schedules/{path}", json={} if method == "PUT" else None)
        assert r.status_code == 404 and r.json() == {"code": "NOT_FOUND", "message": "Schedule not found"}, path


BASE = {"name": "n", "cron_expression": "0 * * * *", "queue_name": "q", "payload_template": {}}


BAD = "Invalid cron expression: "


@pytest.mark.parametrize("change, status, code, message", [
    ({"cron_expression": "0 0 * * MON"}, 400, "BAD_REQUEST", BAD + "Invalid field value: MON"),
    ({"cron_expression": "@every 5s x y z"}, 400, "BAD_REQUEST", BAD + "Invalid field value: @every"),
    ({"cron_expression": "* * *"}, 400, "VALIDATION_ERROR", None),  # under 9 characters
    ({"cron_expression": "0 0 0 * * * *"}, 400, "BAD_REQUEST", BAD + "expected 5 or 6 fields, got 7"),
    ({"timezone": "Mars/Olympus"}, 400, "VALIDATION_ERROR", None),
    ({"priority": 101}, 400, "VALIDATION_ERROR", None),
    ({"name": ""}, 400, "VALIDATION_ERROR", None),
    ({"cron_expression": 5}, 422, "VALIDATION_ERROR", None),
    ({"name": None}, 422, "VALIDATION_ERROR", None),
    ({"payload_template": "<script>alert(1)</script>"}, 201, None, None),  # any JSON, stored as given
    # the queue a claim would refuse: its jobs could never be worked
    ({"queue_name": "bad queue <b>"}, 400, "VALIDATION_ERROR", "queue_name: Queue name contains invalid characters"),
    ({"queue_name": "q" * 101}, 400, "VALIDATION_ERROR", None),
    ({"queue_name": ".hidden"}, 400, "VALIDATION_ERROR", None),
    ({"queue_name": ""}, 400, "VALIDATION_ERROR", None),
])
def test_bad_schedules_are_answered_as_the_server_answers(dev_server, change, status, code, message):
    body = {k: v for k, v in {**BASE, **change}.items() if v is not None}
    r = dev_server.request("POST", "/api/v1/schedules", json=body)
    assert r.status_code == status, r.text
    if code:
        assert r.json()["code"] == code
    if message:
        assert r.json()["message"] == message
    if status == 201:
        got = dev_server.request("GET", f"/api/v1/schedules/{r.json()['id']}").json()
        assert got["payload_template"] == change["payload_template"]


def test_a_schedule_fires_on_time_and_its_runs_are_recorded(fast):
    c = sdk(fast)
    sid = c.schedules.create({"name": "tick", "cron_expression": EVERY_SECOND, "queue_name": "ticks",
                              "payload_template": {"n": 1}}).id
    runs = wait_until(lambda: (h := c.schedules.get_history(sid)) and len(h) >= 2 and h, timeout=15,
                      what="two scheduled runs")
    assert all(r.status == "completed" and r.job_id for r in runs)
    assert {c.jobs.get(r.job_id).queue_name for r in runs} == {"ticks"}
    assert runs[0].started_at > runs[1].started_at  # newest first
    c.schedules.pause(sid)
    count = c.schedules.get(sid).run_count
    assert count >= 2
    fast.request("POST", "/api/v1/queues/ticks/pause")  # nothing else moves while we look
    assert c.schedules.get(sid).run_count == count


def test_a_scheduled_job_runs_under_the_real_daemon(fast):
    c = sdk(fast)
    sid = c.schedules.create({"name": "work", "cron_expression": EVERY_SECOND, "queue_name": "cron-work",
                              "payload_template": {"do": "echo", "from": "schedule"}}).id
    daemon = Daemon(fast, "cron-work", procs=1).start()
    try:
        run = wait_until(lambda: (h := c.schedules.get_history(sid)) and h[-1], timeout=15, what="a run")
        (job,) = wait_for_status(fast, [run.job_id])
        assert job["result"]["echo"] == {"do": "echo", "from": "schedule"}
    finally:
        c.schedules.pause(sid)
        daemon.stop()


def cpu_seconds(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_an_idle_server_with_schedules_costs_under_one_percent_of_a_core(dev_server):
    c = sdk(dev_server)
    for i in range(20):  # active, none due: every tick reads the earliest next run
        c.schedules.create({"name": f"s{i}", "cron_expression": "0 0 1 1 *", "queue_name": "q", "payload_template": {}})
    assert dev_server.proc is not None
    pid = dev_server.proc.pid
    before, started = cpu_seconds(pid), time.monotonic()
    wait_until(lambda: time.monotonic() - started >= 5.0, timeout=10, what="five idle seconds")
    spent = cpu_seconds(pid) - before
    assert spent / (time.monotonic() - started) < 0.01, f"{spent:.3f} s of CPU in 5 s"
