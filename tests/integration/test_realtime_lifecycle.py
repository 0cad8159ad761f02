"""The dev server's realtime events carry a job's whole life, named and shaped as the real server's
(`job.created`, `job.status`, `job.completed`, `job.failed`, `worker.*`), on `GET /api/v1/events` with the
key in the header or in `?token=` / `?api_key=` (which no other route accepts)."""

from __future__ import annotations

import pytest
from conftest import wait_until
from support.realtime_tap import SseTap

pytestmark = pytest.mark.timeout(60)


def _claim(server, queue: str, worker: str) -> dict:
    def one():
        jobs = server.request("POST", "/api/v1/jobs/claim", json={"queue_name": queue, "worker_id": worker}).json()
        return jobs["jobs"][0] if jobs["jobs"] else None
    return wait_until(one, timeout=15, what=f"a job to claim on {queue}")


def _statuses(events, job_id):
    return [(d["data"]["old_status"], d["data"]["new_status"]) for n, d in events
            if n == "job.status" and d["data"]["job_id"] == job_id]


@pytest.fixture
def taps():
    made: list[SseTap] = []
    yield made
    for t in made:
        t.close()


def test_a_jobs_whole_life_is_on_the_stream(dev_server, taps):
    all_of_it = SseTap(dev_server.port, f"/api/v1/events?token={dev_server.api_key}")
    one_queue = SseTap(dev_server.port, "/api/v1/events?queue=life", headers=dev_server.headers())
    other_queue = SseTap(dev_server.port, f"/api/v1/events?queue=elsewhere&api_key={dev_server.api_key}")
    taps += [all_of_it, one_queue, other_queue]
    assert all_of_it.status == one_queue.status == other_queue.status == 200
    wait_until(lambda: "connected" in all_of_it.comments, what="the :connected comment")

    r = dev_server.request("POST", "/api/v1/workers/register", json={"queue_name": "life", "hostname": "h1"})
    wid = r.json()["id"]
    done = dev_server.enqueue("life", {"n": 1}, priority=3)
    job = _claim(dev_server, "life", wid)
    assert dev_server.request("POST", f"/api/v1/jobs/{done}/complete",
                              json={"worker_id": wid, "lease_id": job["lease_id"], "result": {"ok": [1, 2]}}).ok

    failing = dev_server.enqueue("life", {"n": 2}, max_retries=1)
    for attempt in range(2):
        job = _claim(dev_server, "life", wid)
        assert job["id"] == failing
        assert dev_server.request("POST", f"/api/v1/jobs/{failing}/fail",
                                  json={"worker_id": wid, "lease_id": job["lease_id"], "error": f"boom {attempt}"}).ok
    assert dev_server.request("POST", f"/api/v1/jobs/{failing}/retry").ok
    assert dev_server.request("DELETE", f"/api/v1/jobs/{failing}").status_code == 204
    assert dev_server.request("POST", f"/api/v1/workers/{wid}/deregister").status_code == 204

    events = all_of_it.wait_for(lambda ev: any(n == "worker.deregistered" for n, _ in ev), what="the whole life")
    names = [n for n, _ in events]
    assert names[0] == "worker.registered"
    assert events[0][1] == {"type": "WorkerRegistered", "data": {"worker_id": wid, "queue_name": "life",
                                                                 "timestamp": events[0][1]["data"]["timestamp"]}}
    created = [d for n, d in events if n == "job.created" and d["data"]["job_id"] == done]
    assert created and created[0]["type"] == "JobCreated" and created[0]["data"]["priority"] == 3
    completed = [d for n, d in events if n == "job.completed"]
    assert len(completed) == 1 and completed[0]["type"] == "JobCompleted"
    data = completed[0]["data"]
    assert list(data) == ["job_id", "queue_name", "duration_ms", "timestamp", "result"]
    assert data["job_id"] == done and data["result"] == {"ok": [1, 2]} and isinstance(data["duration_ms"], int)
    assert data["timestamp"].endswith("Z")
    assert _statuses(events, done) == [("pending", "processing")]
    assert _statuses(events, failing) == [("pending", "processing"), ("processing", "pending"),
                                          ("pending", "processing"), ("processing", "deadletter"),
                                          ("deadletter", "pending"), ("pending", "cancelled")]
    failed = [d for n, d in events if n == "job.failed"]
    assert [f["data"]["error"] for f in failed] == ["boom 0", "boom 1"]
    assert [f["data"]["retry_count"] for f in failed] == [1, 1]
    assert set(failed[0]["data"]) == {"job_id", "queue_name", "error", "retry_count", "timestamp"}
    assert events[-1] == ("worker.deregistered", {"type": "WorkerDeregistered", "data": {
        "worker_id": wid, "timestamp": events[-1][1]["data"]["timestamp"]}})

    # The queue filter keeps that queue's events and leaves out the ones without a queue.
    mine = one_queue.wait_for(lambda ev: len(ev) >= len(events) - 1, what="the queue's events")
    assert [n for n, _ in mine] == names[:-1]
    assert other_queue.snapshot() == []


