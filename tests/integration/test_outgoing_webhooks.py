"""Outgoing webhooks on the dev server: CRUD as the real server answers it (read through the official SDK),
real signed HTTP deliveries of the job, queue and worker events to a local receiver that checks each
signature, retries with back-off that are recorded, and URLs that refuse, hang or answer 500 never
slowing the API. The sender costs nothing measurable while idle."""

from __future__ import annotations

import hashlib
import hmac
import os
import time

import pytest
import requests
from conftest import DevServer, wait_until
from spooled import SpooledClient
from support.webhook_receiver import Hold, Receiver, closed_port_url

pytestmark = pytest.mark.timeout(120)
EVENTS = ["job.created", "job.started", "job.completed", "job.failed", "job.cancelled", "queue.paused",
          "queue.resumed", "worker.registered", "worker.deregistered", "schedule.triggered"]


@pytest.fixture
def server(tmp_path):
    s = DevServer(str(tmp_path / "dev.db"), extra=["--webhook-timeout", "1", "--webhook-backoff", "0.2",
                                                   "--lease-sweep-interval", "0.2"]).start()
    yield s
    s.stop()


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


def _verify(req: dict, secret: str) -> None:
    stamp = req["headers"]["x-spooled-timestamp"]
    want = "sha256=" + hmac.new(secret.encode(), stamp.encode() + b"." + req["body"], hashlib.sha256).hexdigest()
    assert hmac.compare_digest(req["headers"]["x-spooled-signature"], want)
    assert abs(int(stamp) - time.time()) < 60


def _hook(server, url: str, events=None, secret: str | None = "s3cret", **extra) -> dict:
    body = {"name": "receiver", "url": url, "events": events or EVENTS, **extra}
    if secret is not None:
        body["secret"] = secret
    r = server.request("POST", "/api/v1/outgoing-webhooks", json=body)
    assert r.status_code == 201, r.text
    return r.json()


def _claim(server, queue: str) -> dict:
    def one():
        jobs = server.request("POST", "/api/v1/jobs/claim", json={"queue_name": queue, "worker_id": "w1"}).json()
        return jobs["jobs"][0] if jobs["jobs"] else None
    return wait_until(one, timeout=15, what="a job to claim")


def test_crud_as_the_real_server_answers_it(server):
    sdk = SpooledClient(api_key=server.api_key, base_url=server.url)
    made = sdk.webhooks.create({"name": "mine", "url": "http://127.0.0.1:9/x", "events": ["job.completed"],
                                "secret": "abc"})
    assert made.enabled and made.failure_count == 0 and made.events == ["job.completed"]
    raw = server.request("GET", f"/api/v1/outgoing-webhooks/{made.id}").json()
    assert "secret" not in raw and raw["organization_id"] and raw["last_status"] is None
    assert [w.id for w in sdk.webhooks.list()] == [made.id]
    changed = server.request("PUT", f"/api/v1/outgoing-webhooks/{made.id}", json={"name": "renamed", "secret": None,
                                                                                  "enabled": False}).json()
    assert changed["name"] == "renamed" and changed["enabled"] is False and changed["url"] == "http://127.0.0.1:9/x"
    assert sdk.webhooks.get_deliveries(made.id) == []
    sdk.webhooks.delete(made.id)
    for method in ("GET", "DELETE", "PUT"):
        r = server.request(method, f"/api/v1/outgoing-webhooks/{made.id}", json={})
        assert r.status_code == 404 and r.json()["message"] == f"Webhook {made.id} not found"
    assert server.request("POST", f"/api/v1/outgoing-webhooks/{made.id}/retry/nope").status_code == 404


@pytest.mark.parametrize("body,status,text", [
    ({"name": "a", "url": "http://h/x", "events": ["job.dead_letter"]}, 400, "Invalid event type: 'job.dead_letter'"),
    ({"name": "a", "url": "ftp://h/x", "events": ["job.created"]}, 400, "URL must use HTTP or HTTPS scheme"),
    ({"name": "a", "url": "http:///x", "events": ["job.created"]}, 400, "Invalid URL"),
    ({"name": "a", "url": "http://h/x\r\nX-Evil: 1", "events": ["job.created"]}, 400, "Invalid URL"),
    ({"name": "a", "url": "http://h/x", "events": []}, 400, "events"),
    ({"name": "a", "events": ["job.created"]}, 422, "url"),
    ({"name": "a", "url": "http://h/x", "events": "job.created"}, 422, "events"),
    ({"name": "", "url": "http://h/x", "events": ["job.created"]}, 400, "name"),
    ({"name": "a", "url": "http://h/x", "events": ["job.created"], "secret": "x" * 256}, 400, "secret"),
], ids=["bad-event", "bad-scheme", "no-host", "header-injection", "no-events", "no-url", "events-not-list",
        "empty-name", "long-secret"])
