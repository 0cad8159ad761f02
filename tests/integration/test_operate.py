"""Operating the real daemon: systemd notify, health port and metrics, logs, SIGHUP and resize."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time

import psutil
import pytest
import requests
from conftest import Daemon, wait_for_status, wait_until
from support.intake_helpers import status as status_of


@pytest.mark.timeout(60)
def test_notify_ready_status_watchdog_and_stopping(dev_server, tmp_path):
    path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(10)
    daemon = Daemon(dev_server, "q-notify", procs=2, worker_id="w-notify",
                    env={"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "400000"}).start()
    received: list[str] = []

    def got(prefix: str) -> bool:
        while not any(m.startswith(prefix) or f"\n{prefix}" in m for m in received):
            received.append(sock.recv(4096).decode())
        return True

    try:
        got("READY=1")
        assert dev_server.worker("w-notify")["status"] == "healthy"  # READY comes after registration
        got("WATCHDOG=1")
        got("STATUS=")
        # Children must not inherit the notify socket. They are forked from the forkserver, whose environment
        # the kernel still shows (a titled process's /proc/<pid>/environ is zeroed by setproctitle), so read
        # it there; and ask each child's live os.environ through a job.
        forkservers = [p for p in psutil.Process(daemon.proc.pid).children() if "forkserver" in " ".join(p.cmdline())]
        assert len(forkservers) == 1, forkservers
        env = environ_of(forkservers[0].pid)
        assert any(v.startswith("PATH=") for v in env), env  # a real environment, not a blank
        assert not [v for v in env if v.split("=", 1)[0] in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "SPOOLED_API_KEY")]
        ids = [dev_server.enqueue("q-notify", {"do": "env"}) for _ in range(4)]
        for job in wait_for_status(dev_server, ids, timeout=20):
            assert not {"NOTIFY_SOCKET", "WATCHDOG_USEC"} & set(job["result"]["env"]), job["result"]["env"]
        daemon.signal(signal.SIGTERM)
        got("STOPPING=1")
        assert daemon.wait(20) == 0
    finally:
        daemon.stop()
        sock.close()
    ready = next(m for m in received if "READY=1" in m)
    assert "queue=q-notify" in ready


def environ_of(pid: int) -> list[str]:
    """A process's environment as the kernel holds it (/proc/<pid>/environ)."""
    with open(f"/proc/{pid}/environ", "rb") as f:
        return [item.decode(errors="replace") for item in f.read().split(b"\0") if item]


@pytest.mark.timeout(60)
def test_health_port_metrics_and_status_command(dev_server):
    ids = [dev_server.enqueue("q-metrics", {"do": "echo", "n": i}) for i in range(5)]
    bad = dev_server.enqueue("q-metrics", {"do": "raise"}, max_retries=0)
    daemon = Daemon(dev_server, "q-metrics", procs=2, worker_id="w-metrics", args=["--health-port", "0"]).start()
    port = daemon.health_port
    try:
        wait_for_status(dev_server, ids)
        wait_for_status(dev_server, [bad], statuses=("deadletter",))
        wait_until(lambda: requests.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200, timeout=10,
                   what="/readyz 200")
        assert requests.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200
        # The daemon counts a job when the server's answer to its report reaches it, a moment after the server
        # shows the job settled: poll for the last counts rather than reading them once.
        text = wait_until(lambda: (lambda t: t if 'outcome="completed"} 5' in t and 'outcome="failed"} 1' in t
                                   else None)(requests.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text),
                          timeout=10, what="the six jobs in /metrics")
        assert 'spooled_supervisor_jobs_total{queue="q-metrics",outcome="completed"} 5' in text
        assert 'spooled_supervisor_jobs_total{queue="q-metrics",outcome="failed"} 1' in text
        assert "spooled_supervisor_job_duration_seconds_count" in text
        assert 'spooled_supervisor_api_requests_total{route="claim",status="200"}' in text
        wait_until(lambda: "spooled_supervisor_children_alive 2" in
                   requests.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text, timeout=5, what="children gauge")
        snap = status_of(port)
        assert snap["worker_id"] == "w-metrics" and snap["registered"] and len(snap["children"]) == 2
        wait_until(lambda: all(c["rss_bytes"] for c in status_of(port)["children"]), timeout=15, what="child RSS")
        import subprocess
        import sys

        table = subprocess.run([sys.executable, "-m", "supervisor", "status", "--port", str(port)],
                               capture_output=True, text=True, timeout=20)
        assert table.returncode == 0, table.stderr
        assert "w-metrics" in table.stdout and "q-metrics" in table.stdout
        daemon.signal(signal.SIGTERM)
        assert daemon.wait(20) == 0
    finally:
        daemon.stop()


