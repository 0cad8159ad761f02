"""Cron expressions as the Spooled server parses them, when one fires next, and the schedules' sweep, each
a decision with `now` given: a due schedule fires once (a missed run too), paused ones never."""

from __future__ import annotations

import calendar
import json
import time

import pytest

from supervisor.devserver import cron, schedules_store
from supervisor.devserver.store import Store

pytestmark = pytest.mark.timeout(30)


def at(text: str) -> float:
    return float(calendar.timegm(time.strptime(text, "%Y-%m-%d %H:%M:%S")))


def shown(t: float | None) -> str | None:
    return None if t is None else time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t))


@pytest.mark.parametrize("expression, after, fires", [
    ("0 * * * * *", "2024-01-01 12:30:45", "2024-01-01 12:31:00"),
    ("0 */5 * * * *", "2024-01-01 12:03:00", "2024-01-01 12:05:00"),
    ("*/5 * * * *", "2024-01-01 12:03:00", "2024-01-01 12:05:00"),  # 5 fields: seconds are 0
    ("0 0 9-17 * * *", "2024-01-01 17:30:00", "2024-01-02 09:00:00"),
    ("0 0 0 * * 1,3,5", "2024-01-01 00:00:00", "2024-01-03 00:00:00"),  # 2024-01-01 is a Monday
    ("30 15 10 * * 0", "2024-01-01 00:00:00", "2024-01-07 10:15:30"),  # Sunday is 0
    ("0 9 1 1 *", "2024-01-02 00:00:00", "2025-01-01 09:00:00"),
    ("0 0 */10 * *", "2024-01-01 00:00:00", "2024-01-10 00:00:00"),  # */N: values divisible by N
    ("+5 * * * * *", "2024-01-01 00:00:00", "2024-01-01 00:00:05"),  # the server's integer parse takes "+5"
    ("* * * 2 * *", "2024-01-01 23:59:30", "2024-01-02 00:00:31"),  # the server's minute step, kept
    ("0 0 0 30 2 *", "2024-01-01 00:00:00", None),  # never: the server gives up, so no next run
])
def test_next_fire_as_the_server_computes_it(expression, after, fires):
    assert shown(cron.next_after(cron.parse(expression), at(after))) == fires


@pytest.mark.parametrize("expression, why", [
    ("* * *", "expected 5 or 6 fields, got 3"), ("* * * * * * *", "expected 5 or 6 fields, got 7"),
    ("@daily", "expected 5 or 6 fields, got 1"), ("0 60 * * * *", "Value out of bounds: 60"),
    ("0 * 25 * * *", "Value out of bounds: 25"), ("0 0 0 0 * *", "Value out of bounds: 0"),
    ("0 0 0 * 13 *", "Value out of bounds: 13"), ("0 0 0 * * 7", "Value out of bounds: 7"),
    ("0 0 * * MON", "Invalid field value: MON"), ("0 0 1 JAN *", "Invalid field value: JAN"),
    ("0 0 ? * *", "Invalid field value: ?"), ("0 0 L * *", "Invalid field value: L"),
    ("1-3,5 * * * *", "Invalid range end: 3,5"), ("0 0 1-10/2 * * *", "Invalid range end: 10/2"),
    ("5-1 * * * *", "Range out of bounds: 5-1"), ("*/0 * * * *", "Step value cannot be 0 - would cause infinite loop"),
    ("*/60 * * * * *", "Step value 60 exceeds maximum 59 for this field"), ("1/5 * * * *", "Invalid field value: 1/5"),
    ("1,x * * * *", "Invalid list value in: 1,x"), ("1,99 * * * *", "List value out of bounds: 99"),
    ("256 * * * *", "Invalid field value: 256"), ("-5 * * * *", "Invalid range start: "),
])
def test_what_the_server_refuses_is_refused(expression, why):
    with pytest.raises(cron.CronError) as e:
        cron.parse(expression)
    assert str(e.value) == why


@pytest.mark.parametrize("zone, ok", [("UTC", True), ("Europe/Berlin", True), ("Etc/GMT+5", True),
                                      ("+05:30", True), ("-08:00", True), ("Europe/Vienna", False),
                                      ("utc", False), ("+0530", False), ("", False)])
def test_the_time_zones_the_server_accepts(zone, ok):
    assert cron.timezone_ok(zone) is ok


@pytest.fixture()
def store():
    s = Store(":memory:")
    s.bootstrap("sp_test_cron")
    schedules_store.ensure_tables(s)
    yield s
    s.close()


def make(store, expression: str, now: float, **extra) -> str:
    org = store.org_for_key("sp_test_cron")
    fields = {"name": "n", "cron_expression": expression, "queue_name": "reports",
              "payload_template": json.dumps({"kind": "daily"}), "priority": 7, "max_retries": 1,
              "timeout_seconds": 60, "tags": json.dumps(["cron"]), **extra}
    nxt = cron.next_after(cron.parse(expression), now)
    return schedules_store.create(store, org, fields, nxt, now)["id"]


def test_a_due_schedule_fires_once_with_the_job_it_describes(store):
    now = at("2026-01-01 10:00:30")
    sid = make(store, "0 * * * * *", now)
    assert schedules_store.fire_due(store, now) == []  # not due until 10:01:00
    made = schedules_store.fire_due(store, at("2026-01-01 10:01:00"))
    assert len(made) == 1
    org, jid, queue, priority = made[0]
    job = store.get_job(org, jid)
    assert (job["queue_name"], job["status"], job["priority"], job["max_retries"], job["timeout_seconds"]) == (
        "reports", "pending", 7, 1, 60)
    raw = store.job_raw(org, jid)
    assert json.loads(raw["payload"]) == {"kind": "daily"} and json.loads(raw["tags"]) == ["cron"]
    s = schedules_store.get(store, org, sid)
    assert s["run_count"] == 1 and s["last_run_at"].startswith("2026-01-01T10:01:00")
    assert s["next_run_at"].startswith("2026-01-01T10:02:00")
    (run,) = schedules_store.history(store, org, sid, 50)
    assert run["status"] == "completed" and run["job_id"] == jid
    assert schedules_store.fire_due(store, at("2026-01-01 10:01:30")) == []


def test_a_missed_fire_runs_once_then_from_now(store):
    sid = make(store, "0 * * * * *", at("2026-01-01 10:00:30"))
    made = schedules_store.fire_due(store, at("2026-01-01 12:34:10"))  # 154 fires missed
    assert len(made) == 1
    org = made[0][0]
    assert schedules_store.get(store, org, sid)["next_run_at"].startswith("2026-01-01T12:35:00")


def test_a_paused_schedule_never_fires_and_resumes_from_now(store):
    sid = make(store, "0 0 * * * *", at("2026-01-01 10:00:30"))
    org = store.org_for_key("sp_test_cron")
    schedules_store.set_active(store, org, sid, False, at("2026-01-01 10:10:00"))
    assert schedules_store.fire_due(store, at("2026-01-01 15:00:00")) == []
    resumed = schedules_store.set_active(store, org, sid, True, at("2026-01-01 15:00:01"))
    assert resumed["is_active"] and resumed["next_run_at"].startswith("2026-01-01T16:00:00")