def test_a_bad_webhook_is_refused(server, body, status, text):
    r = server.request("POST", "/api/v1/outgoing-webhooks", json=body)
    assert r.status_code == status and text in r.json()["message"], r.text
    assert server.request("GET", "/api/v1/outgoing-webhooks").json() == []


def test_the_lifecycle_is_delivered_signed(server, receiver):
    hook = _hook(server, receiver.url + "/hook")
    wid = server.request("POST", "/api/v1/workers/register", json={"queue_name": "wh", "hostname": "h"}).json()["id"]
    done = server.enqueue("wh", {"n": 1}, completion_webhook=receiver.url + "/done",
                          completion_webhook_secret="job-secret")
    job = _claim(server, "wh")
    assert server.request("POST", f"/api/v1/jobs/{done}/complete",
                          json={"worker_id": "w1", "lease_id": job["lease_id"], "result": {"ok": "<b>"}}).ok
    dead = server.enqueue("wh", {}, max_retries=0)
    job = _claim(server, "wh")
    server.request("POST", f"/api/v1/jobs/{dead}/fail", json={"worker_id": "w1", "lease_id": job["lease_id"],
                                                              "error": "broke"})
    gone = server.enqueue("wh", {})
    assert server.request("DELETE", f"/api/v1/jobs/{gone}").status_code == 204
    server.request("POST", "/api/v1/queues/wh/pause", json={"reason": "later"})
    server.request("POST", "/api/v1/queues/wh/resume")
    server.request("POST", f"/api/v1/workers/{wid}/deregister")

    want = {"worker.registered": 1, "job.created": 3, "job.started": 2, "job.completed": 1, "job.failed": 1,
            "job.cancelled": 1, "queue.paused": 1, "queue.resumed": 1, "worker.deregistered": 1}
    got = wait_until(lambda: (r := receiver.requests("/hook")) and len(r) >= sum(want.values()) and r,
                     timeout=30, what="every event delivered")
    counts: dict[str, int] = {}
    for req in got:
        _verify(req, "s3cret")
        env = req["json"]
        assert set(env) == {"id", "event", "created_at", "data"} and env["created_at"].endswith("Z")
        assert req["headers"]["x-spooled-event"] == env["event"]
        assert req["headers"]["x-spooled-delivery-attempt"] == "1"
        assert req["headers"]["content-type"] == "application/json"
        counts[env["event"]] = counts.get(env["event"], 0) + 1
    assert counts == want
    by_event = {r["json"]["event"]: r["json"]["data"] for r in got}
    assert by_event["job.completed"] == {"job_id": done, "queue_name": "wh", "status": "completed",
                                         "result": {"ok": "<b>"}}
    assert by_event["job.failed"] == {"job_id": dead, "queue_name": "wh", "status": "deadletter", "error": "broke"}
    assert by_event["job.cancelled"]["job_id"] == gone and by_event["job.cancelled"]["old_status"] == "pending"
    assert by_event["worker.registered"] == {"worker_id": wid, "queue_name": "wh", "hostname": "h"}
    [own] = wait_until(lambda: receiver.requests("/done"), what="the completion webhook")
    _verify(own, "job-secret")
    assert own["json"]["event"] == "job.completed" and own["json"]["data"]["job_id"] == done

    deliveries = wait_until(lambda: (d := server.request("GET", f"/api/v1/outgoing-webhooks/{hook['id']}/deliveries"
                                                         ).json()) and all(x["status"] == "success" for x in d) and d,
                            what="the deliveries recorded as delivered")
    assert len(deliveries) == sum(want.values())
    first = deliveries[0]
    assert first["status_code"] == 200 and first["attempts"] == 1 and first["delivered_at"]
    assert first["response_body"] == "ok <b>fine</b>"  # kept, with control characters dropped
    assert server.request("GET", f"/api/v1/outgoing-webhooks/{hook['id']}").json()["last_status"] == "success"


