"""The dev server's queue read routes, `GET /api/v1/queues` and `GET /api/v1/queues/{name}/stats`.

They answer as the real server's `src/api/handlers/queues.rs` at v0.1.114 (commit dc8bbe0) does, with the
field names of the API's `QueueStats` schema (`queue_name`, `pending_jobs`, ...): an unknown queue gets zeros (the
route never answers 404), a malformed name 400 BAD_REQUEST, a missing or wrong key 401.
"""

from __future__ import annotations

import time

import pytest
import requests
from conftest import DevServer, wait_for_status
from spooled import SpooledClient

pytestmark = pytest.mark.timeout(60)

STATS_FIELDS = {"queue_name", "pending_jobs", "processing_jobs", "completed_jobs_24h", "failed_jobs_24h",
                "avg_processing_time_ms", "max_job_age_seconds", "active_workers"}
SUMMARY_FIELDS = {"queue_name", "max_retries", "default_timeout", "rate_limit", "enabled"}


def stats(server: DevServer, queue: str, key: str | None = None) -> dict:
    r = server.request("GET", f"/api/v1/queues/{queue}/stats", key=key)
    assert r.status_code == 200, r.text
    assert r.headers["x-api-version"] == "1"
    return r.json()


def register(server: DevServer, worker_id: str, queue: str) -> None:
    r = server.request("POST", "/api/v1/workers/register",
                       json={"queue_name": queue, "hostname": "h", "worker_id": worker_id})
    assert r.status_code == 201, r.text


def claim(server: DevServer, queue: str, worker_id: str, limit: int) -> list[dict]:
    r = server.request("POST", "/api/v1/jobs/claim", json={"queue_name": queue, "worker_id": worker_id, "limit": limit})
    assert r.status_code == 200, r.text
    return r.json()["jobs"]


def test_stats_count_each_state_with_the_real_field_names(dev_server):
    created_at = time.time()
    ids = [dev_server.enqueue("images", {"n": i}) for i in range(5)]
    dev_server.enqueue("images", {"later": True}, scheduled_at="2999-01-01T00:00:00Z")
    dev_server.enqueue("other", {"n": 0})
    register(dev_server, "w-1", "images")
    jobs = claim(dev_server, "images", "w-1", 2)
    assert {j["id"] for j in jobs} == set(ids[:2])
    done = dev_server.request("POST", f"/api/v1/jobs/{jobs[0]['id']}/complete",
                              json={"worker_id": "w-1", "lease_id": jobs[0]["lease_id"], "result": {"ok": 1}})
    assert done.status_code == 200, done.text

    s = stats(dev_server, "images")
    assert set(s) == STATS_FIELDS
    assert (s["queue_name"], s["pending_jobs"], s["processing_jobs"], s["completed_jobs_24h"], s["failed_jobs_24h"],
            s["active_workers"]) == ("images", 3, 1, 1, 0, 1)  # the scheduled job is not pending
    assert isinstance(s["avg_processing_time_ms"], float) and 0 <= s["avg_processing_time_ms"] < 10_000
    assert isinstance(s["max_job_age_seconds"], int)
    assert 0 <= s["max_job_age_seconds"] <= time.time() - created_at + 1


def test_an_unknown_queue_has_zeros_and_nulls_not_404(dev_server):
    assert stats(dev_server, "never-used") == {
        "queue_name": "never-used", "pending_jobs": 0, "processing_jobs": 0, "completed_jobs_24h": 0,
        "failed_jobs_24h": 0, "avg_processing_time_ms": None, "max_job_age_seconds": None, "active_workers": 0}


def test_dead_letters_are_not_failed_jobs_and_only_healthy_workers_count(dev_server):
    """The real query counts status 'failed' (never set by a worker) and workers with status 'healthy'."""
    jid = dev_server.enqueue("q", {"x": 1}, max_retries=0)
    register(dev_server, "w-a", "q")
    register(dev_server, "w-b", "q")
    (job,) = claim(dev_server, "q", "w-a", 1)
    r = dev_server.request("POST", f"/api/v1/jobs/{jid}/fail",
                           json={"worker_id": "w-a", "lease_id": job["lease_id"], "error": "boom"})
    assert r.status_code == 200 and dev_server.job(jid)["status"] == "deadletter"
    r = dev_server.request("POST", "/api/v1/workers/w-b/heartbeat", json={"current_jobs": 0, "status": "draining"})
    assert r.status_code == 200, r.text
    s = stats(dev_server, "q")
    assert (s["pending_jobs"], s["processing_jobs"], s["failed_jobs_24h"], s["active_workers"]) == (0, 0, 0, 1)
    assert dev_server.request("POST", "/api/v1/workers/w-a/deregister").status_code == 204
    assert stats(dev_server, "q")["active_workers"] == 0


