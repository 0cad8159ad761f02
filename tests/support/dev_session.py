"""A running `python -m supervisor dev` in a folder of its own, for the tests of the developer's loop.

`DevSession(folder, *flags).start()` runs the command in `folder` (a new session, ended after the test by the
suite's guard), reads its banner (URL, key, the signed-in UI URL) and keeps its output; `cli(...)` runs another
subcommand (`enqueue`, `status`) in the same folder, as a user's second terminal would.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import requests
from support.fake_keys import live_shaped

from supervisor import testing

PY = sys.executable
SESSIONS: list[DevSession] = []  # every session started; `end_all` (a fixture's teardown) ends what is left


def env() -> dict[str, str]:
    """The test's environment without SPOOLED_* (as a user's shell), and with a real-looking key exported, which
    `dev` must never adopt."""
    out = {k: v for k, v in os.environ.items() if not k.startswith("SPOOLED_")}
    out["SPOOLED_API_KEY"] = live_shaped("x" * 40)
    out["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p and os.path.isdir(p))
    return out


class DevSession:
    def __init__(self, folder: Path, *flags: str):
        self.folder = folder
        self.flags = list(flags)
        self.proc: subprocess.Popen | None = None
        self.out: testing.OutputPump | None = None
        self.url = self.key = self.ui_url = ""
        SESSIONS.append(self)

    def start(self, timeout: float = 30.0) -> DevSession:
        self.proc = subprocess.Popen([PY, "-m", "supervisor", "dev", *self.flags], cwd=self.folder, env=env(),
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, start_new_session=True)
        self.out = testing.OutputPump(self.proc.stdout, keep=None)
        m = self.wait_for(r"UI, signed in:\s+(http://\S+)/#key=(\S+)", timeout)
        self.ui_url, self.url, self.key = m.group(0).split()[-1], m.group(1), m.group(2)
        return self

    def wait_for(self, pattern: str, timeout: float = 20.0) -> re.Match:
        assert self.out is not None and self.proc is not None
        found = self.out.search(pattern, timeout)
        if found is None:
            raise AssertionError(f"no line matching {pattern!r} within {timeout}s; output:\n{self.out.tail(60)}")
        return found

    def count(self, pattern: str) -> int:
        assert self.out is not None
        return len(re.findall(pattern, self.out.text()))

    def cli(self, *args: str, timeout: float = 30.0) -> subprocess.CompletedProcess:
        return subprocess.run([PY, "-m", "supervisor", *args], cwd=self.folder, env=env(), capture_output=True,
                              text=True, timeout=timeout)

    def enqueue(self, payload: str, *flags: str) -> str:
        done = self.cli("enqueue", "--payload", payload, *flags)
        assert done.returncode == 0, done.stderr
        return done.stdout.split()[0]

    def api(self, method: str, path: str, **kw) -> requests.Response:
        return requests.request(method, self.url + path, headers={"Authorization": f"Bearer {self.key}"},
                                timeout=10, **kw)

    def job(self, job_id: str) -> dict:
        resp = self.api("GET", f"/api/v1/jobs/{job_id}")
        resp.raise_for_status()
        return resp.json()

    def settled(self, job_id: str, timeout: float = 30.0) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            job = self.job(job_id)
            if job["status"] in ("completed", "deadletter", "cancelled"):
                return job
            if time.monotonic() > deadline:
                raise AssertionError(f"job {job_id} still {job['status']}; output:\n{self.out.tail(40)}")
            time.sleep(0.1)

    def stop(self, timeout: float = 30.0) -> int:
        """Ctrl-C (SIGINT) and wait: the daemon drains, `dev` prints its summary."""
        assert self.proc is not None and self.out is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        code = self.proc.wait(timeout)
        self.out.drain()
        return code

    def kill(self) -> None:
        """End `dev` and its daemon (whose own session a kill of dev's group does not reach)."""
        try:
            daemon = json.loads((self.folder / ".spooled" / "dev.json").read_text()).get("daemon_pid")
        except (OSError, ValueError):
            daemon = None
        if daemon:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(int(daemon), signal.SIGKILL)
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)


def end_all() -> None:
    while SESSIONS:
        SESSIONS.pop().kill()
