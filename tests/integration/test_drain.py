"""`python -m supervisor drain` (a pod's preStop hook) against a real daemon: no claims or starts after the
request, the running jobs finish, the reserve goes back to the queue unaltered, and at the drain deadline
the jobs still running go back at once instead of waiting out their lease. And POST /drain itself."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections import Counter

import pytest
import requests
from conftest import ROOT, Daemon, DevServer, free_port, own, parse_ts, wait_until

from supervisor.ops.health import HealthServer, is_loopback_client
from supervisor.ops.metrics import DaemonMetrics


def drain(port: int, *extra: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "supervisor", "drain", "--port", str(port), *extra], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.timeout(90)
def test_drain_finishes_the_running_jobs_and_hands_the_reserve_back(tmp_path):
    server = DevServer(str(tmp_path / "dev.db"), extra=["--fault-delay-ms", "40"]).start()
    ids = [server.enqueue("q-drain", {"do": "sleep", "secs": 0.1}) for _ in range(80)]
    d = Daemon(server, "q-drain", procs=2, worker_id="w-drain",
               args=["--health-port", "0", "--log-level", "DEBUG"]).start()  # DEBUG: "job held", "job started"
    port = d.health_port
    try:
        d.wait_ready()
        d.wait_events("job completed", count=6)
        out = drain(port)
        assert out.returncode == 0, out.stderr
        assert "drained: the daemon deregistered and exited" in out.stdout
        assert d.wait(10) == 0
        (asked,) = d.events("drain requested: no more claims or starts; reserved jobs go back to the queue when the "
                            "running ones are done")
        asked_at = parse_ts(asked["ts"])
        # No job waiting in the parent started after the request. A job already sent ahead to a busy child may
        # have: the child starts it the moment its own job ends, and the recall can reach it just after that.
        held = {e["job_id"] for e in d.events("job held") if parse_ts(e["ts"]) <= asked_at}
        started_after = {e["job_id"] for e in d.events("job started") if parse_ts(e["ts"]) > asked_at}
        assert started_after <= held, (started_after, held)
        after = [e for e in d.events("job completed") if parse_ts(e["ts"]) > asked_at]
        assert len(after) <= asked["running"] + len(started_after)  # no other reserved job started after it
        jobs = [server.job(j) for j in ids]
        kinds = Counter((j["status"], j["assigned_worker_id"]) for j in jobs)
        assert set(kinds) <= {("completed", "w-drain"), ("pending", None)}, kinds  # none left processing
        assert all(j["retry_count"] == 0 for j in jobs)  # handed back unaltered: no retry spent
        handed_back = [j for j in jobs if j["status"] == "pending" and j.get("started_at")]
        # every reserved job comes back but a held one its child started before the recall reached it (above)
        assert len(handed_back) >= asked["reserved"] - len(started_after), (asked, started_after)
        assert len(d.events("deregistered")) == 1
    finally:
        d.stop()
        server.stop()


@pytest.mark.timeout(60)
def test_at_the_drain_deadline_running_jobs_go_back_at_once_not_to_their_lease(tmp_path):
    server = DevServer(str(tmp_path / "dev.db")).start()
    d = Daemon(server, "q-deadline", procs=1, worker_id="w-deadline",
               args=["--health-port", "0", "--drain-timeout", "1", "--lease", "300"]).start()
    port = d.health_port
    try:
        d.wait_ready()
        job = server.enqueue("q-deadline", {"do": "sleep", "secs": 120})
        d.busy_child(job)
        started = time.monotonic()
        out = drain(port)
        assert out.returncode == 0, out.stderr
        assert d.wait(10) == 0
        assert time.monotonic() - started < 15  # the drain timeout, the kill grace, the deregister: not the lease
        got = server.job(job)
        assert (got["status"], got["assigned_worker_id"], got["retry_count"]) == ("pending", None, 0)
        d.wait_events("drain timeout: stopping busy children; deregistering hands their jobs back to the queue")
    finally:
        d.stop()
        server.stop()


def test_drain_without_a_port_or_a_daemon_says_so():
    out = drain(free_port(), timeout=30)
    assert out.returncode == 1 and "cannot ask" in out.stderr and len(out.stderr.strip().splitlines()) == 1
    none = subprocess.run([sys.executable, "-m", "supervisor", "drain"], cwd=ROOT, capture_output=True, text=True,
                          timeout=30, env={"PATH": "/usr/bin:/bin"})
    assert none.returncode == 2 and "SPOOLED_HEALTH_PORT" in none.stderr
    bad = subprocess.run([sys.executable, "-m", "supervisor", "drain", "--port", "1"], cwd=ROOT, capture_output=True,
                         text=True, timeout=30, env={"PATH": "/usr/bin:/bin", "SPOOLED_DRAIN_TIMEOUT": "soon"})
    assert bad.returncode == 2 and " drain: error: SPOOLED_DRAIN_TIMEOUT must be" in bad.stderr
    flag = subprocess.run([sys.executable, "-m", "supervisor", "drain", "--port", "eighty"], cwd=ROOT,
                          capture_output=True, text=True, timeout=30)
    assert flag.returncode == 2 and len(flag.stderr.strip().splitlines()) == 1 and "--port" in flag.stderr


def test_post_drain_calls_the_daemon_once_and_only_from_loopback():
    asked = []
    srv = HealthServer("127.0.0.1", 0, lambda: {"loop_age_secs": 0.0}, DaemonMetrics(),
                       drain=lambda: asked.append(1)).start()
    try:
        base = f"http://127.0.0.1:{srv.port}"
        assert requests.get(base + "/drain", timeout=5).status_code == 404  # GET drains nothing
        r = requests.post(base + "/drain", timeout=5)
        assert (r.status_code, r.json(), asked) == (202, {"status": "draining"}, [1])
    finally:
        srv.stop()
    without = HealthServer("127.0.0.1", 0, lambda: {}, DaemonMetrics()).start()
    try:
        assert requests.post(f"http://127.0.0.1:{without.port}/drain", timeout=5).status_code == 404
    finally:
        without.stop()
    assert is_loopback_client("127.0.0.1") and is_loopback_client("::1") and is_loopback_client("::ffff:127.0.0.1")
    assert not is_loopback_client("10.0.0.7") and not is_loopback_client("fe80::1%eth0")
    assert not is_loopback_client("not-an-ip")


def test_the_daemon_logs_its_stop_budget_at_start(dev_server):
    d = Daemon(dev_server, "q-budget", procs=1, worker_id="w-budget",
               args=["--drain-timeout", "20", "--api-timeout", "2"]).start()
    try:
        (line,) = d.wait_events("stop budget: a stop takes at most this long; give TimeoutStopSec or "
                                "terminationGracePeriodSeconds more")
        # 20 s drain + 1 s kill grace (the test daemon's) + 2 s to reap + 2 deregister attempts of 2 s
        assert line["stop_budget_secs"] == 27.0 and line["stop_budget_with_drain_request_secs"] == 30.0
    finally:
        d.stop()
    wait_until(lambda: d.proc.poll() is not None, timeout=10, what="the daemon gone")


@pytest.mark.timeout(60)
def test_sigterm_during_a_requested_drain_stops_at_once_and_hands_the_job_back(tmp_path):
    """The preStop hook ran out of time (or was cut short): the stop signal that follows does not wait out the
    drain timeout, it stops the children and deregisters, so the job is back in the queue at once."""
    server = DevServer(str(tmp_path / "dev.db")).start()
    d = Daemon(server, "q-cut", procs=1, worker_id="w-cut",
               args=["--health-port", "0", "--drain-timeout", "120", "--lease", "300"]).start()
    port = d.health_port
    try:
        d.wait_ready()
        job = server.enqueue("q-cut", {"do": "sleep", "secs": 120})
        d.busy_child(job)
        hook = own(subprocess.Popen([sys.executable, "-m", "supervisor", "drain", "--port", str(port)], cwd=ROOT,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True))
        d.wait_events("drain requested: no more claims or starts; reserved jobs go back to the queue when the "
                      "running ones are done")
        stopped_at = time.monotonic()
        d.signal(signal.SIGTERM)
        assert d.wait(15) == 0
        assert time.monotonic() - stopped_at < 10  # the kill grace and the deregister, not the 120 s drain
        got = server.job(job)
        assert (got["status"], got["assigned_worker_id"], got["retry_count"]) == ("pending", None, 0)
        assert hook.wait(15) == 0  # the hook sees the daemon gone
    finally:
        d.stop()
        server.stop()
