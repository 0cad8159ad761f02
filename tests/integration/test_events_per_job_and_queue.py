"""`GET /api/v1/events/jobs/{id}` and `GET /api/v1/events/queues/{name}` on the dev server, as the real server
answers them: a job's status changes until it ends (read by the SDK's own SSE client, which stops there), a
queue's counts every few seconds; and what a hostile caller gets: another organization's job, a wrong or
revoked key, a queue name with markup, a scoped key, too many streams, the events switched off."""

from __future__ import annotations

import json
import socket
import time

import pytest
import requests
from conftest import DevServer, wait_until
from spooled import SpooledClient

pytestmark = pytest.mark.timeout(60)
sse = pytest.importorskip("spooled.realtime.sse")


def job_stream(server: DevServer, job_id: str, key: str | None = None):
    client = sse.SSEClient(base_url=server.url, token=key or server.api_key, job_id=job_id, auto_reconnect=False)
    client.connect()
    return client


class Raw:
    """One stream read with requests: its status, and its named events as (name, parsed data) in order."""

    def __init__(self, server: DevServer, path: str, key: str | None = None, **params):
        headers = {} if "token" in params else {"Authorization": f"Bearer {key or server.api_key}"}
        self.r = requests.get(server.url + path, headers=headers, params=params, stream=True, timeout=(5, 15))
        self.lines = self.r.iter_lines(decode_unicode=True) if self.r.status_code == 200 else iter(())
        self.comments: list[str] = []

    def next_event(self) -> tuple[str, dict] | None:
        """The next named event, or None when the server ended the stream."""
        name = None
        for line in self.lines:
            if line.startswith(":"):
                self.comments.append(line)
            elif line.startswith("event: "):
                name = line[len("event: "):]
            elif line.startswith("data: ") and name:
                return name, json.loads(line[len("data: "):])
        return None

    def close(self) -> None:
        self.r.close()


def claim(server: DevServer, queue: str) -> dict:
    jobs = server.request("POST", "/api/v1/jobs/claim", json={"queue_name": queue, "worker_id": "w1"}).json()["jobs"]
    assert len(jobs) == 1
    return jobs[0]


def test_a_job_stream_tells_each_status_and_ends_with_the_job(dev_server):
    job_id = dev_server.enqueue("watched", {"html": "<img src=x onerror=alert(1)>"})
    client = job_stream(dev_server, job_id)
    seen: list[tuple[str, str]] = []
    for event in client.events():  # the SDK's client: the generator ends when the server closes the stream
        assert event.type == "job.status_changed" and event.data["job_id"] == job_id
        assert event.data["queue_name"] == "watched"
        seen.append((event.data["old_status"], event.data["new_status"]))
        if event.data["new_status"] == "pending":
            job = claim(dev_server, "watched")
        elif event.data["new_status"] == "processing":
            r = dev_server.request("POST", f"/api/v1/jobs/{job_id}/complete", json={
                "worker_id": "w1", "lease_id": job["lease_id"], "result": {"ok": True}})
            assert r.status_code == 200, r.text
    assert seen == [("", "pending"), ("pending", "processing"), ("processing", "completed")]


def test_a_finished_job_is_told_once_and_the_stream_ends(dev_server):
    job_id = dev_server.enqueue("done", {})
    assert dev_server.request("DELETE", f"/api/v1/jobs/{job_id}").status_code == 204
    raw = Raw(dev_server, f"/api/v1/events/jobs/{job_id}")
    assert raw.r.status_code == 200 and raw.r.headers["content-type"].startswith("text/event-stream")
    name, data = raw.next_event()
    assert name == "job.status" and data["type"] == "JobStatusChange"
    assert (data["data"]["old_status"], data["data"]["new_status"]) == ("", "cancelled")
    assert raw.next_event() is None  # ended by the server
    raw.close()


def test_a_job_of_another_organization_or_none_is_an_error_event_and_the_end(dev_server):
    mine = dev_server.enqueue("private", {"secret": "ours"})
    org = dev_server.request("POST", "/api/v1/organizations", json={"name": "Prying", "slug": "prying-org"})
    theirs = org.json()["api_key"]["key"]
    markup = "%3Cb%3Ex%3C%2Fb%3E"
    for key, job_id in ((theirs, mine), (dev_server.api_key, "no-such-job"), (dev_server.api_key, markup)):
        raw = Raw(dev_server, f"/api/v1/events/jobs/{job_id}", key=key)
        event = raw.next_event()
        assert event is not None and event[0] == "error"
        assert event[1]["type"] == "Error" and event[1]["data"]["message"] == "Job not found"
        assert mine not in json.dumps(event[1]) and "private" not in json.dumps(event[1])
        assert raw.next_event() is None
        raw.close()
    client = job_stream(dev_server, mine, key=theirs)  # the SDK's client stops on it too
    assert [e.type for e in client.events()] == ["error"]


def test_the_key_may_come_in_the_query_string_and_a_wrong_one_is_401(dev_server):
    job_id = dev_server.enqueue("q-token", {})
    raw = Raw(dev_server, f"/api/v1/events/jobs/{job_id}", token=dev_server.api_key)
    assert raw.next_event()[1]["data"]["new_status"] == "pending"
    raw.close()
    for path in (f"/api/v1/events/jobs/{job_id}", "/api/v1/events/queues/q-token"):
        for params in ({"token": "sp_test_wrong"}, {"api_key": "sp_test_wrong"}, {}):
            r = requests.get(dev_server.url + path, params=params, timeout=5)
            assert r.status_code == 401 and r.json()["code"] == "UNAUTHORIZED", (path, params, r.text)
    with pytest.raises(Exception) as refused:  # the SDK's client raises the typed 401, never an empty stream
        job_stream(dev_server, job_id, key="sp_test_wrong")
    assert getattr(refused.value, "status_code", None) == 401


