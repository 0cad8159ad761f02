"""Values the dev server once took loosely, answered as the real server does: a queue's settings must be a JSON
object (and a database holding another value is repaired), date-times are RFC 3339 with an offset and written
back valid for any year 0000-9999 (before 1970 too), a `tag` filter is at most 64 characters, and a config
body's `queue_name` is a string."""

from __future__ import annotations

import re
import sqlite3

import pytest
from conftest import DevServer
from spooled import SpooledClient

pytestmark = pytest.mark.timeout(60)
RFC3339_OUT = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z")


@pytest.mark.parametrize("settings", ["x", [1, 2], 0, False, 1.5])
def test_settings_that_are_not_an_object_are_refused_and_pause_still_works(dev_server, settings):
    s = dev_server
    r = s.request("PUT", "/api/v1/queues/q/config", json={"settings": settings})
    assert r.status_code == 422, r.text
    body = r.json()
    assert body["code"] == "VALIDATION_ERROR" and body["details"][0] == {
        "field": "settings", "message": body["details"][0]["message"], "code": "invalid_type"}
    assert s.request("PUT", "/api/v1/queues/q/config", json={"max_retries": 2}).status_code == 200
    assert s.request("POST", "/api/v1/queues/q/pause", json={"reason": "r"}).status_code == 200
    r = s.request("POST", "/api/v1/queues/q/resume")
    assert r.status_code == 200 and r.json()["resumed"] is True
    assert s.request("GET", "/api/v1/queues/q/config").json()["settings"] == {"paused": False}


def test_a_database_with_settings_stored_bad_is_repaired_at_start(tmp_path):
    db = str(tmp_path / "dev.db")
    server = DevServer(db).start()
    try:
        assert server.request("PUT", "/api/v1/queues/q/config", json={"max_retries": 2}).status_code == 200
    finally:
        server.stop()
    with sqlite3.connect(db) as conn:  # as an older server left it
        conn.execute("UPDATE queue_config SET settings='\"x\"'")
        conn.execute("PRAGMA user_version=0")
    server = DevServer(db).start()
    try:
        for action in ("pause", "resume"):
            r = server.request("POST", f"/api/v1/queues/q/{action}")
            assert r.status_code == 200, r.text
        assert server.request("GET", "/api/v1/queues/q/config").json()["settings"] == {"paused": False}
    finally:
        server.stop()


@pytest.mark.parametrize("given, shown", [
    ("1969-12-31T23:59:59.5Z", "1969-12-31T23:59:59.500000Z"),
    ("1900-02-28T12:00:00+01:30", "1900-02-28T10:30:00.000000Z"),
    ("0000-01-01T00:00:00Z", "0000-01-01T00:00:00.000000Z"),
    ("9999-12-31T23:59:59.999999Z", "9999-12-31T23:59:59.999999Z"),
    ("2024-02-29T00:00:00.123456789z", "2024-02-29T00:00:00.123456Z"),
])
def test_any_year_is_written_back_as_valid_rfc_3339(dev_server, given, shown):
    s = dev_server
    r = s.request("POST", "/api/v1/jobs", json={"queue_name": "t", "payload": {}, "scheduled_at": given})
    assert r.status_code == 201, r.text
    job = s.job(r.json()["id"])
    assert job["scheduled_at"] == shown and RFC3339_OUT.fullmatch(job["created_at"])
    if not given.startswith("0000"):  # Python's datetime (so the SDK's models) starts at year 1, the server at 0
        c = SpooledClient(api_key=s.api_key, base_url=s.url)  # the SDK's models parse every listed time
        assert [j.id for j in c.jobs.list({"queue_name": "t"})] == [job["id"]]


@pytest.mark.parametrize("value", ["2026-01-01", "2026-01-01T10:00", "2026-01-01T10:00:00", "2026-W01-1",
                                   "2026-13-01T00:00:00Z", "2023-02-29T00:00:00Z", "2026-01-01T10:00:00+2400",
                                   "0000-01-01T00:00:00+01:00", "tomorrow", ""])
def test_a_date_time_that_is_not_rfc_3339_with_an_offset_is_refused(dev_server, value):
    r = dev_server.request("POST", "/api/v1/jobs", json={"queue_name": "t", "payload": {}, "scheduled_at": value})
    assert r.status_code == 400, r.text
    body = r.json()
    assert body["code"] == "INVALID_JSON" and body["message"].startswith("scheduled_at: ")
    assert body["details"][0]["code"] == "invalid_json"
    r = dev_server.request("POST", "/api/v1/jobs", json={"queue_name": "t", "payload": {}, "expires_at": 5})
    assert r.status_code == 422 and r.json()["details"][0]["code"] == "invalid_type"


def test_a_tag_filter_over_64_characters_is_refused(dev_server):
    for path in ("/api/v1/jobs", "/api/v1/jobs/dlq"):
        r = dev_server.request("GET", path, params={"tag": "t" * 65})
        assert r.status_code == 400 and r.json()["code"] == "VALIDATION_ERROR", r.text
        assert dev_server.request("GET", path, params={"tag": "t" * 64}).status_code == 200


@pytest.mark.parametrize("queue_name, status", [({"a": 1}, 422), (5, 422), ("bad name", 400), ("q", 200)])
def test_a_config_body_queue_name_must_be_a_queue_name(dev_server, queue_name, status):
    r = dev_server.request("PUT", "/api/v1/queues/q/config", json={"queue_name": queue_name, "max_retries": 1})
    assert r.status_code == status, r.text
    if status == 422:
        assert r.json()["details"][0] == {"field": "queue_name", "message": r.json()["details"][0]["message"],
                                          "code": "invalid_type"}