def test_a_500_is_retried_with_back_off_until_it_lands(server):
    flaky = Receiver(statuses=[500, 503])
    try:
        hook = _hook(server, flaky.url + "/hook", events=["job.created"])
        server.enqueue("retry", {})
        got = wait_until(lambda: len(flaky.requests()) >= 3 and flaky.requests(), timeout=20, what="three attempts")
        assert [r["headers"]["x-spooled-delivery-attempt"] for r in got] == ["1", "2", "3"]
        assert got[1]["at"] - got[0]["at"] >= 0.15 and got[2]["at"] - got[1]["at"] >= 0.35  # 0.2 s, then 0.4 s
        assert len({r["json"]["id"] for r in got}) == 1  # one delivery, three attempts
        for r in got:
            _verify(r, "s3cret")
        [d] = wait_until(lambda: (x := server.request("GET", f"/api/v1/outgoing-webhooks/{hook['id']}/deliveries"
                                                      ).json()) and x[0]["status"] == "success" and x, what="success")
        assert d["attempts"] == 3 and d["status_code"] == 200
        r = server.request("POST", f"/api/v1/outgoing-webhooks/{hook['id']}/retry/{d['id']}")
        assert r.status_code == 400 and r.json()["message"] == "Cannot retry a successful delivery"
    finally:
        flaky.close()


def test_urls_that_refuse_hang_or_fail_never_slow_the_api(server):
    hold = Hold()
    try:
        dead = _hook(server, closed_port_url(), events=["job.created"])
        slow = _hook(server, hold.url, events=["job.created"], secret=None)
        worst = 0.0
        for i in range(21):  # one more than the failed deliveries in a row that disable a webhook
            t0 = time.monotonic()
            server.enqueue("slowq", {"i": i})
            worst = max(worst, time.monotonic() - t0)
        assert worst < 1.0, worst
        t0 = time.monotonic()
        assert requests.get(server.url + "/health", timeout=5).status_code == 200 and time.monotonic() - t0 < 1.0

        def finished(hook_id):
            d = server.request("GET", f"/api/v1/outgoing-webhooks/{hook_id}/deliveries").json()
            return len(d) == 21 and all(x["attempts"] == 5 and x["status"] == "failed" for x in d) and d

        for hook, why in ((dead, "refused"), (slow, "timed out")):
            d = wait_until(lambda h=hook: finished(h["id"]), timeout=90, interval=0.5, what=f"{why}: 5 attempts each")
            assert why in d[0]["error"] and d[0]["status_code"] is None and d[0]["delivered_at"] is None
            after = server.request("GET", f"/api/v1/outgoing-webhooks/{hook['id']}").json()
            # disabled at the 20th failed delivery; the one already made still ran its course
            assert after["failure_count"] == 21 and after["enabled"] is False
            assert after["last_status"] == "auto_disabled"
        # A manual retry sends it once more, and is recorded.
        d = server.request("GET", f"/api/v1/outgoing-webhooks/{dead['id']}/deliveries").json()[0]
        r = server.request("POST", f"/api/v1/outgoing-webhooks/{dead['id']}/retry/{d['id']}")
        assert r.status_code == 200 and r.json() == {"success": True, "message": "Retry initiated"}
        wait_until(lambda: [x for x in server.request("GET", f"/api/v1/outgoing-webhooks/{dead['id']}/deliveries"
                                                      ).json() if x["id"] == d["id"]][0]["attempts"] == 6,
                   what="the manual retry")
        test = server.request("POST", f"/api/v1/outgoing-webhooks/{dead['id']}/test").json()
        assert test["success"] is False and test["error"] == "Request failed" and test["status_code"] is None
    finally:
        hold.close()


def test_the_test_route_sends_one_signed_request(server, receiver):
    hook = _hook(server, receiver.url + "/t", events=["job.created"])
    r = server.request("POST", f"/api/v1/outgoing-webhooks/{hook['id']}/test")
    assert r.status_code == 200
    answer = r.json()
    assert answer["success"] is True and answer["status_code"] == 200 and answer["error"] is None
    [req] = receiver.requests("/t")
    _verify(req, "s3cret")
    assert req["json"]["event"] == "webhook.test" and req["json"]["test"] is True
    assert server.request("GET", f"/api/v1/outgoing-webhooks/{hook['id']}/deliveries").json() == []


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _settled(pid: int):
    """A predicate: true once the process used no CPU between two calls (its start-up and the delivery's
    bookkeeping are over)."""
    last = [_cpu_seconds(pid)]

    def idle() -> bool:
        now = _cpu_seconds(pid)
        quiet, last[0] = now == last[0], now
        return quiet
    return idle


