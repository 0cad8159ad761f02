"""The dev server's /_dev routes act for the caller's organization alone: with open registration anyone can
mint a key, so a second organization must not read the first's request log, inject faults into its
requests, nor end or refuse its event streams."""

from __future__ import annotations

import threading

import pytest
import requests
from conftest import wait_until


def second_org(server) -> str:
    r = requests.post(server.url + "/api/v1/organizations", json={"name": "Intruder", "slug": "intruder"}, timeout=5)
    assert r.status_code == 201, r.text
    return r.json()["api_key"]["key"]


@pytest.mark.timeout(60)
def test_the_request_log_shows_the_callers_requests_only(dev_server):
    other = second_org(dev_server)
    job = dev_server.enqueue("q-first", {"n": 1})
    claim = dev_server.request("POST", "/api/v1/jobs/claim", json={"queue_name": "q-first", "worker_id": "w1"}).json()
    lease = claim["jobs"][0]["lease_id"]
    done = dev_server.request("POST", f"/api/v1/jobs/{job}/complete",
                              json={"worker_id": "w1", "lease_id": lease, "result": {}})
    assert done.status_code == 200, done.text
    assert dev_server.request("GET", "/api/v1/jobs/stats", key=other).status_code == 200
    requests.get(dev_server.url + "/api/v1/jobs/stats", timeout=5)  # no key: nobody's

    theirs = dev_server.request("GET", "/_dev/requests", key=other).json()
    assert [(e["method"], e["path"]) for e in theirs] == [("GET", "/api/v1/jobs/stats")]
    text = str(theirs)
    assert job not in text and lease not in text
    mine = dev_server.requests_seen()
    assert {e["path"] for e in mine} == {"/api/v1/jobs", "/api/v1/jobs/claim", f"/api/v1/jobs/{job}/complete"}
    assert [e["lease_id"] for e in mine if e["lease_id"]] == [lease]
    assert all(e["status"] != 401 for e in mine)


@pytest.mark.timeout(60)
def test_faults_apply_to_the_organization_that_set_them(dev_server):
    other = second_org(dev_server)
    r = dev_server.request("POST", "/_dev/faults", json={"fail_503": 1.0}, key=other)
    assert r.status_code == 200 and r.json()["fail_503"] == 1.0
    assert dev_server.request("GET", "/api/v1/jobs/stats", key=other).status_code == 503  # its own requests
    for _ in range(20):  # the first organization's are untouched
        assert dev_server.request("GET", "/api/v1/jobs/stats").status_code == 200
    assert dev_server.request("GET", "/_dev/faults").json()["fail_503"] == 0
    dev_server.set_faults(delay_ms=200)
    assert dev_server.request("GET", "/_dev/faults", key=other).json() == {
        "fail_503": 1.0, "delay_ms": 0, "cut": 0.0, "delay_fraction": 1.0, "fail_status": 503}
    dev_server.set_faults(delay_ms=0)


def open_stream(server, key: str, lines: list, stop: threading.Event) -> threading.Thread:
    def read():
        try:
            with requests.get(server.url + "/api/v1/events", headers={"Authorization": f"Bearer {key}"},
                              stream=True, timeout=(5, 30)) as r:
                lines.append(("status", r.status_code))
                for line in r.iter_lines():
                    lines.append(("line", line))
                    if stop.is_set():
                        return
        except requests.RequestException as exc:
            lines.append(("error", repr(exc)))
        lines.append(("closed", None))

    t = threading.Thread(target=read, daemon=True)
    t.start()
    return t


@pytest.mark.timeout(60)
def test_event_stream_controls_apply_to_the_callers_organization(dev_server):
    other = second_org(dev_server)
    mine: list = []
    stop = threading.Event()
    reader = open_stream(dev_server, dev_server.api_key, mine, stop)
    try:
        wait_until(lambda: dev_server.request("GET", "/_dev/events").json()["streams"] == 1, timeout=10,
                   what="the first organization's stream open")
        assert dev_server.request("GET", "/_dev/events", key=other).json()["streams"] == 0
        r = dev_server.request("POST", "/_dev/events/drop", json={"refuse_secs": 30}, key=other)
        assert r.json() == {"dropped": 0}
        assert dev_server.request("GET", "/api/v1/events", key=other, stream=True).status_code == 503
        dev_server.enqueue("q-events", {"n": 1})  # the first organization's stream still carries its events
        wait_until(lambda: any(kind == "line" and b"job.created" in line for kind, line in mine), timeout=10,
                   what="job.created on the first organization's stream")
        assert ("closed", None) not in mine
        assert dev_server.request("GET", "/_dev/events").json()["streams"] == 1
        # its own drop ends its own stream
        assert dev_server.request("POST", "/_dev/events/drop").json() == {"dropped": 1}
        wait_until(lambda: ("closed", None) in mine, timeout=10, what="the first stream closed by its own drop")
    finally:
        stop.set()
        reader.join(timeout=5)