@pytest.mark.timeout(60)
def test_json_logs_carry_job_fields_and_never_the_key(dev_server):
    job_id = dev_server.enqueue("q-logs", {"do": "raise", "message": "key is " + dev_server.api_key}, max_retries=0)
    daemon = Daemon(dev_server, "q-logs", procs=1, worker_id="w-logs", args=["--log-level", "DEBUG"]).start()
    try:
        wait_for_status(dev_server, [job_id], statuses=("deadletter",))
        daemon.out.wait_for(r'"msg":"job failed"')
        daemon.signal(signal.SIGTERM)
        assert daemon.wait(20) == 0
    finally:
        daemon.stop()
    lines = [json.loads(line) for line in daemon.out.lines if line.startswith("{")]
    assert lines and all({"ts", "level", "msg"} <= set(r) for r in lines)
    failed = [r for r in lines if r["msg"] == "job failed"][0]
    assert failed["job_id"] == job_id and failed["queue"] == "q-logs" and failed["worker_id"] == "w-logs"
    assert isinstance(failed["pid"], int) and "duration" in failed
    assert dev_server.api_key not in daemon.out.text()
    assert "***" in failed["error"]


@pytest.mark.timeout(90)
def test_sighup_replaces_one_child_first_then_the_other_without_dropping_work(dev_server):
    ids = [dev_server.enqueue("q-hup", {"do": "cpu", "ms": 100}) for _ in range(60)]
    daemon = Daemon(dev_server, "q-hup", procs=2, worker_id="w-hup",
                    args=["--health-port", "0", "--log-level", "DEBUG"]).start()
    port = daemon.health_port
    try:
        daemon.wait_ready()
        before = {c["pid"] for c in status_of(port)["children"]}
        assert len(before) == 2
        # Sample the process table from just before the signal until both children are new.
        first_seen: dict[int, float] = {}
        alive_counts = []
        daemon.signal(signal.SIGHUP)
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline:
            now = time.monotonic()
            pids = set(daemon.child_pids())
            alive_counts.append(len(pids))
            for pid in pids:
                first_seen.setdefault(pid, now)
            new = set(first_seen) - before
            if len(new) >= 2 and not (pids & before):
                break
            time.sleep(0.01)
        else:
            raise AssertionError(f"children not replaced after SIGHUP: seen {sorted(first_seen)}, before {before}")
        daemon.out.wait_for(r"SIGHUP: replacing the children")
        new = sorted(set(first_seen) - before, key=first_seen.get)
        # One first, in the parent's own order of events (sampling the process table cannot tell on a loaded
        # machine): the second old child is asked to go only after the first new one started.
        replaced = daemon.wait_events("replacing child", count=2, reason="reload")
        assert {r["pid"] for r in replaced} == before, replaced
        order = [(r["msg"], r.get("pid")) for r in daemon.records()
                 if r.get("msg") in ("replacing child", "child started")]
        second = order.index(("replacing child", replaced[1]["pid"]))
        assert ("replacing child", replaced[0]["pid"]) in order[:second]
        assert any(msg == "child started" and pid in new for msg, pid in order[:second]), order
        assert min(alive_counts) >= 1, alive_counts  # and no sample saw both slots empty
        jobs = wait_for_status(dev_server, ids, timeout=60)
        assert all(j["retry_count"] == 0 for j in jobs)  # nothing was dropped or redelivered
        assert not [j for j in jobs if "ChildProcessDied" in (j["last_error"] or "")]
        assert {j["result"]["pid"] for j in jobs} & set(new)  # the new children did work
    finally:
        daemon.stop()


@pytest.mark.timeout(60)
def test_sigttin_and_sigttou_resize_the_pool(dev_server):
    daemon = Daemon(dev_server, "q-size", procs=2, worker_id="w-size", args=["--health-port", "0"]).start()
    port = daemon.health_port
    try:
        daemon.wait_ready()
        daemon.signal(signal.SIGTTIN)
        wait_until(lambda: len(status_of(port)["children"]) == 3 and status_of(port)["procs"] == 3, timeout=10,
                   what="three children")
        daemon.signal(signal.SIGTTOU)  # standard signals do not queue: send one, wait, then the next
        wait_until(lambda: len(status_of(port)["children"]) == 2, timeout=10, what="two children")
        daemon.signal(signal.SIGTTOU)
        wait_until(lambda: len(status_of(port)["children"]) == 1, timeout=10, what="one child")
        job_id = dev_server.enqueue("q-size", {"do": "echo"})
        wait_for_status(dev_server, [job_id])
        assert len(daemon.child_pids()) == 1
    finally:
        daemon.stop()


@pytest.mark.timeout(30)
def test_text_log_format(dev_server):
    d = Daemon(dev_server, "q-text", procs=1, worker_id="w-text2")
    d.cmd[d.cmd.index("json")] = "text"
    d.start()
    try:
        d.out.wait_for(r"INFO +ready +worker_id=w-text2")
        d.signal(signal.SIGTERM)
        assert d.wait(20) == 0
    finally:
        d.stop()
    assert dev_server.api_key not in d.out.text()


