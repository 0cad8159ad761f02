"""Chaos run: CPU-bound jobs through the real daemon while children are SIGKILLed and the API misbehaves.

Starts the dev server (temporary database, free loopback port) and `python -m supervisor run`,
enqueues --jobs CPU-bound jobs (supervisor.demo_handlers:burn, --ms each), then, while the dev
server answers a --fault-503 fraction of requests with 503 and delays a --delay-fraction of them
by --delay-ms, SIGKILLs a random child (a busy one when there is one) every --kill-min..--kill-max seconds.
When every job has ended (or --duration passes) the killing and the faults stop, the run settles, the daemon is
stopped with SIGTERM, and the figures are read back from the server's own records:

    enqueued, completed, dead-lettered (with reasons), failed, still pending/processing (must be 0),
    lost (must be 0), delivered more than once (claimed again: retry_count > 0), children killed
    and replaced, the daemon's exit code.

It prints a table and one JSON line. Exit status 0 only when nothing is lost or stuck.

    python benchmarks/chaos.py --jobs 2000 --duration 300
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import psutil
import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from conftest import Daemon, DevServer, wait_until  # noqa: E402  (the test helpers: real subprocesses)

QUEUE = "chaos"
NO_FAULTS = {"fail_503": 0, "delay_ms": 0, "cut": 0}


def _call(server: DevServer, method: str, path: str, json_body=None, tries: int = 20):
    """One request to the dev server, retried through its injected faults."""
    for _ in range(tries):
        try:
            r = server.request(method, path, json=json_body)
        except requests.RequestException:
            time.sleep(0.05)
            continue
        if r.status_code < 500:
            return r
        time.sleep(0.05)
    raise RuntimeError(f"{method} {path}: no answer through the faults")


class Killer(threading.Thread):
    """SIGKILLs a random busy child (found by its process title) every `lo`..`hi` seconds."""

    def __init__(self, daemon: Daemon, lo: float, hi: float, seed: int):
        super().__init__(daemon=True)
        self.d, self.lo, self.hi = daemon, lo, hi
        self.rng = random.Random(seed)
        self.stop = threading.Event()
        self.killed: list[int] = []
        self.killed_busy = 0
        self.seen: set[int] = set()

    def children(self) -> tuple[list[int], list[int]]:
        """Busy and idle children, leaving out those already killed: on a loaded machine a SIGKILLed child
        can keep its title (and so look alive) until it is next scheduled, and counting it twice would
        make one death two kills."""
        busy, idle = [], []
        for pid in self.d.child_pids():
            if pid in self.killed:
                continue
            self.seen.add(pid)
            try:
                (busy if " busy " in psutil.Process(pid).cmdline()[0] else idle).append(pid)
            except (psutil.Error, IndexError):
                pass
        return busy, idle

    def run(self) -> None:
        while not self.stop.wait(self.rng.uniform(self.lo, self.hi)):
            busy, idle = self.children()
            if not busy and not idle:
                continue
            pid = self.rng.choice(busy or idle)  # mid-job when one is busy, else any child
            try:
                os.kill(pid, signal.SIGKILL)
                self.killed.append(pid)
                if busy:
                    self.killed_busy += 1
            except ProcessLookupError:
                pass


def all_jobs(server: DevServer) -> list[dict]:
    """Every job of the queue, as the server stores it (summaries, paged)."""
    out, offset = [], 0
    while True:
        r = _call(server, "GET", f"/api/v1/jobs?queue_name={QUEUE}&limit=100&offset={offset}")
        page = r.json()
        out += page
        if r.headers.get("X-Has-More") != "true":
            return out
        offset += 100


def _ended(stats: dict) -> int:
    return sum(stats.get(k, 0) for k in ("completed", "deadletter", "failed", "cancelled"))


def _enqueue(server: DevServer, jobs: int, ms: float, max_retries: int) -> list[str]:
    """Enqueue `jobs` burn jobs in bulk requests of 100; their ids, in order."""
    ids: list[str] = []
    for start in range(0, jobs, 100):
        batch = [{"ms": ms, "echo": i} for i in range(start, min(jobs, start + 100))]
        body = {"queue_name": QUEUE, "jobs": [{"payload": p} for p in batch], "default_max_retries": max_retries,
                "default_timeout_seconds": 60}  # (the bulk route's names: a job's own would go in its item)
        r = _call(server, "POST", "/api/v1/jobs/bulk", body)
        assert r.status_code in (200, 201), r.text
        ids += [item["job_id"] for item in r.json()["succeeded"]]
    assert len(ids) == jobs, f"enqueued {len(ids)} of {jobs}"
    first = _call(server, "GET", f"/api/v1/jobs/{ids[0]}")
    assert first.status_code == 200 and first.json()["max_retries"] == max_retries, first.text  # the server took it
    return ids


def _stats(server: DevServer) -> dict | None:
    """The queue stats, or None when the (faulty) server gives no good answer this time."""
    try:
        r = server.request("GET", "/api/v1/jobs/stats")
        return r.json() if r.status_code == 200 else None
    except requests.RequestException:
        return None


def _chaos_phase(server: DevServer, daemon: Daemon, killer: Killer, jobs: int, duration: float, started: float,
                 say) -> None:
    """Wait until every job has ended, the daemon exits, or `duration` passes; report progress every 5 s."""
    last_report = 0.0
    while time.monotonic() - started < duration:
        stats = _stats(server)
        if stats is not None:
            if time.monotonic() - last_report > 5:
                last_report = time.monotonic()
                say(f"  {time.monotonic() - started:5.1f} s: {_ended(stats)}/{jobs} ended, "
                    f"{len(killer.killed)} children killed")
            if _ended(stats) >= jobs:
                break
        if daemon.proc.poll() is not None:
            break
        time.sleep(0.25)


def _settle(server: DevServer, jobs: int, settle: float) -> None:
    """Without kills or faults, let whatever is still pending (e.g. in retry back-off) finish, for up to `settle` s."""
    def settled():
        stats = _call(server, "GET", "/api/v1/jobs/stats").json()
        return stats if _ended(stats) >= jobs else None

    try:
        wait_until(settled, timeout=settle, interval=0.25, what="the queue to settle")
    except AssertionError:
        pass


def _report(server: DevServer, daemon: Daemon, killer: Killer, ids: list[str], jobs: int, end: dict,
            settings: dict) -> dict:
    """The run's figures, read back from the server's job records and the daemon's log."""
    records = {j["id"]: j for j in all_jobs(server)}
    status = Counter(records[i]["status"] if i in records else "missing" for i in ids)
    dead = [records[i] for i in ids if i in records and records[i]["status"] == "deadletter"]
    reasons = Counter((j["last_error"] or "").split(" (pid")[0].split(":")[0] for j in dead)
    completed = [records[i] for i in ids if i in records and records[i]["status"] == "completed"]
    redelivered = [j for j in completed if j["retry_count"] > 0]
    # The completed jobs' results carry the pid of the child that ran them.
    pids: Counter = Counter()
    for j in completed:
        full = _call(server, "GET", f"/api/v1/jobs/{j['id']}").json()
        if isinstance(full.get("result"), dict):
            pids[full["result"].get("pid")] += 1
    crashed_events = daemon.events("child died during a job")
    replaced = daemon.events("child exited; starting a new one")
    boot_killed = daemon.events("child failed while starting; backing off")
    refused = daemon.events("complete refused: this worker no longer holds the job; outcome dropped")
    stuck = status.get("pending", 0) + status.get("scheduled", 0) + status.get("processing", 0)
    return {
        "jobs_enqueued": jobs,
        "completed": status.get("completed", 0),
        "dead_lettered": len(dead),
        "dead_letter_reasons": dict(reasons),
        "failed": status.get("failed", 0),
        "still_pending": status.get("pending", 0) + status.get("scheduled", 0),
        "still_processing": status.get("processing", 0),
        "lost": status.get("missing", 0) + stuck,
        "delivered_more_than_once": len(redelivered),
        "extra_deliveries": sum(j["retry_count"] for j in completed + dead),
        "max_deliveries_of_one_job": 1 + max((j["retry_count"] for j in records.values()), default=0),
        "duplicate_completions_refused": len(refused),
        "children_killed": len(killer.killed),
        "children_killed_mid_job": killer.killed_busy,
        "children_died_during_a_job": len(crashed_events),
        "children_replaced": len(replaced),
        "children_killed_while_starting": len(boot_killed),
        "children_at_end": end["children_at_end"],
        "distinct_child_pids_with_results": len(pids),
        "claim_failures_logged": len(daemon.events("claim failed")),
        "reports_retried": len(daemon.events("complete not delivered yet; will retry"))
        + len(daemon.events("fail not delivered yet; will retry")),
        "daemon_alive_until_stopped": end["daemon_alive"],
        "daemon_exit_code": end["exit_code"],
        "chaos_seconds": round(end["chaos_secs"], 1),
        "total_seconds": round(end["total_secs"], 1),
        "jobs_per_second": round(status.get("completed", 0) / max(end["total_secs"], 1e-9), 1),
        "settings": settings,
    }