def test_a_revoked_key_ends_its_open_job_and_queue_streams(dev_server):
    sdk = SpooledClient(api_key=dev_server.api_key, base_url=dev_server.url)
    made = sdk.api_keys.create({"name": "short-lived"})
    job_id = dev_server.enqueue("revoked", {})
    job = Raw(dev_server, f"/api/v1/events/jobs/{job_id}", key=made.key)
    queue = Raw(dev_server, "/api/v1/events/queues/revoked", key=made.key)
    assert job.next_event()[0] == "job.status" and queue.next_event()[0] == "queue.stats"
    sdk.api_keys.delete(made.id)
    started = time.monotonic()
    assert job.next_event() is None and queue.next_event() is None  # ended, without waiting for the job
    assert time.monotonic() - started < 10
    job.close()
    queue.close()
    r = requests.get(dev_server.url + f"/api/v1/events/jobs/{job_id}", params={"token": made.key}, timeout=5)
    assert r.status_code == 401 and r.json()["message"] == "API key is inactive"


def test_a_queue_stream_counts_its_jobs_by_status(dev_server):
    ids = [dev_server.enqueue("counted", {"n": i}) for i in range(4)]
    dev_server.enqueue("counted", {}, scheduled_at="2099-01-01T00:00:00Z")
    dev_server.enqueue("elsewhere", {})
    org = dev_server.request("POST", "/api/v1/organizations", json={"name": "Neighbour", "slug": "neighbour-org"})
    other = org.json()["api_key"]["key"]
    r = dev_server.request("POST", "/api/v1/jobs", key=other, json={"queue_name": "counted", "payload": {}})
    assert r.status_code == 201
    job = claim(dev_server, "counted")
    done = dev_server.request("POST", f"/api/v1/jobs/{job['id']}/complete",
                              json={"worker_id": "w1", "lease_id": job["lease_id"]})
    assert done.status_code == 200
    claim(dev_server, "counted")
    assert dev_server.request("DELETE", f"/api/v1/jobs/{ids[3]}").status_code == 204

    raw = Raw(dev_server, "/api/v1/events/queues/counted")
    name, data = raw.next_event()  # the first at once
    assert name == "queue.stats" and data["type"] == "QueueStats"
    stats = data["data"]
    assert {k: stats[k] for k in ("queue_name", "pending", "processing", "completed", "failed")} == {
        "queue_name": "counted", "pending": 2, "processing": 1, "completed": 1, "failed": 0}
    assert stats["timestamp"].endswith("Z")
    mine = Raw(dev_server, "/api/v1/events/queues/counted", key=other)  # the other organization's count
    assert mine.next_event()[1]["data"]["pending"] == 1
    mine.close()
    second = raw.next_event()
    assert second[0] == "queue.stats" and second[1]["data"]["pending"] == 2
    raw.close()


@pytest.mark.parametrize("name, status, code", [
    ("%3Cscript%3Ealert(1)%3C%2Fscript%3E", 400, "VALIDATION_ERROR"),
    ("x" * 101, 400, "VALIDATION_ERROR"),
    ("-leading", 400, "VALIDATION_ERROR"),
])
def test_a_bad_queue_name_is_a_clear_400(dev_server, name, status, code):
    r = requests.get(dev_server.url + f"/api/v1/events/queues/{name}",
                     headers={"Authorization": f"Bearer {dev_server.api_key}"}, timeout=5)
    assert r.status_code == status and r.json()["code"] == code, r.text
    assert "<script>" not in r.text


def test_a_queue_scoped_key_streams_only_its_queues(dev_server):
    sdk = SpooledClient(api_key=dev_server.api_key, base_url=dev_server.url)
    scoped = sdk.api_keys.create({"name": "mail-only", "queues": ["mail"]}).key
    r = requests.get(dev_server.url + "/api/v1/events/queues/billing",
                     headers={"Authorization": f"Bearer {scoped}"}, timeout=5)
    assert r.status_code == 403 and r.json()["code"] == "ACCESS_DENIED"
    raw = Raw(dev_server, "/api/v1/events/queues/mail", key=scoped)
    assert raw.next_event()[1]["data"]["queue_name"] == "mail"
    raw.close()


def test_past_the_cap_of_open_streams_a_new_one_is_429(dev_server):
    held: list[socket.socket] = []
    head = (f"GET /api/v1/events/queues/capped HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {dev_server.api_key}"
            "\r\n\r\n").encode()
    try:
        for _ in range(100):
            s = socket.create_connection(("127.0.0.1", dev_server.port), timeout=10)
            s.sendall(head)
            assert s.recv(64).startswith(b"HTTP/1.1 200")
            held.append(s)
        r = requests.get(dev_server.url + "/api/v1/events/queues/capped",
                         headers={"Authorization": f"Bearer {dev_server.api_key}"}, timeout=5)
        assert r.status_code == 429 and r.json()["code"] == "RATE_LIMIT_EXCEEDED"
    finally:
        for s in held:
            s.close()
    wait_until(lambda: requests.get(dev_server.url + "/_dev/events", timeout=5, headers={
        "Authorization": f"Bearer {dev_server.api_key}"}).json()["streams"] == 0, timeout=20,
        what="the closed streams to be forgotten")


def test_with_events_off_both_routes_are_404(tmp_path):
    s = DevServer(str(tmp_path / "off.db"), extra=["--events", "off"]).start()
    try:
        job_id = s.enqueue("q", {})
        for path in (f"/api/v1/events/jobs/{job_id}", "/api/v1/events/queues/q"):
            r = s.request("GET", path)
            assert r.status_code == 404 and r.json()["code"] == "NOT_FOUND"
    finally:
        s.stop()