@pytest.mark.timeout(90)
def test_sighup_with_code_that_no_longer_imports_keeps_the_old_children_working(dev_server, tmp_path):
    import psutil

    flag = tmp_path / "boot-fail"
    daemon = Daemon(dev_server, "q-badreload", handler="tests.support.handlers_chaos:handle", procs=2,
                    worker_id="w-badreload", args=["--health-port", "0"],
                    env={"CHAOS_BOOT_FAIL_FLAG": str(flag)}).start()
    port = daemon.health_port
    try:
        daemon.wait_ready()
        flag.write_text("the new code is broken")
        daemon.signal(signal.SIGHUP)
        daemon.out.wait_for(r"child failed while starting; backing off")
        # One slot backs off; the reload waits there, so the other child keeps running jobs.
        ids = [dev_server.enqueue("q-badreload", {"do": "echo", "n": i}) for i in range(5)]
        wait_for_status(dev_server, ids, timeout=30)
        assert len([c for c in status_of(port)["children"] if c["state"] in ("idle", "busy")]) == 1
        assert len({r["msg"] and r.get("slot") for r in daemon.events("child failed while starting; backing off")}) == 1
        # Shrinking the pool past the backing-off slot must not leave the loop spinning on its old timer.
        daemon.signal(signal.SIGTTOU)
        wait_until(lambda: status_of(port)["procs"] == 1, timeout=10, what="procs 1")
        parent = psutil.Process(daemon.proc.pid)
        parent.cpu_percent(None)
        wait_until(lambda: status_of(port)["loop_age_secs"] < 5, timeout=5, what="a live loop")
        busy = parent.cpu_percent(1.5)
        assert busy < 20, f"parent at {busy}% CPU while idle"
        flag.unlink()
        later = dev_server.enqueue("q-badreload", {"do": "echo"})
        wait_for_status(dev_server, [later], timeout=40)
    finally:
        daemon.stop()


@pytest.mark.timeout(60)
def test_children_inherit_neither_notify_socket_nor_credentials(dev_server, tmp_path):
    creds = tmp_path / "creds"
    creds.mkdir()
    (creds / "spooled-api-key").write_text(dev_server.api_key)
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(tmp_path / "n.sock"))
    job_id = dev_server.enqueue("q-env", {"do": "env"})
    daemon = Daemon(dev_server, "q-env", procs=1, worker_id="w-env",
                    env={"SPOOLED_API_KEY": "", "CREDENTIALS_DIRECTORY": str(creds),
                         "NOTIFY_SOCKET": str(tmp_path / "n.sock"), "WATCHDOG_USEC": "5000000"}).start()
    try:
        env = wait_for_status(dev_server, [job_id], timeout=30)[0]["result"]["env"]
    finally:
        daemon.stop()
        notify.close()
    for name in ("SPOOLED_API_KEY", "CREDENTIALS_DIRECTORY", "NOTIFY_SOCKET", "WATCHDOG_USEC"):
        assert name not in env, name
    assert dev_server.api_key not in str(env)


@pytest.mark.timeout(60)
def test_a_slot_that_keeps_failing_to_start_shows_in_status_with_its_error_and_retry(dev_server, tmp_path):
    """A reload with broken code: the slot whose new child cannot import is listed by /status and `status`,
    with the error and when it tries again, beside the child that runs."""
    flag = tmp_path / "boot-fail"
    daemon = Daemon(dev_server, "q-failing", handler="tests.support.handlers_chaos:handle", procs=2,
                    worker_id="w-failing", args=["--health-port", "0"],
                    env={"CHAOS_BOOT_FAIL_FLAG": str(flag)}).start()
    try:
        daemon.wait_ready()
        port = daemon.health_port
        flag.write_text("the new code is broken")
        daemon.signal(signal.SIGHUP)
        daemon.out.wait_for(r"child failed while starting; backing off")
        snap = wait_until(lambda: (lambda s: s if s.get("failing") else None)(status_of(port)), timeout=10,
                          what="a failing slot in /status")
        (failing,) = snap["failing"]
        assert failing["last_error"].startswith("RuntimeError: boot failure requested by")
        assert failing["failures"] >= 1 and 0 <= failing["retry_in_secs"] <= 30
        running = [c["slot"] for c in snap["children"] if c["state"] in ("idle", "busy")]
        assert running == [1 - failing["slot"]]
        table = subprocess.run([sys.executable, "-m", "supervisor", "status", "--port", str(port)],
                               capture_output=True, text=True, timeout=30).stdout
        assert f"slot {failing['slot']} failing to start (" in table and "RuntimeError: boot failure" in table
        rows = {line.split()[0]: line.split() for line in table.splitlines() if line[:1].isdigit()}
        assert sorted(rows) == ["0", "1"], table  # every slot, the failing one too
    finally:
        daemon.stop()
