"""`python -m supervisor demo`: the whole product in one command.

Starts the dev server on a free loopback port with a temporary database, enqueues N
CPU-bound jobs, runs the daemon, shows live progress, drains it with SIGTERM and prints
a summary (completed, dead-lettered, throughput, efficiency against the cores). Ctrl-C drains the daemon
and prints the summary so far (exit 130).
"""

from __future__ import annotations

import os
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from datetime import datetime

from supervisor import cli
from supervisor.client.rest import Secret, SpooledAPI
from supervisor.commands.enqueue import enqueue
from supervisor.commands.status import fetch as fetch_status

QUEUE = "demo"


def start_dev_server(db: str, key: str) -> tuple[subprocess.Popen, str]:
    """The dev server in a session of its own (a terminal's Ctrl-C reaches the demo only, which stops it last)."""
    env = dict(os.environ, SPOOLED_API_KEY=key)
    proc = subprocess.Popen([sys.executable, "-m", "supervisor", "dev-server", "--port", "0", "--db", db],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            start_new_session=True)
    deadline = time.monotonic() + 20
    assert proc.stdout is not None  # stdout=PIPE
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        m = re.search(r"listening on (http://\S+)", line or "")
        if m:
            return proc, m.group(1)
        if not line and proc.poll() is not None:
            break
    proc.kill()
    raise RuntimeError("the dev server did not start")


