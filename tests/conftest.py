"""Shared test helpers: start the real dev server and the real daemon as subprocesses.

Every helper polls for a condition with a deadline; none sleeps a fixed time. Every DevServer and
Daemon started during a test is ended, with its whole process group, when the test ends, however it
ends (`_owned_processes`), and so is every other process the test started, however deep and whatever
session it moved to (the demo, a benchmark, a nested pytest and what they start): each carries the test's
OWNER_VARIABLE in its environment. Subprocesses get a TMPDIR of their own, removed afterwards, and write no
bytecode into the checkout. In CI (CI set), a skip whose reason is not in EXPECTED_SKIPS fails the run,
a whole module skipped at collection (a module-level importorskip) included.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest
import requests

from supervisor import testing

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
sys.dont_write_bytecode = True  # no __pycache__ in the checkout from what the tests import
os.environ["PYTHONDONTWRITEBYTECODE"] = "1"  # nor from the subprocesses they start

# Skips CI accepts (a substring of the reason). Anything else skipped with CI set fails the session. None today:
# CI runs as root with a memory controller and the systemd box's needs, so the memory-pressure tests
# (test_memory_cgroup) and the systemd tests must run there.
EXPECTED_SKIPS: tuple[str, ...] = ()

_STARTED: list[subprocess.Popen] = []  # every process a helper started; ended by _owned_processes


def own(proc: subprocess.Popen) -> subprocess.Popen:
    """Hand a process (started with start_new_session=True) to _owned_processes, which ends it after the test."""
    _STARTED.append(proc)
    return proc


def end_process_group(proc: subprocess.Popen, grace: float = 10.0) -> None:
    """SIGTERM the process, wait up to `grace`, then SIGKILL its process group (children included)."""
    if proc.poll() is None:
        try:
            proc.send_signal(signal.SIGTERM)
            proc.wait(grace)
        except (subprocess.TimeoutExpired, ProcessLookupError):
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # whatever is left of its group (forkserver, children)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        pass


CORES_WAIT_SECS = 900.0  # the longest a test waits for the cores lock (outside its own timeout)
_CORES_UNAVAILABLE = pytest.StashKey[str]()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    """Under pytest-xdist, a test marked `exclusive` (it keeps both cores busy and its outcome depends on
    getting them: the chaos runs, the benchmark runs) runs while no other test does; the others share.

    Two flock(2)ed files in the directory every worker of the session shares: the others hold `cores`
    shared; an exclusive test takes `turnstile`, which the others pass through before they take `cores`
    (so they cannot keep it from ever being free), then holds `cores` exclusively. Serially: nothing.
    The wait comes before pytest-timeout starts the test's clock (this wrapper runs outside its one), so
    waiting for the cores never uses up a test's own timeout; it has its own, CORES_WAIT_SECS, after which
    the test fails saying so (`_cores`) instead of running without the lock."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return (yield)
    shared = Path(str(item.config._tmp_path_factory.getbasetemp())).parent
    exclusive = item.get_closest_marker("exclusive") is not None
    deadline = time.monotonic() + CORES_WAIT_SECS
    held: list[int] = []
    try:
        held.append(_locked(shared / "turnstile.lock", fcntl.LOCK_EX, deadline))
        held.append(_locked(shared / "cores.lock", fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH, deadline))
        if not exclusive:
            os.close(held.pop(0))  # through the turnstile: an exclusive test waiting there goes next
    except TimeoutError as waited:
        item.stash[_CORES_UNAVAILABLE] = str(waited)
    try:
        return (yield)
    finally:
        for fd in held:
            os.close(fd)


@pytest.fixture(autouse=True)
def _cores(request):
    """Fail a test that never got the cores lock (pytest_runtest_protocol waited CORES_WAIT_SECS for it)."""
    unavailable = request.node.stash.get(_CORES_UNAVAILABLE, None)
    if unavailable:
        pytest.fail(unavailable)


