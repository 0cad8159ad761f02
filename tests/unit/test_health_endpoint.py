"""The health endpoint on a real port with a fake snapshot, and `python -m supervisor status` against it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import requests
from conftest import ROOT, free_port

from supervisor.ops.health import HealthServer
from supervisor.ops.metrics import DaemonMetrics


def healthy_snapshot() -> dict:
    return {
        "worker_id": "worker-7", "queue": "emails", "pid": 4321, "version": "0.1.0",
        "registered": True, "draining": False, "loop_age_secs": 0.05, "api_age_secs": 1.5,
        "procs": 3, "busy": 1,
        "children": [
            {"slot": 1, "pid": 5002, "state": "idle", "job_id": None, "job_runtime_secs": None,
             "rss_bytes": 31457280, "jobs_done": 7, "restarts": 1},
            {"slot": 0, "pid": 5001, "state": "busy", "job_id": "job_abc123", "job_runtime_secs": 125.4,
             "rss_bytes": 52428800, "jobs_done": 12, "restarts": 0},
            {"slot": 2, "pid": 5003, "state": "starting", "job_id": None, "job_runtime_secs": None,
             "rss_bytes": None, "jobs_done": 0, "restarts": 2},
        ],
    }


class FakeDaemon:
    """A mutable snapshot source; set `error` to make snapshot() raise."""

    def __init__(self):
        self.snap = healthy_snapshot()
        self.error: Exception | None = None

    def snapshot(self) -> dict:
        if self.error:
            raise self.error
        return dict(self.snap)


@pytest.fixture
def daemon():
    return FakeDaemon()


@pytest.fixture
def server(daemon):
    metrics = DaemonMetrics(queues=["emails"])
    metrics.job_settled("emails", "completed", 0.5)
    srv = HealthServer("127.0.0.1", 0, daemon.snapshot, metrics, max_loop_age=10, max_api_silence=60).start()
    yield srv
    srv.stop()


def get(srv: HealthServer, path: str) -> requests.Response:
    return requests.get(f"http://127.0.0.1:{srv.port}{path}", timeout=5)


def test_binds_a_free_port_and_stops(daemon):
    srv = HealthServer("127.0.0.1", 0, daemon.snapshot, DaemonMetrics()).start()
    port = srv.port
    assert port > 0
    assert get(srv, "/healthz").status_code == 200
    srv.stop()
    with pytest.raises(requests.ConnectionError):
        requests.get(f"http://127.0.0.1:{port}/healthz", timeout=2)


def test_healthz_fails_only_on_a_stalled_loop(server, daemon):
    r = get(server, "/healthz")
    assert r.status_code == 200
    assert r.json()["status"] == "ok"

    daemon.snap["loop_age_secs"] = 12.0
    r = get(server, "/healthz")
    assert r.status_code == 503
    assert "main loop" in r.json()["reason"]

    daemon.snap["loop_age_secs"] = 0.1
    for api_age in (61.0, 86400.0, None):  # an API outage of any length, or no answer yet: still live
        daemon.snap["api_age_secs"] = api_age
        assert get(server, "/healthz").status_code == 200


def test_healthz_fails_when_no_child_has_been_up_for_two_minutes(server, daemon):
    daemon.snap["children_down_secs"] = 119.9  # e.g. a slow handler import at start: the startup probe's time
    assert get(server, "/healthz").status_code == 200
    daemon.snap["children_down_secs"] = 120.0
    r = get(server, "/healthz")
    assert r.status_code == 503 and "no child process has been up for 120.0s" in r.json()["reason"]
    daemon.snap["draining"] = True  # a drain stops the children on purpose
    assert get(server, "/healthz").status_code == 200


def test_readyz(server, daemon):
    assert get(server, "/readyz").status_code == 200
    daemon.snap["draining"] = True
    r = get(server, "/readyz")
    assert (r.status_code, r.json()["reason"]) == (503, "draining")
    daemon.snap.update(draining=False, registered=False)
    r = get(server, "/readyz")
    assert (r.status_code, r.json()["reason"]) == (503, "not registered")
    daemon.snap.update(registered=True, api_age_secs=60.0)
    r = get(server, "/readyz")
    assert r.status_code == 503 and "API last answered 60.0s ago (limit 60" in r.json()["reason"]
    daemon.snap["api_age_secs"] = 59.9
    assert get(server, "/readyz").status_code == 200


def test_metrics_and_status_routes(server, daemon):
    r = get(server, "/metrics")
    assert r.status_code == 200
    assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    assert 'spooled_supervisor_jobs_total{queue="emails",outcome="completed"} 1' in r.text.splitlines()

    r = get(server, "/status")
    assert r.status_code == 200
    assert r.headers["Content-Type"] == "application/json"
    assert r.json() == daemon.snap

    assert get(server, "/nope").status_code == 404
    head = requests.head(f"http://127.0.0.1:{server.port}/readyz", timeout=5)
    assert head.status_code == 200 and head.content == b""


def test_raising_snapshot_gives_500_and_server_survives(server, daemon):
    daemon.error = RuntimeError("in-flight table changed size")
    for path in ("/healthz", "/readyz", "/status"):
        r = get(server, path)
        assert r.status_code == 500
        assert "in-flight table changed size" in r.json()["error"]
    daemon.error = None
    assert get(server, "/healthz").status_code == 200
    assert get(server, "/metrics").status_code == 200


def run_status(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "supervisor", "status", *args], cwd=ROOT,
                          env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=60)


def test_status_command_prints_the_children_table(server):
    out = run_status("--health-url", f"http://127.0.0.1:{server.port}")
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "worker-7" in text and "emails" in text and "registered" in text and "1/3" in text
    lines = text.splitlines()
    header_at = next(i for i, line in enumerate(lines) if line.split()[:3] == ["SLOT", "PID", "STATE"])
    rows = [line.split() for line in lines[header_at + 1:]]
    assert [row[0] for row in rows] == ["0", "1", "2"]  # ordered by slot
    assert rows[0] == ["0", "5001", "busy", "job_abc123", "2m05s", "50.0", "12", "0"]
    assert rows[1] == ["1", "5002", "idle", "-", "-", "30.0", "7", "1"]
    assert rows[2] == ["2", "5003", "starting", "-", "-", "-", "0", "2"]


def test_status_command_reads_port_from_env(server, daemon):
    daemon.snap["draining"] = True
    out = run_status(env={"SPOOLED_HEALTH_PORT": str(server.port)})
    assert out.returncode == 0, out.stderr
    assert "draining" in out.stdout


def test_status_command_unreachable_daemon_exits_1():
    port = free_port()
    out = run_status("--port", str(port))
    assert out.returncode == 1
    assert out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and f"127.0.0.1:{port}" in lines[0] and "error" in lines[0]


def test_status_table_names_every_queue_and_every_slot():
    from supervisor.commands.status import render

    text = render({"worker_id": "w", "queue": "emails", "procs": 2, "busy": 1,
                   "queues": {"emails": {"inflight": 1}, "reports": {"inflight": 0}},
                   "children": [{"slot": 0, "pid": 5, "state": "busy", "job_id": "j"}],
                   "failing": [{"slot": 1, "failures": 3, "last_error": "ImportError: no\nTraceback ...",
                                "retry_in_secs": 4.0}]})
    assert "queues   emails (1 in flight), reports" in text
    assert [line.split()[:3] for line in text.splitlines() if line[:1].isdigit()] == [["0", "5", "busy"],
                                                                                      ["1", "-", "failing"]]
    assert "slot 1 failing to start (3 in a row, retries in 4.0s): ImportError: no" in text


def half_requests(port: int, count: int) -> list:
    """`count` loopback connections that each sent half a request head and wait."""
    import socket

    socks = []
    for _ in range(count):
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        socks.append(s)
    return socks


@pytest.mark.timeout(60)
def test_answers_keep_coming_while_hundreds_of_idle_clients_hold_sockets(server):
    import threading
    import time

    threads_before = threading.active_count()
    socks = half_requests(server.port, 300)
    try:
        for _ in range(20):  # each answered at once, though 300 clients wait mid-request
            started = time.monotonic()
            assert get(server, "/healthz").status_code == 200
            assert time.monotonic() - started < 2.0
        assert threading.active_count() == threads_before  # one serving thread, whatever the clients hold
        from supervisor.ops import health

        assert server.connection_count() <= health.MAX_CONNECTIONS
    finally:
        for s in socks:
            s.close()


@pytest.mark.timeout(30)
def test_a_request_that_does_not_come_whole_in_time_is_closed(server, monkeypatch):
    import time

    from supervisor.ops import health

    monkeypatch.setattr(health, "REQUEST_TIMEOUT", 0.5)
    idle, dribble = half_requests(server.port, 2)
    started = time.monotonic()
    dribble.settimeout(0.1)
    closed = False
    while time.monotonic() - started < 5:  # one byte every 100 ms: each read is quick, the head never ends
        try:
            dribble.sendall(b"X")
            if dribble.recv(100) == b"":
                closed = True
                break
        except TimeoutError:
            continue
        except OSError:
            closed = True
            break
    assert closed and time.monotonic() - started < 3
    idle.settimeout(3)
    assert idle.recv(100) == b""  # the silent one too
    idle.close()
    dribble.close()
    assert get(server, "/healthz").status_code == 200


def raw_exchange(port: int, data: bytes, until: bytes) -> bytes:
    import socket

    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(data)
        out = b""
        while until not in out:
            chunk = s.recv(65536)
            if not chunk:
                break
            out += chunk
        return out


def test_kept_alive_and_pipelined_requests_are_answered_in_order(server):
    two = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\nGET /nope HTTP/1.1\r\nHost: x\r\n\r\n"
    out = raw_exchange(server.port, two, b"not found")
    assert out.startswith(b"HTTP/1.1 200") and out.count(b"HTTP/1.1 ") == 2 and b"HTTP/1.1 404" in out


@pytest.mark.parametrize(("request_bytes", "status"), [
    (b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 20000 + b"\r\n\r\n", b"431"),
    (b"POST /drain HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n", b"411"),
    (b"POST /drain HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999\r\n\r\n", b"413"),
    (b"POST /drain HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n", b"400"),
])
def test_requests_it_will_not_read_get_an_answer_and_a_close(server, request_bytes, status):
    out = raw_exchange(server.port, request_bytes, b"\n}")
    assert out.split(b" ")[1] == status
    assert get(server, "/healthz").status_code == 200


@pytest.mark.timeout(30)
def test_thousands_of_pipelined_requests_on_one_connection_are_all_answered_and_others_still_served(server, caplog):
    """Each pipelined request waits for the answer before it, one per turn: nothing recurses, so a flood on
    one connection neither ends the server (at DEBUG too, as `dev` runs it) nor holds the others out."""
    import socket

    caplog.set_level("DEBUG", logger="supervisor")
    count = 2000
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n" * count)
        out = b""
        while out.count(b"HTTP/1.1 200") < count:
            assert get(server, "/healthz").status_code == 200  # another connection is answered meanwhile
            chunk = s.recv(1 << 20)
            assert chunk, f"the server closed after {out.count(b'HTTP/1.1 200')} answers"
            out += chunk
    assert out.count(b"HTTP/1.1 ") == count
    assert server._thread is not None and server._thread.is_alive()