def run_chaos(jobs: int = 500, ms: float = 5.0, procs: int = 2, duration: float = 60.0, kill_min: float = 0.2,
              kill_max: float = 0.5, fault_503: float = 0.1, delay_ms: int = 20, delay_fraction: float = 0.5,
              max_retries: int = 10, settle: float = 30.0, seed: int = 1, workdir: str | None = None,
              progress=None) -> dict:
    say = progress or (lambda text: None)
    tmp = tempfile.TemporaryDirectory(prefix="chaos-") if workdir is None else None
    work = Path(workdir or tmp.name)
    server = DevServer(str(work / "chaos.db"), extra=[
        "--lease-sweep-interval", "0.2", "--fault-seed", str(seed),
        "--fault-delay-fraction", str(delay_fraction)]).start()
    daemon = None
    try:
        ids = _enqueue(server, jobs, ms, max_retries)
        say(f"enqueued {jobs} jobs of {ms} ms CPU; {procs} children; SIGKILL every {kill_min}-{kill_max} s; "
            f"{fault_503:.0%} 503s, +{delay_ms} ms on {delay_fraction:.0%} of requests")

        daemon = Daemon(server, QUEUE, handler="supervisor.demo_handlers:burn", procs=procs, worker_id="chaos-worker",
                        args=["--lease", "5", "--poll-interval", "0.2"]).start()
        daemon.wait_ready(30)
        faults = {"fail_503": fault_503, "delay_ms": delay_ms, "cut": 0}
        assert _call(server, "POST", "/_dev/faults", faults).status_code == 200
        killer = Killer(daemon, kill_min, kill_max, seed)
        started = time.monotonic()
        killer.start()
        _chaos_phase(server, daemon, killer, jobs, duration, started, say)
        chaos_secs = time.monotonic() - started
        killer.stop.set()
        killer.join()
        assert _call(server, "POST", "/_dev/faults", NO_FAULTS).status_code == 200

        _settle(server, jobs, settle)
        total_secs = time.monotonic() - started
        daemon_alive = daemon.proc.poll() is None
        # A child killed while starting comes back after its back-off (up to seconds): wait for the pool,
        # bounded, rather than count it at one instant.
        try:
            wait_until(lambda: daemon.proc.poll() is not None or len(daemon.child_pids()) >= procs, timeout=40,
                       interval=0.25, what="the pool back to --procs children")
        except AssertionError:
            pass
        daemon_alive = daemon.proc.poll() is None
        children_at_end = len(daemon.child_pids()) if daemon_alive else 0
        daemon.stop()
        end = {"children_at_end": children_at_end, "daemon_alive": daemon_alive, "exit_code": daemon.proc.returncode,
               "chaos_secs": chaos_secs, "total_secs": total_secs}
        settings = {"ms_per_job": ms, "procs": procs, "kill_every_s": [kill_min, kill_max], "fault_503": fault_503,
                    "delay_ms": delay_ms, "delay_fraction": delay_fraction, "max_retries": max_retries,
                    "lease_s": 5, "seed": seed}
        return _report(server, daemon, killer, ids, jobs, end, settings)
    finally:
        if daemon is not None:
            daemon.stop()
        server.stop()
        if tmp is not None:
            tmp.cleanup()