def _locked(path: Path, mode: int, deadline: float) -> int:
    """A descriptor of `path` holding flock `mode`, polled for until `deadline` (then TimeoutError)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        while True:
            try:
                fcntl.flock(fd, mode | fcntl.LOCK_NB)
                return fd
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"waited {CORES_WAIT_SECS:.0f}s for the cores lock ({path.name})") from None
                time.sleep(0.05)
    except BaseException:  # never leave the descriptor (and a lock) behind
        os.close(fd)
        raise


OWNER_VARIABLE = "SST_TEST_OWNER"  # set to one value per test in the environment every subprocess inherits


@pytest.fixture(autouse=True)
def _owned_processes(monkeypatch, _cores):
    """Own every process a test starts. At teardown, whatever the outcome: every DevServer / Daemon (and its
    process group) is stopped, daemons first so they can deregister; then every process still carrying this
    test's OWNER_VARIABLE is SIGKILLed (the demo's dev server, a benchmark's pool, a nested pytest's daemon,
    whatever left its group or session). Processes started outside the test (module fixtures) carry none.
    Subprocesses get a short TMPDIR of their own (multiprocessing's pymp-* dirs land there), removed after."""
    tmp = tempfile.mkdtemp(prefix="sst-")  # short: AF_UNIX paths inside it stay under 107 bytes
    monkeypatch.setenv("TMPDIR", tmp)
    owner = uuid.uuid4().hex
    monkeypatch.setenv(OWNER_VARIABLE, owner)
    mark = len(_STARTED)
    try:
        yield
    finally:
        started, _STARTED[mark:] = _STARTED[mark:], []
        for proc in reversed(started):  # daemons (started after their server) first
            end_process_group(proc)
        end_owned(owner)
        shutil.rmtree(tmp, ignore_errors=True)


def _shared_helpers() -> set[int]:
    """This process's own multiprocessing helpers (resource tracker, forkserver): started by whichever test
    first needed one, they serve every test after it."""
    import multiprocessing.forkserver
    import multiprocessing.resource_tracker

    pids = {getattr(multiprocessing.resource_tracker._resource_tracker, "_pid", None),
            getattr(multiprocessing.forkserver._forkserver, "_forkserver_pid", None)}
    return {pid for pid in pids if pid}


def owned_pids(owner: str) -> list[int]:
    """Pids of the live processes whose environment carries OWNER_VARIABLE=owner (this process and its shared
    multiprocessing helpers excluded)."""
    needle = f"{OWNER_VARIABLE}={owner}".encode()
    spared = {os.getpid(), *_shared_helpers()}
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in spared:
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    pids.append(int(name))
        except OSError:  # gone, or not ours to read
            continue
    return pids


def end_owned(owner: str, timeout: float = 10.0) -> None:
    """SIGKILL every process carrying OWNER_VARIABLE=owner until none is left (or `timeout`)."""
    deadline = time.monotonic() + timeout
    while (pids := owned_pids(owner)) and time.monotonic() < deadline:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for pid in pids:  # reap the ones that are this process's own children
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
        time.sleep(0.02)


_SKIPS: list[tuple[str, str]] = []


def pytest_runtest_logreport(report):
    if report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        _SKIPS.append((report.nodeid, reason))


def pytest_collectreport(report):
    """A module skipped while it is collected (a module-level importorskip, say) skips every test in it
    without a test report: count it like a skipped test."""
    if report.skipped:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        _SKIPS.append((report.nodeid, reason))


def unexpected_skips() -> list[tuple[str, str]]:
    return [(node, reason) for node, reason in _SKIPS if not any(ok in reason for ok in EXPECTED_SKIPS)]


def pytest_sessionfinish(session, exitstatus):
    if os.environ.get("CI") and unexpected_skips() and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if os.environ.get("CI") and unexpected_skips():
        terminalreporter.section("skips not allowed in CI (CI is set)", red=True)
        for node, reason in unexpected_skips():
            terminalreporter.line(f"{node}: {reason}")


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


def parse_ts(text: str) -> float:
    """An RFC 3339 timestamp from the server as Unix seconds."""
    from datetime import datetime

    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class OutputPump(testing.OutputPump):
    """The plugin's pump keeping every line, and a `wait_for` that fails the test with the output's tail."""

    def __init__(self, stream):
        super().__init__(stream, keep=None)

    def wait_for(self, pattern: str, timeout: float = 15.0) -> re.Match:
        found = self.search(pattern, timeout)
        if found is None:
            raise AssertionError(f"no line matching {pattern!r} within {timeout}s; output:\n{self.tail(50)}")
        return found


class DevServer:
    """A real `python -m supervisor dev-server` subprocess on loopback: on the port it binds itself (port 0, read
    back from its start line: no other process can take it in between), or on `port` (a restart on the same
    address)."""

    def __init__(self, db: str, port: int | None = None, extra: list[str] | None = None, env: dict | None = None):
        self.db = db
        self.port = port or 0
        self.extra = list(extra or [])
        self.env = env
        self.proc: subprocess.Popen | None = None
        self.url = f"http://127.0.0.1:{self.port}"
        self.api_key: str | None = None

    def start(self) -> DevServer:
        env = dict(os.environ)
        env.pop("SPOOLED_API_KEY", None)
        env.update(self.env or {})
        cmd = [
            PY,
            "-m",
            "supervisor",
            "dev-server",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--db",
            self.db,
            *self.extra,
        ]
        self.proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
        )
        _STARTED.append(self.proc)
        self.out = OutputPump(self.proc.stdout)
        shown = self.out.wait_for(r"API key: (.+)").group(1)
        self.api_key = shown if not shown.startswith("from ") else self.given_key()  # a given key is never shown
        self.port = int(self.out.wait_for(r"listening on http://127\.0\.0\.1:(\d+)").group(1))
        self.url = f"http://127.0.0.1:{self.port}"
        wait_until(self._ready, timeout=10, what="dev server /health/ready")
        return self

    def given_key(self) -> str:
        """The key this test gave the server (--api-key, else its environment)."""
        if "--api-key" in self.extra:
            return self.extra[self.extra.index("--api-key") + 1]
        env = self.env or {}
        return env.get("SPOOLED_API_KEY") or env["SPOOLED_DEV_API_KEY"]

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
                pass
        if self.proc:
            end_process_group(self.proc)

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

    # --- the dev-only switches (supervisor/devserver/devtools.py) ---
    def requests_seen(self, since: float = 0.0) -> list[dict]:
        """The /api/v1 requests the server answered after `since` (Unix time): method, path, status, lease_id,
        received (body read) and t (answered)."""
        r = self.request("GET", f"/_dev/requests?since={since}")
        assert r.status_code == 200, r.text
        return r.json()

    def expire_lease(self, job_id: str) -> None:
        r = self.request("POST", f"/_dev/leases/{job_id}/expire")
        assert r.status_code == 200, r.text

    def steal_lease(self, job_id: str, worker_id: str = "dev-thief", secs: int = 60) -> dict:
        r = self.request(
            "POST", f"/_dev/leases/{job_id}/steal", json={"worker_id": worker_id, "lease_duration_secs": secs}
        )
        assert r.status_code == 200, r.text
        return r.json()

    def set_faults(self, **faults) -> dict:
        r = self.request("POST", "/_dev/faults", json=faults)
        assert r.status_code == 200, r.text
        return r.json()


