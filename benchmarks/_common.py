"""Processes the benchmarks start (dev server, daemon, SDK worker) and what they read from them.

Everything listens on 127.0.0.1 only, every wait has a deadline, and every process started
here is stopped by its owner (`stop()`), by pid, never by name.
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from supervisor.client.rest import Secret, SpooledAPI  # noqa: E402
from supervisor.commands.demo import parse_time  # noqa: E402,F401  (run.py imports it from here)

HANDLER = "benchmarks.handlers:burn"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_env(**extra) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update(extra)
    return env


def cpu_seconds(proc: psutil.Process) -> float:
    """User + system CPU of the process itself (all its threads), children excluded."""
    t = proc.cpu_times()
    return t.user + t.system


def tree_cpu(proc: psutil.Process) -> float:
    """CPU seconds of a process and all its live descendants."""
    total = 0.0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            total += cpu_seconds(p)
        except psutil.Error:
            pass
    return total


def machine_busy() -> float:
    """CPU seconds the whole machine has spent busy (all cores, everything but idle and iowait)."""
    t = psutil.cpu_times()
    return sum(t) - t.idle - getattr(t, "iowait", 0.0)


def stop_popen(proc: subprocess.Popen | None, timeout: float = 30.0) -> int | None:
    if proc is None:
        return None
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    return proc.returncode


class LinePump:
    """Reads a pipe on a daemon thread so it never fills up; `line(deadline)` returns the next line or None."""

    def __init__(self, stream):
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._run, args=(stream,), daemon=True).start()

    def _run(self, stream) -> None:
        for raw in iter(stream.readline, ""):
            self._q.put(raw)
        self._q.put(None)

    def line(self, deadline: float) -> str | None:
        try:
            return self._q.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            return None


class DevServer:
    """`python -m supervisor dev-server` on a free loopback port with a temporary database."""

    def __init__(self, tmp: str, extra: tuple[str, ...] = (), name: str = "bench"):
        self.db = os.path.join(tmp, f"{name}.db")
        self.extra = list(extra)  # more dev-server flags, e.g. ("--fault-delay-ms", "20")
        self.proc: subprocess.Popen | None = None
        self.url = ""
        self.key = ""
        self.grpc = ""  # HOST:PORT when started with --grpc-port

    def start(self) -> DevServer:
        env = child_env()
        env.pop("SPOOLED_API_KEY", None)
        cmd = [PY, "-m", "supervisor", "dev-server", "--host", "127.0.0.1", "--port", "0", "--db", self.db,
               *self.extra]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     text=True)
        self.out = LinePump(self.proc.stdout)
        deadline = time.monotonic() + 20
        while not self.url or ("--grpc-port" in self.extra and not self.grpc):
            line = self.out.line(deadline)
            if line is None:
                self.stop()
                raise RuntimeError("the dev server did not start")
            if m := re.search(r"API key: (\S+)", line):
                self.key = m.group(1)
            if m := re.search(r"gRPC listening on (\S+)", line):
                self.grpc = m.group(1)
            elif m := re.search(r"listening on (http://\S+)", line):
                self.url = m.group(1)
        self.ps = psutil.Process(self.proc.pid)
        self.api = SpooledAPI(self.url, Secret(self.key), timeout=30)
        return self

    def cpu(self) -> float:
        return cpu_seconds(self.ps)

    def stop(self) -> None:
        stop_popen(self.proc, 10)

    # -- jobs --
    def enqueue(self, queue: str, payload, count: int) -> list[str]:
        ids: list[str] = []
        for start in range(0, count, 100):
            n = min(100, count - start)
            answer = self.api.bulk_create(queue, [payload] * n)
            if answer.get("failed"):
                raise RuntimeError(f"bulk enqueue refused: {answer['failed'][0]}")
            ids += [item["job_id"] for item in answer["succeeded"]]
        return ids

    def finished(self) -> int:
        s = self.api.get("/api/v1/jobs/stats")
        return s["completed"] + s["deadletter"] + s["failed"]

    def wait_finished(self, target: int, timeout: float, alive=lambda: True) -> None:
        deadline = time.monotonic() + timeout
        while self.finished() < target:
            if time.monotonic() > deadline:
                raise TimeoutError(f"jobs not finished within {timeout:.0f} s")
            if not alive():
                raise RuntimeError("the worker exited while jobs were left")
            time.sleep(0.5)  # /jobs/stats scans every job: polling it often would steal the cores being measured

    def jobs(self, queue: str, ids) -> list[dict]:
        """The server's summary records (created/started/completed times) of `ids` on `queue`."""
        want, out, offset = set(ids), [], 0
        while True:
            page = self.api.get(f"/api/v1/jobs?queue_name={queue}&limit=100&offset={offset}")
            out += [j for j in page if j["id"] in want]
            if len(page) < 100:
                return out
            offset += 100