def print_report(report: dict) -> None:
    rows = [
        ("jobs enqueued", report["jobs_enqueued"]),
        ("completed", report["completed"]),
        ("dead-lettered", report["dead_lettered"]),
        *[(f"  reason: {k}", v) for k, v in sorted(report["dead_letter_reasons"].items())],
        ("failed", report["failed"]),
        ("still pending", report["still_pending"]),
        ("still processing (must be 0)", report["still_processing"]),
        ("lost (must be 0)", report["lost"]),
        ("delivered more than once", report["delivered_more_than_once"]),
        ("extra deliveries in all", report["extra_deliveries"]),
        ("most deliveries of one job", report["max_deliveries_of_one_job"]),
        ("duplicate completions refused", report["duplicate_completions_refused"]),
        ("children SIGKILLed", report["children_killed"]),
        ("  of them mid-job", report["children_killed_mid_job"]),
        ("children died during a job", report["children_died_during_a_job"]),
        ("children replaced", report["children_replaced"]),
        ("children killed while starting", report["children_killed_while_starting"]),
        ("children alive at the end", report["children_at_end"]),
        ("claim failures logged", report["claim_failures_logged"]),
        ("result reports retried", report["reports_retried"]),
        ("daemon exit code", report["daemon_exit_code"]),
        ("chaos phase (s)", report["chaos_seconds"]),
        ("total (s)", report["total_seconds"]),
        ("completed jobs/s", report["jobs_per_second"]),
    ]
    width = max(len(k) for k, _ in rows)
    print("-" * (width + 12))
    for k, v in rows:
        print(f"{k:<{width}}  {v:>8}")
    print("-" * (width + 12))
    print(json.dumps(report, sort_keys=True))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=500)
    p.add_argument("--ms", type=float, default=20.0, help="CPU milliseconds per job")
    p.add_argument("--procs", type=int, default=2)
    p.add_argument("--duration", type=float, default=300.0, help="longest chaos phase in seconds")
    p.add_argument("--kill-min", type=float, default=0.2)
    p.add_argument("--kill-max", type=float, default=0.5)
    p.add_argument("--fault-503", type=float, default=0.1)
    p.add_argument("--delay-ms", type=int, default=20)
    p.add_argument("--delay-fraction", type=float, default=0.5)
    p.add_argument("--max-retries", type=int, default=10)
    p.add_argument("--settle", type=float, default=90.0, help="seconds allowed after the chaos for retries to finish")
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args(argv)
    report = run_chaos(jobs=a.jobs, ms=a.ms, procs=a.procs, duration=a.duration, kill_min=a.kill_min,
                       kill_max=a.kill_max, fault_503=a.fault_503, delay_ms=a.delay_ms, delay_fraction=a.delay_fraction,
                       max_retries=a.max_retries, settle=a.settle, seed=a.seed, progress=print)
    print_report(report)
    ok = report["lost"] == 0 and report["still_processing"] == 0 and report["daemon_exit_code"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