@pytest.fixture
def dev_server(tmp_path):
    server = DevServer(str(tmp_path / "dev.db"), extra=["--lease-sweep-interval", "0.2"]).start()
    yield server
    server.stop()


class Daemon:
    """A real `python -m supervisor run` subprocess; the key reaches it only through its environment."""

    def __init__(
        self,
        server: DevServer,
        queue: str,
        handler: str = "supervisor.demo_handlers:misbehave",
        procs: int = 2,
        worker_id: str = "test-worker",
        args: list[str] | None = None,
        env: dict | None = None,
        key: str | None = None,
    ):
        self.server = server
        self.queue = queue
        self.worker_id = worker_id
        self.cmd = [
            PY,
            "-m",
            "supervisor",
            "run",
            "--queue",
            queue,
            "--handler",
            handler,
            "--procs",
            str(procs),
            "--api-url",
            server.url,
            "--worker-id",
            worker_id,
            "--log-format",
            "json",
            "--poll-interval",
            "0.2",
            "--kill-grace",
            "1",
            *(args or []),
        ]
        self.env = dict(os.environ)
        self.env["SPOOLED_API_KEY"] = key or server.api_key
        self.env.update(env or {})
        self.proc: subprocess.Popen | None = None

    def start(self) -> Daemon:
        self.proc = subprocess.Popen(
            self.cmd,
            cwd=ROOT,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        _STARTED.append(self.proc)
        self.out = OutputPump(self.proc.stdout)
        return self

    def wait_ready(self, timeout: float = 20.0) -> Daemon:
        """Until the daemon is ready with every child up (`ready` comes with the first child up; `every child is
        up` follows when the others came later)."""
        found = self.out.wait_for(r'"msg":"ready".*"children":(\d+),"procs":(\d+)', timeout)
        if int(found.group(1)) < int(found.group(2)):
            self.out.wait_for(r'"msg":"every child is up"', timeout)
        return self

    @property
    def health_port(self) -> int:
        """The port the daemon bound for `--health-port 0`, read from its "serving the health port" line."""
        return int(self.out.wait_for(r'"msg":"serving the health port".*"port":(\d+)', 30).group(1))

    def records(self) -> list[dict]:
        """The daemon's JSON log lines so far, in order."""
        import json

        out = []
        for line in list(self.out.lines):
            if line.startswith("{"):
                try:
                    out.append(json.loads(line))
                except ValueError:
                    continue
        return out

    def events(self, msg: str) -> list[dict]:
        return [record for record in self.records() if record.get("msg") == msg]

    def wait_events(self, msg: str, count: int = 1, timeout: float = 15.0, **match) -> list[dict]:
        """Poll until at least `count` log lines with this `msg` (and these field values) were read; return them.
        The log is read on a thread: a line the daemon wrote a moment ago may not be in `events` yet."""
        def found():
            lines = [e for e in self.events(msg) if all(e.get(k) == v for k, v in match.items())]
            return lines if len(lines) >= count else None

        return wait_until(found, timeout=timeout, what=f"{count} log line(s) {msg!r} {match or ''}")

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def wait(self, timeout: float = 30.0) -> int:
        code = self.proc.wait(timeout)
        self.out.drain()  # every line the daemon wrote is in `events` once it has exited
        return code

    def stop(self) -> None:
        if self.proc:
            end_process_group(self.proc, grace=20)
            if hasattr(self, "out"):
                self.out.drain()

    def busy_child(self, job_id: str) -> int:
        """The pid of the child whose process title says it runs `job_id` (polled until one does)."""
        import psutil

        def find():
            for pid in self.child_pids():
                try:
                    if job_id in " ".join(psutil.Process(pid).cmdline()):
                        return pid
                except psutil.Error:
                    pass
            return None

        return wait_until(find, timeout=10, what=f"a child busy with {job_id}")

    def child_pids(self) -> list[int]:
        """Pids of the handler children (grandchildren via the forkserver), found by process title."""
        import psutil

        pids = []
        for proc in psutil.Process(self.proc.pid).children(recursive=True):
            try:
                if "spooled-supervisor: child" in " ".join(proc.cmdline()):
                    pids.append(proc.pid)
            except psutil.Error:
                pass
        return pids


@pytest.fixture
def daemon_factory(dev_server):
    started: list[Daemon] = []

    def make(queue: str, **kw) -> Daemon:
        d = Daemon(dev_server, queue, **kw)
        started.append(d)
        return d.start()

    yield make
    for d in started:
        d.stop()


@pytest.fixture
def stopped(dev_server):
    """Daemons a test starts itself and appends here are stopped before the dev server is (so they can
    deregister)."""
    daemons: list[Daemon] = []
    yield daemons
    for d in daemons:
        d.stop()


def reload_while_jobs_run(d, server: DevServer, version: Path, ids: list, first: int):
    """The reload-under-load scene: once `first` of `ids` completed, `version` says "two" and `d` (two
    children, running tests.support.handlers_memory's `version` jobs) gets SIGHUP; wait until both children
    are new and every job is done. Returns (signalled, new_at, jobs, runs, later): when the SIGHUP went,
    when every child was new, the jobs, their (started, version) in start order, and the versions of those
    started after every child was new."""
    wait_for_status(server, ids[:first], timeout=30)
    before = set(d.child_pids())
    assert len(before) == 2
    version.write_text("two")
    signalled = time.time()
    d.signal(signal.SIGHUP)
    wait_until(lambda: not (set(d.child_pids()) & before) and len(d.child_pids()) == 2, timeout=60, interval=0.05,
               what="both children replaced")
    new_at = time.time()
    jobs = wait_for_status(server, ids, timeout=60)
    runs = sorted((j["result"]["started"], j["result"]["version"]) for j in jobs)
    return signalled, new_at, jobs, runs, [v for t, v in runs if t > new_at]


def wait_for_status(server: DevServer, job_ids, statuses=("completed",), timeout: float = 30.0) -> list[dict]:
    """Poll until every job reaches one of `statuses`; return the jobs as the server reports them."""

    def check():
        jobs = [server.job(j) for j in job_ids]
        return jobs if all(j["status"] in statuses for j in jobs) else None

    return wait_until(check, timeout=timeout, interval=0.1, what=f"jobs to reach {statuses}")


def scrape(port: int) -> dict:
    """The daemon's /metrics on `port` as {(name, frozenset(labels.items())): value}."""
    samples = {}
    text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    for line in text.splitlines():
        m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$", line)
        if m:
            labels = frozenset(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
            samples[(m.group(1), labels)] = float(m.group(3))
    return samples


def metric(port: int, name: str, **labels) -> float:
    """One sample of the daemon's /metrics (0 if absent); `name` without the spooled_supervisor_ prefix."""
    key = ("spooled_supervisor_" + name, frozenset((k, str(v)) for k, v in labels.items()))
    return scrape(port).get(key, 0.0)
