"""An idle daemon learns of new jobs from the API's events stream, not by polling: the real dev server,
daemon and children. `--poll-interval 60` puts the daemon's safety poll a minute apart, so a job finished
within the test's wait was found through the stream (or the re-check when the stream came back)."""

from __future__ import annotations

import signal

import pytest
from conftest import DevServer, wait_for_status, wait_until

pytestmark = pytest.mark.timeout(90)

SLOW_POLL = ["--poll-interval", "60", "--lease", "30", "--log-level", "debug"]
HANDLER = "supervisor.demo_handlers:misbehave"


def claims_since(server: DevServer, since: float) -> int:
    return sum(1 for r in server.requests_seen(since) if r["path"] == "/api/v1/jobs/claim")


def streams_opened(server: DevServer, status: int = 200) -> int:
    return sum(1 for r in server.requests_seen() if r["path"] == "/api/v1/events" and r["status"] == status)


def settled(server: DevServer) -> float:
    """The time after the daemon's last claim so far, once a second passed with no new one (its re-check
    after the stream went live is answered empty; the next poll is a minute away)."""
    state = {"last": None}

    def quiet():
        claims = [r["t"] for r in server.requests_seen() if r["path"] == "/api/v1/jobs/claim"]
        last = claims[-1] if claims else None
        if last is not None and last == state["last"]:
            return last
        state["last"] = last
        return None

    return wait_until(quiet, timeout=15, interval=1.0, what="the daemon's claims to settle")


def test_a_job_created_while_idle_is_claimed_through_the_event(dev_server, daemon_factory):
    daemon = daemon_factory("wake-q", handler=HANDLER, args=SLOW_POLL).wait_ready()
    daemon.wait_events("listening for new jobs on the events stream")
    since = settled(dev_server)

    job = dev_server.enqueue("wake-q", {"value": 7})
    [done] = wait_for_status(dev_server, [job], timeout=15)

    assert done["result"]["echo"] == {"value": 7}
    daemon.wait_events("job claimed", job_id=job)
    msgs = [(r.get("msg"), r.get("job_id")) for r in daemon.records()]
    assert msgs.index(("job announced", job)) < msgs.index(("job claimed", job)), "claimed on its announcement"
    assert claims_since(dev_server, since) <= 2, "the job was claimed on its event, not found by repeated polls"
    assert not daemon.events("the API offers no events stream (404): finding new jobs by polling")


def test_a_dropped_stream_reconnects_and_a_job_created_meanwhile_is_found(dev_server, daemon_factory):
    daemon = daemon_factory("wake-drop", handler=HANDLER, args=SLOW_POLL).wait_ready()
    daemon.wait_events("listening for new jobs on the events stream")
    settled(dev_server)
    opened = streams_opened(dev_server)

    answer = dev_server.request("POST", "/_dev/events/drop", json={"refuse_secs": 2})
    assert answer.json()["dropped"] >= 1
    job = dev_server.enqueue("wake-drop", {"value": 1})  # no stream is open to announce it

    wait_for_status(dev_server, [job], timeout=20)
    wait_until(lambda: streams_opened(dev_server) > opened, timeout=20, what="the events stream to reopen")
    later = dev_server.enqueue("wake-drop", {"value": 2})
    wait_for_status(dev_server, [later], timeout=15)
    daemon.wait_events("job announced", job_id=later)  # the reopened stream announced it


def test_a_server_without_the_route_means_polling_said_once(tmp_path, daemon_factory):
    server = DevServer(str(tmp_path / "old.db"), extra=["--events", "off"]).start()
    try:
        from conftest import Daemon

        daemon = Daemon(server, "old-q", handler=HANDLER, args=["--poll-interval", "0.5"]).start()
        try:
            daemon.wait_ready()
            daemon.wait_events("the API offers no events stream (404): finding new jobs by polling")
            job = server.enqueue("old-q", {"value": 3})
            wait_for_status(server, [job], timeout=15)
            assert len(daemon.events("the API offers no events stream (404): finding new jobs by polling")) == 1
            assert streams_opened(server, 404) == 1, "a 404 is final: the daemon does not keep asking"
        finally:
            daemon.stop()
    finally:
        server.stop()


def test_a_drain_drops_the_stream_while_the_job_in_hand_finishes(dev_server, daemon_factory):
    daemon = daemon_factory("wake-drain", handler=HANDLER, args=SLOW_POLL).wait_ready()
    daemon.wait_events("listening for new jobs on the events stream")
    job = dev_server.enqueue("wake-drain", {"do": "sleep", "secs": 3})
    daemon.wait_events("job claimed", job_id=job)

    daemon.signal(signal.SIGTERM)
    wait_until(lambda: dev_server.request("GET", "/_dev/events").json()["streams"] == 0, timeout=10,
               what="the events stream to close on drain")
    assert daemon.proc.poll() is None, "still draining: the job in hand is not done yet"
    assert daemon.wait(30) == 0
    assert dev_server.job(job)["status"] == "completed"
