"""Shared test helpers: start the real dev server and the real daemon as subprocesses.

Every helper polls for a condition with a deadline; none sleeps a fixed time.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import requests

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable


def wait_until(predicate, timeout: float = 10.0, interval: float = 0.02, what: str = "condition"):
    """Poll `predicate` until it returns a truthy value; return it, or fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class OutputPump:
    """Reads a subprocess's stream on a thread so it never blocks on a full pipe; keeps every line."""

    def __init__(self, stream):
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, args=(stream,), daemon=True)
        self._thread.start()

    def _run(self, stream):
        for raw in iter(stream.readline, ""):
            with self._cond:
                self.lines.append(raw.rstrip("\n"))
                self._cond.notify_all()
        stream.close()

    def text(self) -> str:
        with self._cond:
            return "\n".join(self.lines)

    def wait_for(self, pattern: str, timeout: float = 15.0) -> re.Match:
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for line in self.lines:
                    m = rx.search(line)
                    if m:
                        return m
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no line matching {pattern!r} within {timeout}s; output:\n" + "\n".join(self.lines[-50:]))
                self._cond.wait(left)


class DevServer:
    """A real `python -m supervisor dev-server` subprocess on a free loopback port."""

    def __init__(self, db: str, port: int | None = None, extra: list[str] | None = None, env: dict | None = None):
        self.db = db
        self.port = port or free_port()
        self.extra = list(extra or [])
        self.env = env
        self.proc: subprocess.Popen | None = None
        self.url = f"http://127.0.0.1:{self.port}"
        self.api_key: str | None = None

    def start(self) -> "DevServer":
        env = dict(os.environ)
        env.pop("SPOOLED_API_KEY", None)
        env.update(self.env or {})
        cmd = [PY, "-m", "supervisor", "dev-server", "--host", "127.0.0.1", "--port", str(self.port), "--db", self.db, *self.extra]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.out = OutputPump(self.proc.stdout)
        self.api_key = self.out.wait_for(r"API key: (\S+)").group(1)
        self.out.wait_for(r"listening on http://")
        wait_until(self._ready, timeout=10, what="dev server /health/ready")
        return self

    def _ready(self) -> bool:
        try:
            return requests.get(self.url + "/health/ready", timeout=1).status_code == 200
        except requests.RequestException:
            return False

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    # --- a tiny raw client for tests ---
    def headers(self, key: str | None = None) -> dict:
        return {"Authorization": f"Bearer {key or self.api_key}", "Content-Type": "application/json"}

    def request(self, method: str, path: str, json=None, key: str | None = None, **kw) -> requests.Response:
        return requests.request(method, self.url + path, json=json, headers=self.headers(key), timeout=10, **kw)

    def enqueue(self, queue: str, payload, **fields) -> str:
        r = self.request("POST", "/api/v1/jobs", json={"queue_name": queue, "payload": payload, **fields})
        assert r.status_code == 201, r.text
        return r.json()["id"]

    def job(self, job_id: str) -> dict:
        r = self.request("GET", f"/api/v1/jobs/{job_id}")
        assert r.status_code == 200, r.text
        return r.json()

    def worker(self, worker_id: str) -> dict | None:
        r = self.request("GET", f"/api/v1/workers/{worker_id}")
        return r.json() if r.status_code == 200 else None

    def stats(self) -> dict:
        return self.request("GET", "/api/v1/jobs/stats").json()


@pytest.fixture
def dev_server(tmp_path):
    server = DevServer(str(tmp_path / "dev.db"), extra=["--lease-sweep-interval", "0.2"]).start()
    yield server
    server.stop()