def test_a_lost_lease_is_told_as_a_status_change(dev_server, taps):
    tap = SseTap(dev_server.port, "/api/v1/events?events=job.status", headers=dev_server.headers())
    taps.append(tap)
    jid = dev_server.enqueue("lost", {})
    _claim(dev_server, "lost", "w-gone")
    assert dev_server.request("POST", f"/_dev/leases/{jid}/expire").ok
    events = tap.wait_for(lambda ev: len(_statuses(ev, jid)) >= 2, what="the release")
    assert _statuses(events, jid) == [("pending", "processing"), ("processing", "pending")]
    assert {n for n, _ in events} == {"job.status"}


def test_the_job_filter_keeps_one_jobs_events(dev_server, taps):
    first = dev_server.enqueue("jf", {})
    tap = SseTap(dev_server.port, f"/api/v1/events?job_id={first}", headers=dev_server.headers())
    taps.append(tap)
    dev_server.enqueue("jf", {})
    assert dev_server.request("DELETE", f"/api/v1/jobs/{first}").status_code == 204
    events = tap.wait_for(lambda ev: len(ev) >= 1, what="the job's event")
    assert _statuses(events, first) == [("pending", "cancelled")]
    assert all(d["data"]["job_id"] == first for _, d in tap.snapshot())


def test_query_tokens_are_checked_and_taken_on_realtime_routes_only(dev_server, taps):
    wrong = SseTap(dev_server.port, "/api/v1/events?token=sp_test_not-a-key")
    assert wrong.status == 401 and b'"code":"UNAUTHORIZED"' in wrong.body
    none = SseTap(dev_server.port, "/api/v1/events?token=")
    assert none.status == 401
    r = dev_server.request("GET", f"/api/v1/jobs?token={dev_server.api_key}", key="sp_test_wrong")
    assert r.status_code == 401
    import requests
    r = requests.get(f"{dev_server.url}/api/v1/jobs", params={"token": dev_server.api_key}, timeout=10)
    assert r.status_code == 401 and r.json()["code"] == "UNAUTHORIZED"
    # The key in a query string never reaches the request log.
    log = dev_server.request("GET", "/_dev/requests").json()
    assert dev_server.api_key not in str(log)


def test_a_payload_with_markup_travels_as_data(dev_server, taps):
    tap = SseTap(dev_server.port, "/api/v1/events?events=job.completed", headers=dev_server.headers())
    taps.append(tap)
    jid = dev_server.enqueue("markup", {})
    job = _claim(dev_server, "markup", "w1")
    evil = "</script><script>alert(1)</script>\n\nevent: job.created\ndata: {}"
    assert dev_server.request("POST", f"/api/v1/jobs/{jid}/complete",
                              json={"worker_id": "w1", "lease_id": job["lease_id"], "result": evil}).ok
    events = tap.wait_for(lambda ev: len(ev) >= 1, what="job.completed")
    assert events == [("job.completed", events[0][1])] and events[0][1]["data"]["result"] == evil
