"""Test job handlers the way they really run: a pytest plugin, a dev-server fixture and `run_jobs`.

Installed with the package, pytest loads this module through the `pytest11` entry point `spooled`
(`-p no:spooled` turns it off). It offers:

- the fixture `spooled_dev_server`: a dev server subprocess on a free loopback port with a temporary
  database, yielded as a `DevServer` (`url`, `api_key`, `enqueue`, `job`, `wait`, `queue_stats`,
  `worker`, `run_jobs`) and stopped at the end of the test, whatever happens in it;
- `run_jobs(handler, payloads, ...)`: enqueue the payloads on a fresh queue, run the real daemon
  (`python -m supervisor run`: real children, real framing, the command line's options), wait until
  every job settles, stop the daemon with SIGTERM and return the jobs as the server recorded them,
  in payload order. Without a `server` it starts (and stops) a dev server of its own.

A job is *settled* when its status is final: `completed`, `deadletter` (failed and out of retries),
`failed` or `cancelled`. A failed attempt with retries left goes back to `pending` for a back-off of
min(2^n, 60) s and is not settled yet, so pass `max_retries=0` to see a failure at once.
Every process started here is ended when the call or the fixture ends, on failure too.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import os
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import requests

from supervisor.child.tracing import carry

SETTLED = frozenset({"completed", "deadletter", "failed", "cancelled"})
# Options run_jobs sets itself; the rest of `python -m supervisor run --help` is open to daemon_options.
OWN_OPTIONS = frozenset({"queue", "handler", "procs", "api_url", "api_key", "api_key_file", "worker_id"})
DEFAULT_OPTIONS: dict[str, Any] = {"poll_interval": 0.2}  # a retry due after its back-off is claimed promptly
_OUTPUT_LINES = 400
_worker_numbers = itertools.count(1)


class SpooledTestError(AssertionError):
    """A run could not finish as asked; the message says why and ends with the process's last output."""


class DaemonExited(SpooledTestError):
    """The daemon exited before every job settled (e.g. 3: the handler could not be imported)."""

    def __init__(self, message: str, exit_code: int | None):
        super().__init__(message)
        self.exit_code = exit_code


class JobsNotSettled(SpooledTestError):
    """Some jobs were still pending or processing when the time ran out."""


@dataclass(frozen=True)
class FinishedJob:
    """One job as the server recorded it after it settled; `record` is the whole `GET /jobs/{id}` answer."""

    id: str
    status: str
    result: Any
    last_error: str | None
    retry_count: int
    max_retries: int
    record: dict

    @property
    def ok(self) -> bool:
        return self.status == "completed"

    @classmethod
    def from_record(cls, record: dict) -> FinishedJob:
        return cls(id=record["id"], status=record["status"], result=record.get("result"),
                   last_error=record.get("last_error"), retry_count=record.get("retry_count", 0),
                   max_retries=record.get("max_retries", 0), record=record)


class OutputPump:
    """The lines a subprocess writes, read on a thread so the pipe never fills: the last `keep` of them
    (every one when `keep` is None). Shared with the project's own test fixtures."""

    def __init__(self, stream, keep: int | None = _OUTPUT_LINES):
        self.lines: collections.deque[str] = collections.deque(maxlen=keep)
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True, name="spooled-output")
        self._thread.start()

    def _read(self, stream) -> None:
        for raw in iter(stream.readline, ""):
            with self._changed:
                self.lines.append(raw.rstrip("\n"))
                self._changed.notify_all()
        stream.close()

    def search(self, pattern: str, timeout: float, alive: Callable[[], bool] = lambda: True) -> re.Match | None:
        """The first kept line matching `pattern`, waiting up to `timeout` s while `alive()`; else None."""
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                for line in self.lines:
                    found = rx.search(line)
                    if found:
                        return found
                left = deadline - time.monotonic()
                if left <= 0 or not alive():
                    return None
                self._changed.wait(min(left, 0.2))

    def tail(self, n: int = 60) -> str:
        with self._changed:
            return "\n".join(list(self.lines)[-n:])

    def text(self) -> str:
        with self._changed:
            return "\n".join(self.lines)

    def drain(self, timeout: float = 10.0) -> None:
        """Once the process has exited: wait until every line it wrote has been read."""
        self._thread.join(timeout)


