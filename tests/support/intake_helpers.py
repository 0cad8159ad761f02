"""Helpers shared by the claim-ahead and pacing integration tests (test_claim_ahead.py, test_pacing.py)."""

from __future__ import annotations

import os
import signal

import pytest
import requests
from conftest import Daemon, DevServer


def status(port: int) -> dict:
    """The daemon's /status (its health port)."""
    return requests.get(f"http://127.0.0.1:{port}/status", timeout=5).json()


def dev_stats(server: DevServer, key: str | None = None) -> dict:
    """The dev server's own count of the organization's /api/v1 requests (not rate limited, not counted)."""
    r = server.request("GET", "/_dev/stats", key=key)
    assert r.status_code == 200, r.text
    return r.json()


def log_records(daemon: Daemon) -> list[dict]:
    """The daemon's JSON log lines so far, in order."""
    return daemon.records()


def bulk(server: DevServer, queue: str, payloads: list) -> list[str]:
    """Enqueue up to 100 jobs in one request; their ids in order."""
    r = server.request("POST", "/api/v1/jobs/bulk", json={"queue_name": queue,
                                                          "jobs": [{"payload": p} for p in payloads]})
    assert r.status_code in (200, 201), r.text
    done = r.json()["succeeded"]
    assert len(done) == len(payloads), r.text
    return [item["job_id"] for item in sorted(done, key=lambda i: i["index"])]


@pytest.fixture(name="servers")
def servers_fixture(tmp_path):
    """Start dev servers with extra flags (each on its own database); stop them all at the end."""
    started: list[DevServer] = []

    def make(*extra: str) -> DevServer:
        server = DevServer(str(tmp_path / f"dev{len(started)}.db"), extra=["--lease-sweep-interval", "0.2", *extra])
        started.append(server)
        return server.start()

    yield make
    for server in started:
        server.stop()


@pytest.fixture(name="daemons")
def daemons_fixture():
    """Start daemons against any server; stop them all at the end (continuing one a test left stopped)."""
    started: list[Daemon] = []

    def make(server: DevServer, queue: str, **kw) -> Daemon:
        d = Daemon(server, queue, **kw)
        started.append(d)
        return d.start()

    yield make
    for d in started:
        if d.proc is not None and d.proc.poll() is None:
            os.kill(d.proc.pid, signal.SIGCONT)
        d.stop()
