"""Liveness and readiness of a real daemon while its API is away: /healthz stays 200 (a restart mends no
outage), /readyz turns 503 after --ready-api-silence, and /status and /metrics show how long the API has
been silent. When the API is back, /readyz is 200 again without a restart."""

from __future__ import annotations

import os
import signal

import pytest
import requests
from conftest import Daemon, DevServer, metric, wait_until


def answer(port: int, path: str) -> requests.Response:
    return requests.get(f"http://127.0.0.1:{port}{path}", timeout=5)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("outage", ["stopped", "frozen"])
def test_an_api_outage_fails_readiness_never_liveness(tmp_path, outage):
    db = str(tmp_path / "dev.db")
    server = DevServer(db).start()
    d = Daemon(server, "q-outage", procs=1, worker_id=f"w-outage-{outage}",
               args=["--health-port", "0", "--ready-api-silence", "2", "--api-timeout", "1"]).start()
    port = d.health_port
    try:
        d.wait_ready()
        wait_until(lambda: answer(port, "/readyz").status_code == 200, timeout=10, what="/readyz 200")
        if outage == "stopped":
            server.stop()
        else:
            os.kill(server.proc.pid, signal.SIGSTOP)  # accepts connections, never answers

        def unready():
            r = answer(port, "/readyz")
            return r.json() if r.status_code == 503 else None

        reason = wait_until(unready, timeout=20, what="/readyz 503 during the outage")["reason"]
        assert "Spooled API last answered" in reason
        silent = answer(port, "/status").json()["api_silence_secs"]
        assert silent >= 2
        # The gauge is refreshed once a second, so it may trail /status by up to that much.
        wait_until(lambda: metric(port, "api_last_answer_age_seconds") >= 2, timeout=5,
                   what="the silence gauge at 2 s")
        # Liveness through the outage: every sample 200 until the silence is three times readiness's limit.
        samples = []

        def live_until_long_silence():
            live = answer(port, "/healthz")
            samples.append(live.status_code)
            assert live.status_code == 200, live.text
            return answer(port, "/status").json()["api_silence_secs"] >= 6

        wait_until(live_until_long_silence, timeout=20, interval=0.2, what="six seconds of API silence")
        assert len(samples) > 5 and d.proc.poll() is None

        if outage == "stopped":
            server = DevServer(db, port=server.port).start()  # the same API again
        else:
            os.kill(server.proc.pid, signal.SIGCONT)
        wait_until(lambda: answer(port, "/readyz").status_code == 200, timeout=30, what="/readyz 200 again")
        assert answer(port, "/healthz").status_code == 200
        d.signal(signal.SIGTERM)
        assert d.wait(30) == 0
    finally:
        if server.proc and server.proc.poll() is None:
            os.kill(server.proc.pid, signal.SIGCONT)
        d.stop()
        server.stop()


@pytest.mark.timeout(90)
def test_idle_clients_on_the_health_port_cost_no_threads_and_block_no_answers(dev_server, daemon_factory):
    """400 connections that each send half a request and wait: the parent's thread count stays as it was,
    /healthz keeps answering, and a job still runs (children can start)."""
    import socket
    import time

    d = daemon_factory("q-idle-clients", procs=1, worker_id="w-idle-clients",
                       args=["--health-port", "0", "--health-host", "127.0.0.1"]).wait_ready()
    port = d.health_port
    wait_until(lambda: answer(port, "/healthz").status_code == 200, timeout=10, what="/healthz 200")
    threads = len(os.listdir(f"/proc/{d.proc.pid}/task"))
    socks = []
    try:
        for _ in range(400):
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            s.sendall(b"GET /status HTTP/1.1\r\nHost: x\r\n")
            socks.append(s)
        for _ in range(10):
            started = time.monotonic()
            assert answer(port, "/healthz").status_code == 200
            assert time.monotonic() - started < 2
        assert len(os.listdir(f"/proc/{d.proc.pid}/task")) <= threads
        job = dev_server.enqueue("q-idle-clients", {"do": "echo"})
        wait_until(lambda: dev_server.job(job)["status"] == "completed", timeout=20, what="the job completed")
    finally:
        for s in socks:
            s.close()