def _child_env(**extra: str) -> dict[str, str]:
    """The test process's environment without SPOOLED_* settings or credentials (a developer's exported
    SPOOLED_QUEUE must not leak into a test), and with its sys.path, so the subprocess and its children
    import `supervisor` and the handler module exactly as the test does."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPOOLED_") and k != "CREDENTIALS_DIRECTORY"}
    paths = [os.path.abspath(p or os.curdir) for p in sys.path]
    paths = [p for p in dict.fromkeys(paths) if os.path.isdir(p)]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.update(extra)
    return env


def _end(proc: subprocess.Popen, grace: float, group: bool) -> int:
    """SIGTERM, wait `grace` s, then SIGKILL (its whole process group when `group`); returns the exit code.

    The group is only signalled while the process is unreaped, so its pid (the group id) cannot be reused."""
    if proc.poll() is not None:
        return proc.returncode
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(grace)
    except subprocess.TimeoutExpired:
        pass
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if group:
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            proc.kill()
    return proc.wait(10)


class DevServer:
    """A `python -m supervisor dev-server` subprocess on a free loopback port, plus a small client.

    Use it as a context manager (or call `start()` and `stop()`); the fixture `spooled_dev_server`
    does that for you. Client calls raise `requests.HTTPError` on an unexpected answer.
    """

    def __init__(self, db_path: str, api_key: str | None = None, extra_args: Sequence[str] = ()):
        self.db_path = db_path
        self.api_key = api_key or "sp_test_" + secrets.token_urlsafe(24)
        self.extra_args = list(extra_args)
        self.url = ""
        self.proc: subprocess.Popen | None = None
        self._out: OutputPump | None = None
        self._http = requests.Session()
        self._http.headers.update({"Authorization": f"Bearer {self.api_key}", "Content-Type": "application/json"})

    def __enter__(self) -> DevServer:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def start(self, timeout: float = 30.0) -> DevServer:
        """Start it and wait until `/health/ready` answers 200; raises SpooledTestError otherwise."""
        cmd = [sys.executable, "-m", "supervisor", "dev-server", "--host", "127.0.0.1", "--port", "0",
               "--db", self.db_path, "--lease-sweep-interval", "0.2", *self.extra_args]
        proc = self.proc = subprocess.Popen(cmd, env=_child_env(SPOOLED_API_KEY=self.api_key),
                                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                            stderr=subprocess.STDOUT, text=True)
        self._out = OutputPump(proc.stdout)
        try:
            found = self._out.search(r"listening on (http://\S+)", timeout, lambda: proc.poll() is None)
            if found is None:
                raise SpooledTestError("the dev server did not start:\n" + self._out.tail())
            self.url = found.group(1)
            self._wait_ready(proc, time.monotonic() + timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self, proc: subprocess.Popen, deadline: float) -> None:
        while True:
            with contextlib.suppress(requests.RequestException):
                if self._http.get(self.url + "/health/ready", timeout=2).status_code == 200:
                    return
            if time.monotonic() > deadline or proc.poll() is not None:
                raise SpooledTestError("the dev server never became ready:\n" + self.output())
            time.sleep(0.05)

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after 10 s); safe to call twice."""
        self._http.close()
        if self.proc is not None:
            _end(self.proc, 10.0, group=False)

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def output(self) -> str:
        return self._out.tail() if self._out else ""

    # ---- client ----
    def request(self, method: str, path: str, json: Any = None) -> requests.Response:
        return self._http.request(method, self.url + path, json=json, timeout=30)

    def _ok(self, method: str, path: str, json: Any = None) -> Any:
        answer = self.request(method, path, json)
        if answer.status_code >= 300:
            raise requests.HTTPError(f"{method} {path}: {answer.status_code} {answer.text[:500]}", response=answer)
        return answer.json() if answer.content else None

    def enqueue(self, queue: str, payload: Any, traceparent: str | None = None, **job_fields: Any) -> str:
        """Create one job (`POST /api/v1/jobs`; fields such as max_retries, timeout_seconds, priority); its id.
        `traceparent` (W3C) goes into the payload, an object, for the job's span to continue that trace."""
        if traceparent is not None:
            payload = carry(payload, traceparent)
        return self._ok("POST", "/api/v1/jobs", {"queue_name": queue, "payload": payload, **job_fields})["id"]

    def job(self, job_id: str) -> dict:
        """The job's full record (`GET /api/v1/jobs/{id}`)."""
        return self._ok("GET", f"/api/v1/jobs/{job_id}")

    def statuses(self, ids: Sequence[str]) -> dict[str, str]:
        """{id: status} for any number of ids (`GET /api/v1/jobs/status`, 100 at a time)."""
        out: dict[str, str] = {}
        for i in range(0, len(ids), 100):
            for row in self._ok("GET", "/api/v1/jobs/status?ids=" + ",".join(ids[i:i + 100])):
                out[row["id"]] = row["status"]
        return out

    def wait(self, ids: Sequence[str], timeout: float = 30.0, check: Callable[[], None] | None = None) -> list[dict]:
        """Poll until every job is settled; return their full records in the order of `ids`.

        Raises JobsNotSettled after `timeout` s. `check()` runs between polls and may raise to stop the
        wait early (run_jobs passes one that raises DaemonExited when the daemon exits).
        """
        ids = list(ids)
        deadline = time.monotonic() + timeout
        while True:
            statuses = self.statuses(ids)
            if all(statuses.get(i) in SETTLED for i in ids):
                return [self.job(i) for i in ids]
            if check is not None:
                try:
                    check()
                except SpooledTestError:  # e.g. a daemon run with until_empty=True that exited after the last job
                    final = self.statuses(ids)
                    if all(final.get(i) in SETTLED for i in ids):
                        return [self.job(i) for i in ids]
                    raise
            if time.monotonic() > deadline:
                counts = collections.Counter(statuses.get(i, "missing") for i in ids)
                raise JobsNotSettled(f"{sum(n for s, n in counts.items() if s not in SETTLED)} of {len(ids)} jobs "
                                     f"not settled after {timeout:g} s: {dict(counts)}")
            time.sleep(0.05)

    def queue_stats(self, queue: str) -> dict:
        """`GET /api/v1/queues/{name}/stats`: pending_jobs, processing_jobs, active_workers, ..."""
        return self._ok("GET", f"/api/v1/queues/{queue}/stats")

    def worker(self, worker_id: str) -> dict | None:
        """The worker's record, or None if the server has never seen it."""
        answer = self.request("GET", f"/api/v1/workers/{worker_id}")
        return answer.json() if answer.status_code == 200 else None

    def run_jobs(self, handler: str | Callable, payloads: Iterable[Any], **kwargs: Any) -> list[FinishedJob]:
        """`run_jobs(handler, payloads, server=self, ...)`."""
        return run_jobs(handler, payloads, server=self, **kwargs)