def test_stats_need_a_valid_key_and_see_only_their_organization(dev_server):
    dev_server.enqueue("shared-name", {"x": 1})
    r = dev_server.request("GET", "/api/v1/queues/shared-name/stats", key="sp_test_not-a-real-key-at-all")
    assert r.status_code == 401 and r.json()["code"] == "UNAUTHORIZED"
    bare = requests.get(dev_server.url + "/api/v1/queues/shared-name/stats", timeout=10)
    assert bare.status_code == 401 and bare.json()["message"] == "Missing or invalid Authorization header"
    org = dev_server.request("POST", "/api/v1/organizations", json={"name": "Other", "slug": "other-org"})
    assert org.status_code == 201, org.text
    other_key = org.json()["api_key"]["key"]
    assert stats(dev_server, "shared-name", key=other_key)["pending_jobs"] == 0
    assert stats(dev_server, "shared-name")["pending_jobs"] == 1


@pytest.mark.parametrize("name, message", [("bad%40name", "Queue name contains invalid characters"),
                                           ("x" * 101, "Invalid queue name length")])
def test_a_malformed_queue_name_is_400_bad_request(dev_server, name, message):
    r = dev_server.request("GET", f"/api/v1/queues/{name}/stats")
    assert r.status_code == 400
    assert r.json() == {"code": "BAD_REQUEST", "message": message}


def test_stats_only_answer_get(dev_server):
    r = dev_server.request("POST", "/api/v1/queues/q/stats", json={})
    assert r.status_code == 405 and r.headers["Allow"] == "GET"


def test_list_has_configured_and_implicit_queues_sorted(dev_server):
    assert dev_server.request("GET", "/api/v1/queues").json() == []
    dev_server.enqueue("zeta", {"x": 1})
    dev_server.enqueue("alpha", {"x": 1})
    r = dev_server.request("PUT", "/api/v1/queues/mid/config", json={"queue_name": "mid", "max_retries": 7,
                                                                     "rate_limit": 50, "enabled": False})
    assert r.status_code == 200, r.text
    listed = dev_server.request("GET", "/api/v1/queues").json()
    assert [q["queue_name"] for q in listed] == ["alpha", "mid", "zeta"]
    assert all(set(q) == SUMMARY_FIELDS for q in listed)
    assert listed[0] == {"queue_name": "alpha", "max_retries": 3, "default_timeout": 300, "rate_limit": None,
                         "enabled": True}
    assert listed[1] == {"queue_name": "mid", "max_retries": 7, "default_timeout": 300, "rate_limit": 50,
                         "enabled": False}


def test_the_official_sdk_reads_both_routes(dev_server):
    dev_server.enqueue("emails", {"to": "a@b.c"})
    client = SpooledClient(api_key=dev_server.api_key, base_url=dev_server.url)
    try:
        assert [q.queue_name for q in client.queues.list()] == ["emails"]
        s = client.queues.get_stats("emails")
        assert (s.queue_name, s.pending_jobs, s.processing_jobs, s.active_workers) == ("emails", 1, 0, 0)
        assert s.max_job_age_seconds is not None and s.avg_processing_time_ms is None
    finally:
        client.close()


def test_stats_follow_a_real_daemon_through_its_jobs(dev_server, daemon_factory):
    """While the daemon runs, its worker is active; once it drains the queue, everything is completed."""
    ids = [dev_server.enqueue("live", {"do": "cpu", "ms": 20}) for _ in range(6)]
    daemon = daemon_factory("live", procs=2, worker_id="stats-worker").wait_ready()
    wait_for_status(dev_server, ids, timeout=30)
    s = stats(dev_server, "live")
    assert (s["pending_jobs"], s["processing_jobs"], s["completed_jobs_24h"], s["active_workers"]) == (0, 0, 6, 1)
    assert s["max_job_age_seconds"] is None and s["avg_processing_time_ms"] > 0
    daemon.stop()
    assert stats(dev_server, "live")["active_workers"] == 0