def span_of(records: list[dict]) -> float:
    starts = [parse_time(j.get("started_at")) for j in records]
    ends = [parse_time(j.get("completed_at")) for j in records]
    starts = [t for t in starts if t]
    ends = [t for t in ends if t]
    if not starts or not ends:
        return 0.0
    return max(ends) - min(starts)


class Daemon:
    """`python -m supervisor run` as a subprocess, log to a file; the key only in its environment."""

    def __init__(self, server: DevServer, tmp: str, queue: str, procs: int, poll_interval: float,
                 log_level: str = "INFO", extra: tuple[str, ...] = (), worker_id: str = "", root: Path | None = None):
        self.server, self.queue, self.procs = server, queue, procs
        self.root = root or ROOT  # the checkout whose daemon runs (another one for a before/after in one run)
        worker_id = worker_id or f"bench-{queue}"
        self.log_path = os.path.join(tmp, f"daemon-{worker_id}.log")
        self.cmd = [PY, "-m", "supervisor", "run", "--queue", queue, "--handler", HANDLER, "--procs", str(procs),
                    "--api-url", server.url, "--worker-id", worker_id, "--poll-interval", str(poll_interval),
                    "--log-format", "json", "--log-level", log_level, *extra]
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 60.0) -> Daemon:
        return self.launch().wait_ready(timeout)

    def launch(self) -> Daemon:
        """Start the process without waiting for it (`wait_ready` waits): a fleet starts together."""
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(self.cmd, cwd=self.root, env=child_env(SPOOLED_API_KEY=self.server.key),
                                         stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        return self

    def wait_ready(self, timeout: float = 60.0) -> Daemon:
        assert self.proc is not None, "launch() first"
        deadline = time.monotonic() + timeout
        while not self.every_child_up():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                text = self.log()[-2000:]
                self.stop()
                raise RuntimeError(f"the daemon did not become ready; log:\n{text}")
            time.sleep(0.05)
        self.ps = psutil.Process(self.proc.pid)
        return self

    def every_child_up(self) -> bool:
        """The daemon said `ready` with every child up, or `every child is up` after (a daemon that logs `ready`
        with one child up names how many; an older one says `ready` only once all are)."""
        for line in self.log().splitlines():
            if '"msg":"every child is up"' in line:
                return True
            if '"msg":"ready"' in line:
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if "procs" not in rec or rec.get("children") == rec["procs"]:
                    return True
        return False

    def log(self) -> str:
        try:
            return Path(self.log_path).read_text()
        except OSError:
            return ""

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def cpu(self) -> float:
        return cpu_seconds(self.ps)

    def children(self) -> list[psutil.Process]:
        out = []
        for p in self.ps.children(recursive=True):
            try:
                if "spooled-supervisor: child" in " ".join(p.cmdline()):
                    out.append(p)
            except psutil.Error:
                pass
        return out

    def stop(self) -> int | None:
        code = stop_popen(self.proc, 40)
        if self.proc is not None and self.proc.poll() is None:  # pragma: no cover - stop_popen kills
            os.killpg(self.proc.pid, signal.SIGKILL)
        return code


class SdkWorker:
    """The official SDK's SpooledWorker in its own process (benchmarks/_sdk_worker.py)."""

    def __init__(self, server: DevServer, queue: str, concurrency: int, poll_interval: float):
        self.cmd = [PY, str(ROOT / "benchmarks" / "_sdk_worker.py"), server.url, queue, str(concurrency),
                    str(poll_interval), f"sdk-{queue}"]
        self.server = server
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 30.0) -> SdkWorker:
        self.proc = subprocess.Popen(self.cmd, cwd=ROOT, env=child_env(SPOOLED_API_KEY=self.server.key),
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.out = LinePump(self.proc.stdout)
        deadline = time.monotonic() + timeout
        while True:
            line = self.out.line(deadline)
            if line is None:
                self.stop()
                raise RuntimeError("the SDK worker did not start")
            if line.strip() == "started":
                break
        self.ps = psutil.Process(self.proc.pid)
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def cpu(self) -> float:
        return cpu_seconds(self.ps)

    def stop(self) -> int | None:
        return stop_popen(self.proc, 40)


def bare_process_memory() -> tuple[int, int]:
    """RSS and USS of a bare `python -c 'import benchmarks.handlers'` process (what the handler itself needs)."""
    proc = subprocess.Popen([PY, "-c", "import sys, benchmarks.handlers; print('ok', flush=True); sys.stdin.read()"],
                            cwd=ROOT, env=child_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        if LinePump(proc.stdout).line(time.monotonic() + 20) is None:
            raise RuntimeError("the bare python process did not start")
        info = psutil.Process(proc.pid).memory_full_info()
        return info.rss, info.uss
    finally:
        proc.stdin.close()
        proc.wait(10)


def machine() -> dict:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import platform

    return {"cpu_model": model or platform.processor() or "unknown", "cores": os.cpu_count() or 1,
            "python": platform.python_version(), "platform": platform.platform(),
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