def test_the_idle_sender_costs_under_one_percent_of_a_core(tmp_path, receiver):
    s = DevServer(str(tmp_path / "idle.db")).start()  # the default sweeps, as a developer runs it
    try:
        hook = _hook(s, receiver.url + "/idle", events=["job.created"])
        s.enqueue("idle", {})
        wait_until(lambda: receiver.requests("/idle"), what="the delivery")
        wait_until(lambda: [d["status"] for d in s.request("GET", f"/api/v1/outgoing-webhooks/{hook['id']}/deliveries"
                                                              ).json()] == ["success"],
                   what="the delivery recorded as delivered")
        wait_until(_settled(s.proc.pid), timeout=30, interval=0.05, what="the server to go idle")
        before, t0 = _cpu_seconds(s.proc.pid), time.monotonic()
        time.sleep(5.0)  # measuring an idle interval: nothing to poll for
        used = _cpu_seconds(s.proc.pid) - before
        assert used / (time.monotonic() - t0) < 0.01, used
    finally:
        s.stop()


def test_a_schedule_fire_and_a_trigger_send_job_created_and_schedule_triggered(tmp_path, receiver):
    s = DevServer(str(tmp_path / "sched.db"), extra=["--schedule-interval", "0.1"]).start()
    try:
        org = s.request("POST", "/api/v1/organizations", json={"name": "Other", "slug": "other-sched"}).json()
        theirs = org["api_key"]["key"]
        r = s.request("POST", "/api/v1/outgoing-webhooks", key=theirs, json={
            "name": "theirs", "url": receiver.url + "/theirs", "events": EVENTS, "secret": "their-secret"})
        assert r.status_code == 201, r.text
        hook = _hook(s, receiver.url + "/mine", events=["job.created", "schedule.triggered"])
        sdk = SpooledClient(api_key=s.api_key, base_url=s.url)
        payload = {"html": "<script>alert('x')</script>", "n": 2**70}
        made = sdk.schedules.create({"name": "hourly", "cron_expression": "0 * * * *", "queue_name": "cron-hooks",
                                     "payload_template": payload})
        fired = sdk.schedules.trigger(made.id)

        def by_event(want: str) -> list[dict]:
            return [r for r in receiver.requests("/mine") if r["json"]["event"] == want]
        [triggered] = wait_until(lambda: by_event("schedule.triggered"), what="the trigger's schedule.triggered")
        [created] = wait_until(lambda: by_event("job.created"), what="the trigger's job.created")
        for req in (triggered, created):
            _verify(req, "s3cret")
            assert req["headers"]["x-spooled-event"] == req["json"]["event"]
        data = triggered["json"]["data"]
        assert (data["schedule_id"], data["job_id"], data["queue_name"]) == (made.id, fired.job_id, "cron-hooks")
        assert created["json"]["data"]["job_id"] == fired.job_id
        assert created["json"]["data"]["queue_name"] == "cron-hooks"
        job = s.request("GET", f"/api/v1/jobs/{fired.job_id}").json()
        assert job["payload"] == payload  # the markup and the big integer as given, in the job the hook names

        # the sweep's fire: the schedule, made due now, fires once and is announced the same way
        every = sdk.schedules.create({"name": "every", "cron_expression": "* * * * * *", "queue_name": "cron-hooks",
                                      "payload_template": {}})
        run = wait_until(lambda: (h := sdk.schedules.get_history(every.id)) and h[-1], timeout=15, what="a fire")
        sdk.schedules.pause(every.id)
        fire = wait_until(lambda: [r for r in by_event("schedule.triggered")
                                   if r["json"]["data"]["schedule_id"] == every.id
                                   and r["json"]["data"]["job_id"] == run.job_id], what="the fire's webhook")
        _verify(fire[0], "s3cret")
        wait_until(lambda: [r for r in by_event("job.created") if r["json"]["data"]["job_id"] == run.job_id],
                   what="the fired job's job.created")
        other = s.request("POST", f"/api/v1/schedules/{made.id}/trigger", key=theirs)  # not their schedule
        assert other.status_code == 404 and other.json() == {"code": "NOT_FOUND", "message": "Schedule not found"}
        deliveries = s.request("GET", f"/api/v1/outgoing-webhooks/{hook['id']}/deliveries").json()
        assert {d["event"] for d in deliveries} == {"job.created", "schedule.triggered"}
        assert receiver.requests("/theirs") == []  # another organization's webhook hears none of it
    finally:
        s.stop()