def handler_spec(handler: str | Callable) -> str:
    """`module:function` for the daemon's --handler: a string as given, or a module-level function."""
    if isinstance(handler, str):
        if ":" not in handler.strip(":"):
            raise ValueError(f"handler must look like package.module:function, got {handler!r}")
        return handler
    module, name = getattr(handler, "__module__", None), getattr(handler, "__qualname__", "")
    if not module or module == "__main__" or "<" in name:
        raise ValueError(f"{handler!r} cannot be imported by a child process: pass a module-level function of an "
                         "importable module, or its 'package.module:function' string")
    return f"{module}:{name}"


def _daemon_actions() -> dict:
    from supervisor.config import build_parser

    # argparse keeps its flag -> action table private; reading it keeps this in step with the real flags.
    return dict(build_parser({})._option_string_actions)


def daemon_args(options: Mapping[str, Any]) -> list[str]:
    """Keyword options -> the daemon's flags: lease=10 -> --lease 10, allow_insecure_http=True -> the bare
    flag, None or False -> left out. Raises TypeError for an unknown option or one run_jobs sets itself."""
    actions = _daemon_actions()
    args: list[str] = []
    for name, value in options.items():
        flag = "--" + name.replace("_", "-")
        if name in OWN_OPTIONS:
            raise TypeError(f"run_jobs sets {flag} itself; {name!r} is not a daemon option here")
        action = actions.get(flag)
        if action is None or flag in ("--help", "--version"):
            raise TypeError(f"unknown daemon option {name!r}: `python -m supervisor run` has no {flag}")
        if value is None or value is False:
            continue
        if action.nargs == 0:  # a switch such as --allow-insecure-http
            if value is not True:
                raise TypeError(f"daemon option {name!r} is a switch: pass True or False, not {value!r}")
            args.append(flag)
        else:
            args += [flag, str(value)]
    return args