def health_port(log_path: str, daemon: subprocess.Popen, timeout: float = 30.0) -> int | None:
    """The port the daemon bound for `--health-port 0`, from its log; None if it exited or never said."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and daemon.poll() is None:
        with open(log_path, "rb") as f:
            m = re.search(rb'"msg":"serving the health port".*?"port":(\d+)', f.read())
        if m:
            return int(m.group(1))
        time.sleep(0.05)
    return None


def parse_time(text: str | None) -> float | None:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() if text else None


def job_span(client: SpooledAPI) -> tuple[float, float]:
    """Earliest start and latest completion among the demo queue's jobs, from the server's records."""
    starts: list[float] = []
    ends: list[float] = []
    offset = 0
    while True:
        page = client.get(f"/api/v1/jobs?queue_name={QUEUE}&limit=100&offset={offset}")
        for job in page:
            starts += [t for t in (parse_time(job.get("started_at")),) if t]
            ends += [t for t in (parse_time(job.get("completed_at")),) if t]
        if len(page) < 100:
            break
        offset += 100
    return (min(starts), max(ends)) if starts and ends else (0.0, 0.0)


def main(argv: list[str]) -> int:
    cores = os.cpu_count() or 1
    p = cli.parser("demo", description=__doc__.split("\n\n")[1])
    p.add_argument("--procs", type=int, default=cores, help=f"child processes (default: the CPU count, {cores})")
    p.add_argument("--jobs", type=int, default=200, help="demo jobs to run (default 200)")
    p.add_argument("--ms", type=float, default=100.0, help="CPU milliseconds per job (default 100)")
    args = p.parse_args(argv)
    if args.procs < 1 or args.jobs < 1 or args.ms <= 0:
        p.error("--procs, --jobs and --ms must be positive")
    tty = sys.stdout.isatty()
    key = "sp_test_" + secrets.token_urlsafe(24)
    with tempfile.TemporaryDirectory(prefix="spooled-demo-") as tmp:
        server, url = start_dev_server(os.path.join(tmp, "demo.db"), key)
        daemon = None
        client: SpooledAPI | None = None
        try:
            client = SpooledAPI(url, Secret(key), attempts=3)
            print(f"dev server at {url}; enqueuing {args.jobs} jobs of {args.ms:g} ms CPU each on queue '{QUEUE}'")
            try:
                enqueue(client, QUEUE, {"ms": args.ms}, args.jobs)
            except KeyboardInterrupt:
                print("\ninterrupted while enqueuing: nothing ran; stopping the dev server")
                return 130
            env = dict(os.environ, SPOOLED_API_KEY=key)
            cmd = [sys.executable, "-m", "supervisor", "run", "--queue", QUEUE,
                   "--handler", "supervisor.demo_handlers:burn",
                   "--procs", str(args.procs), "--api-url", url, "--worker-id", "demo-worker", "--health-port",
                   "0", "--poll-interval", "0.5", "--log-format", "json", "--log-level", "INFO"]
            log_path = os.path.join(tmp, "daemon.log")
            interrupted = False
            with open(log_path, "w") as log_file:
                started = time.monotonic()
                daemon = subprocess.Popen(cmd, env=env, stdout=log_file, stderr=subprocess.STDOUT,
                                          start_new_session=True)  # the demo drains it, once, on Ctrl-C
                try:
                    stats = watch(client, daemon, args.jobs, health_port(log_path, daemon), started, tty)
                except KeyboardInterrupt:
                    interrupted = True
                    print("\ninterrupted: draining the daemon (running jobs finish; Ctrl-C again stops at once)",
                          flush=True)
                daemon.send_signal(signal.SIGTERM)
                try:
                    code = daemon.wait(60)
                except KeyboardInterrupt:
                    daemon.kill()
                    code = daemon.wait()
            if interrupted:
                stats = client.get(f"/api/v1/jobs/stats?queue_name={QUEUE}")
            summary(client, stats, args, cores, code, time.monotonic() - started)
            if interrupted:
                return 130
            if code != 0 or stats["completed"] != args.jobs:
                print(f"daemon log: see below\n{open(log_path).read()[-3000:]}")
                return 1
            return 0
        finally:
            if client is not None:
                client.close()
            if daemon is not None and daemon.poll() is None:
                daemon.kill()
            server.terminate()
            server.wait(10)


def summary(client: SpooledAPI, stats: dict, args, cores: int, code: int, wall: float) -> None:
    """The run's outcome so far, from the server's records: counts, throughput and efficiency."""
    first, last = job_span(client)
    span = max(last - first, 1e-9)
    throughput = stats["completed"] / span if last > first else 0.0
    ideal = min(args.procs, cores) / (args.ms / 1000.0)
    print(f"\nsummary: {stats['completed']} completed, {stats['deadletter']} dead-lettered, "
          f"{stats['pending'] + stats['processing']} left of {args.jobs}; daemon exit code {code}")
    print(f"  throughput {throughput:.1f} jobs/s over {span if last > first else 0:.2f} s of processing "
          f"({wall:.1f} s wall, start-up included)")
    print(f"  efficiency {throughput / ideal:.3f} of the ideal {ideal:.1f} jobs/s "
          f"({min(args.procs, cores)} cores x 1000/{args.ms:g} ms)", flush=True)


def watch(client: SpooledAPI, daemon: subprocess.Popen, total: int, health_port: int | None, started: float,
          tty: bool) -> dict:
    """Print progress until every job is completed or dead-lettered (or the daemon exits)."""
    last_print = 0.0
    while True:
        stats = client.get(f"/api/v1/jobs/stats?queue_name={QUEUE}")
        done = stats["completed"] + stats["deadletter"]
        now = time.monotonic()
        busy = "?"
        try:
            if health_port is not None:
                status = fetch_status(f"http://127.0.0.1:{health_port}/status", timeout=1.0)
                busy = f"{status['busy']}/{status['procs']}"
        except Exception:  # not up yet, or already gone: progress goes on without it
            pass
        elapsed = now - started
        line = f"done {done}/{total}  {done / elapsed if elapsed > 0 else 0:6.1f} jobs/s  busy children {busy}"
        if tty:
            sys.stdout.write("\r" + line + "   ")
            sys.stdout.flush()
        elif now - last_print >= 1.0 or done >= total:
            print(line, flush=True)
            last_print = now
        if done >= total or daemon.poll() is not None:
            return stats
        time.sleep(0.25)