class DaemonProcess:
    """A real `python -m supervisor run` subprocess on `server`; the key reaches it only through its environment."""

    def __init__(self, server: DevServer, queue: str, handler: str, procs: int = 1, args: Sequence[str] = (),
                 worker_id: str | None = None):
        self.server = server
        self.worker_id = worker_id or f"pytest-{os.getpid()}-{next(_worker_numbers)}"
        self.argv = [sys.executable, "-m", "supervisor", "run", "--queue", queue, "--handler", handler,
                     "--procs", str(procs), "--api-url", server.url, "--worker-id", self.worker_id,
                     "--log-format", "json", *args]
        self.proc: subprocess.Popen | None = None
        self._out: OutputPump | None = None

    def __enter__(self) -> DaemonProcess:
        return self.start()

    def __exit__(self, exc_type, *rest) -> None:
        # After a failure, a second SIGTERM stops it at once instead of draining.
        self.stop(grace=5.0 if exc_type else 40.0, urgent=exc_type is not None)

    def start(self) -> DaemonProcess:
        self.proc = subprocess.Popen(self.argv, env=_child_env(SPOOLED_API_KEY=self.server.api_key),
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, start_new_session=True)
        self._out = OutputPump(self.proc.stdout)
        return self

    def check_running(self) -> None:
        """Raise DaemonExited (with its exit code and last output) if the daemon is no longer running."""
        code = self.proc.poll() if self.proc else None
        if code is not None:
            raise DaemonExited(f"the daemon exited with code {code} before every job settled; its last output:\n"
                               f"{self.output()}", code)

    def stop(self, grace: float = 40.0, urgent: bool = False) -> int | None:
        """SIGTERM (twice when `urgent`), wait up to `grace` s, then SIGKILL its process group; the exit code."""
        if self.proc is None:
            return None
        if urgent and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(0.5)
        return _end(self.proc, grace, group=True)

    def output(self) -> str:
        return self._out.tail() if self._out else ""


@contextlib.contextmanager
def temporary_dev_server() -> Iterator[DevServer]:
    """A dev server on a database in a temporary directory, both gone afterwards."""
    with tempfile.TemporaryDirectory(prefix="spooled-test-") as tmp, DevServer(os.path.join(tmp, "dev.db")) as server:
        yield server


def run_jobs(handler: str | Callable, payloads: Iterable[Any], *, procs: int = 1, timeout: float = 60.0,
             server: DevServer | None = None, queue: str | None = None, max_retries: int | None = None,
             job_fields: Mapping[str, Any] | None = None, traceparent: str | None = None,
             **daemon_options: Any) -> list[FinishedJob]:
    """Run `payloads` through `handler` under the real daemon; the settled jobs in payload order.

    `handler` is 'package.module:function' or a module-level function. `procs` children run them.
    `max_retries` and `job_fields` (e.g. {"timeout_seconds": 5, "priority": 10}) go into every job;
    `traceparent` (W3C) into every payload, each an object, for the jobs' spans to continue that trace.
    Any other keyword is a daemon flag: lease=10 -> --lease 10, max_memory_per_child=256 ->
    --max-memory-per-child 256 (poll_interval defaults to 0.2 s here). `timeout` bounds the wait for
    the jobs to settle. Without `server` a dev server is started and stopped around the run.
    Raises DaemonExited if the daemon stops early or does not exit 0 after SIGTERM, JobsNotSettled on
    timeout; the daemon (and an own dev server) are ended either way.
    """
    spec = handler_spec(handler)
    args = daemon_args({**DEFAULT_OPTIONS, **daemon_options})  # a bad option fails before anything starts
    payloads = list(payloads)
    if traceparent is not None:
        payloads = [carry(payload, traceparent) for payload in payloads]
    fields = dict(job_fields or {})
    if max_retries is not None:
        fields["max_retries"] = max_retries
    if not payloads:
        return []
    with contextlib.ExitStack() as stack:
        if server is None:
            server = stack.enter_context(temporary_dev_server())
        queue = queue or f"pytest-{uuid.uuid4().hex[:12]}"
        ids = [server.enqueue(queue, payload, **fields) for payload in payloads]
        with DaemonProcess(server, queue, spec, procs, args) as daemon:
            records = server.wait(ids, timeout, check=daemon.check_running)
            code = daemon.stop()
            if code != 0:
                raise DaemonExited(f"the daemon exited with code {code} after SIGTERM; its last output:\n"
                                   f"{daemon.output()}", code)
    return [FinishedJob.from_record(r) for r in records]


try:
    import pytest
except ImportError:  # run_jobs and DevServer work without pytest; the fixture needs it
    pytest = None  # type: ignore[assignment]

if pytest is not None:

    @pytest.fixture
    def spooled_dev_server(tmp_path_factory) -> Iterator[DevServer]:
        """A dev server on a free loopback port with a temporary database, stopped after the test."""
        with DevServer(str(tmp_path_factory.mktemp("spooled") / "dev.db")) as server:
            yield server
