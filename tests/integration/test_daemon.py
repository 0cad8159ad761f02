"""Integration tests of the daemon: the real dev server, the daemon as a subprocess,
real children and real signals; every assertion reads job and worker state back from the server."""

from __future__ import annotations

import signal
import time

import psutil
import pytest
from conftest import Daemon, DevServer, wait_for_status, wait_until

from supervisor import __version__

HANDLER = "supervisor.demo_handlers:misbehave"


@pytest.mark.timeout(60)
def test_all_jobs_completed_with_their_results_by_this_worker(dev_server, daemon_factory):
    ids = [dev_server.enqueue("q-all", {"do": "echo", "n": i}) for i in range(30)]
    daemon = daemon_factory("q-all", procs=2, worker_id="w-all")
    jobs = wait_for_status(dev_server, ids, timeout=40)
    for i, job in enumerate(jobs):
        assert job["result"]["echo"] == {"do": "echo", "n": i}
        assert job["assigned_worker_id"] == "w-all"
        assert job["retry_count"] == 0
    worker = dev_server.worker("w-all")
    assert worker["jobs_processed"] == 30 and worker["jobs_failed"] == 0
    assert len(daemon.wait_events("job completed", 30)) == 30
    line = daemon.events("job completed")[0]
    assert {"job_id", "queue", "worker_id", "pid", "duration"} <= set(line)


@pytest.mark.timeout(60)
def test_cpu_bound_jobs_run_procs_at_a_time(dev_server, daemon_factory):
    ids = [dev_server.enqueue("q-par", {"do": "cpu", "ms": 300}) for _ in range(6)]
    daemon_factory("q-par", procs=2, worker_id="w-par")
    jobs = wait_for_status(dev_server, ids, timeout=40)
    assert len({j["result"]["pid"] for j in jobs}) == 2
    spans = [(j["result"]["t0"], j["result"]["t1"]) for j in jobs]  # as the handler saw it
    # An ordering, not a duration (the machine may be loaded): two jobs did overlap, never three.
    at_once = [sum(1 for s, e in spans if s <= t < e) for t in (s for s, _ in spans)]
    assert max(at_once) == 2, spans


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_job_running_three_times_its_lease_completes_with_one_delivery(dev_server, daemon_factory):
    job_id = dev_server.enqueue("q-lease", {"do": "sleep", "secs": 16}, timeout_seconds=60)
    daemon = daemon_factory("q-lease", procs=1, worker_id="w-lease", args=["--lease", "5"])
    job = wait_for_status(dev_server, [job_id], timeout=45)[0]
    assert job["retry_count"] == 0  # the lease was never lost, so never delivered twice
    assert job["result"]["slept"] == 16
    assert dev_server.worker("w-lease")["jobs_processed"] == 1
    assert len(daemon.wait_events("job completed", 1)) == 1
    assert not daemon.events("lease lost; stopping the job's work")


@pytest.mark.timeout(60)
def test_raising_handler_is_retried_then_dead_lettered_with_its_error(dev_server, daemon_factory):
    job_id = dev_server.enqueue("q-raise", {"do": "raise", "message": "bad input 42"}, max_retries=1)
    daemon_factory("q-raise", procs=1, worker_id="w-raise")
    job = wait_for_status(dev_server, [job_id], statuses=("deadletter",), timeout=30)[0]
    assert job["last_error"].startswith("ValueError: bad input 42")
    assert "Traceback" in job["last_error"] and "misbehave" in job["last_error"]
    assert len(job["last_error"]) <= 2048
    assert job["retry_count"] == 1
    assert dev_server.worker("w-raise")["jobs_failed"] == 2
    dlq = dev_server.request("GET", "/api/v1/jobs/dlq").json()
    assert any(item["id"] == job_id for item in dlq)


@pytest.mark.timeout(60)
def test_job_over_its_timeout_is_killed_and_failed_while_others_carry_on(dev_server, daemon_factory):
    hung = dev_server.enqueue("q-timeout", {"do": "hang"}, timeout_seconds=2, max_retries=0)
    others = [dev_server.enqueue("q-timeout", {"do": "cpu", "ms": 200}) for _ in range(20)]  # outlasts the timeout
    daemon = daemon_factory("q-timeout", procs=2, worker_id="w-timeout")
    job = wait_for_status(dev_server, [hung], statuses=("deadletter",), timeout=30)[0]
    assert job["last_error"].startswith("JobTimeout: the job ran past its timeout of 2 s")
    done = wait_for_status(dev_server, others, timeout=30)
    assert len({j["result"]["pid"] for j in done}) >= 2  # a fresh child replaced the hung one
    assert daemon.wait_events("job timed out; stopping its child")
    assert daemon.proc.poll() is None


@pytest.mark.timeout(60)
def test_sigterm_drains_in_flight_jobs_deregisters_and_exits_0(dev_server, daemon_factory):
    ids = [dev_server.enqueue("q-drain", {"do": "sleep", "secs": 2}) for _ in range(2)]
    daemon = daemon_factory("q-drain", procs=2, worker_id="w-drain", args=["--drain-timeout", "60"])
    wait_for_status(dev_server, ids, statuses=("processing",), timeout=20)
    later = dev_server.enqueue("q-drain", {"do": "echo"})
    started = time.monotonic()
    daemon.signal(signal.SIGTERM)
    assert daemon.wait(50) == 0
    assert time.monotonic() - started < 40  # left when the jobs were done, not after the 60 s drain timeout
    assert all(j["status"] == "completed" for j in (dev_server.job(i) for i in ids))
    assert dev_server.job(later)["status"] == "pending"  # no claim after the signal
    assert dev_server.worker("w-drain")["status"] == "offline"
    assert daemon.events("deregistered") and daemon.events("stop signal: draining")


@pytest.mark.timeout(60)
def test_drain_timeout_hands_unfinished_jobs_back_at_once(dev_server, daemon_factory):
    job_id = dev_server.enqueue("q-slow", {"do": "sleep", "secs": 60}, timeout_seconds=120)
    daemon = daemon_factory("q-slow", procs=1, worker_id="w-slow", args=["--drain-timeout", "1"])
    wait_for_status(dev_server, [job_id], statuses=("processing",), timeout=20)
    started = time.monotonic()
    daemon.signal(signal.SIGTERM)
    assert daemon.wait(30) == 0
    assert time.monotonic() - started < 30  # the 1 s drain timeout, not the 60 s job
    job = dev_server.job(job_id)
    assert job["status"] == "pending" and job["retry_count"] == 0  # released by deregister, not failed


@pytest.mark.timeout(60)
def test_second_sigterm_stops_at_once(dev_server, daemon_factory):
    ids = [dev_server.enqueue("q-fast", {"do": "sleep", "secs": 60}, timeout_seconds=120) for _ in range(2)]
    daemon = daemon_factory("q-fast", procs=2, worker_id="w-fast", args=["--drain-timeout", "60"])
    wait_for_status(dev_server, ids, statuses=("processing",), timeout=20)
    daemon.signal(signal.SIGTERM)
    daemon.out.wait_for(r"stop signal: draining")
    started = time.monotonic()
    daemon.signal(signal.SIGTERM)
    assert daemon.wait(30) == 0
    assert time.monotonic() - started < 30  # at once, not after the 60 s drain timeout
    assert daemon.events("second stop signal: stopping at once")
    assert all(dev_server.job(i)["status"] == "pending" for i in ids)
    assert dev_server.worker("w-fast")["status"] == "offline"


@pytest.mark.timeout(60)
def test_restart_with_the_same_worker_id_reuses_the_worker_row(dev_server, daemon_factory):
    first = dev_server.enqueue("q-restart", {"do": "echo"})
    d1 = daemon_factory("q-restart", procs=1, worker_id="w-stable")
    wait_for_status(dev_server, [first])
    registered_at = dev_server.worker("w-stable")["registered_at"]
    d1.signal(signal.SIGTERM)
    assert d1.wait(20) == 0
    second = dev_server.enqueue("q-restart", {"do": "echo"})
    daemon_factory("q-restart", procs=1, worker_id="w-stable").wait_ready()
    wait_for_status(dev_server, [second])
    rows = [w for w in dev_server.request("GET", "/api/v1/workers").json() if w["id"] == "w-stable"]
    assert len(rows) == 1
    worker = dev_server.worker("w-stable")
    assert worker["registered_at"] == registered_at
    assert worker["jobs_processed"] == 2 and worker["status"] == "healthy"


@pytest.mark.timeout(30)
def test_bad_handler_path_exits_non_zero_without_registering(dev_server):
    daemon = Daemon(dev_server, "q-bad", handler="no_such_module_xyz:handle", worker_id="w-bad").start()
    assert daemon.wait(20) == 3
    assert "No module named 'no_such_module_xyz'" in daemon.out.text()
    assert dev_server.worker("w-bad") is None


@pytest.mark.timeout(30)
def test_configuration_errors_exit_2_with_one_line(dev_server):
    cases = [
        (["--procs", "0"], "--procs must be between 1 and 1000"),
        (["--lease", "2"], "--lease must be between 5 and 3600"),
        (["--api-url", "http://example.com"], "refusing plain http://"),
    ]
    for extra, expected in cases:
        d = Daemon(dev_server, "q-cfg", worker_id="w-cfg", args=extra).start()
        assert d.wait(15) == 2
        text = d.out.text().strip()
        assert expected in text and len(text.splitlines()) == 1, text
    d = Daemon(dev_server, "q-cfg", worker_id="w-cfg", env={"SPOOLED_API_KEY": ""}).start()
    assert d.wait(15) == 2
    assert d.out.text().strip() == "error: no API key: set SPOOLED_API_KEY, or pass --api-key-file PATH"
    assert dev_server.worker("w-cfg") is None


@pytest.mark.timeout(60)
def test_payload_of_several_mib_goes_through_the_pipe(tmp_path):
    big = 8 * 2**20
    limits = ["--max-payload-bytes", str(big), "--max-body-bytes", str(2 * big)]
    server = DevServer(str(tmp_path / "big.db"), extra=limits).start()
    try:
        blob = "z" * (5 * 2**20)
        ids = [server.enqueue("q-big", {"do": "size", "blob": blob}) for _ in range(3)]
        daemon = Daemon(server, "q-big", procs=2, worker_id="w-big").start()
        try:
            jobs = wait_for_status(server, ids, timeout=40)
            assert all(j["result"]["payload_len"] == len(blob) for j in jobs)
        finally:
            daemon.stop()
    finally:
        server.stop()


@pytest.mark.timeout(60)
def test_heartbeat_titles_and_metadata(tmp_path):
    server = DevServer(str(tmp_path / "hb.db"), extra=["--heartbeat-interval", "1"]).start()
    try:
        job_id = server.enqueue("q-hb", {"do": "sleep", "secs": 4})
        daemon = Daemon(server, "q-hb", procs=2, worker_id="w-hb").start()
        try:
            wait_for_status(server, [job_id], statuses=("processing",), timeout=20)

            def heartbeat_seen():
                worker = server.worker("w-hb")
                meta = (worker or {}).get("metadata") or {}
                return worker if meta.get("busy") == 1 and worker["current_jobs"] == 1 else None

            worker = wait_until(heartbeat_seen, timeout=10, what="a heartbeat with one busy child")
            meta = worker["metadata"]
            assert meta["procs"] == 2 and meta["busy"] == 1 and meta["children"] == 2, meta
            assert meta["pid"] == daemon.proc.pid and meta["version"] == __version__, meta
            cores = psutil.cpu_count() or 1
            for name, top in (("cpu_percent", 100.0 * cores * 3), ("memory_percent", 100.0)):
                value = meta[name]  # of the parent and its children, summed
                assert isinstance(value, (int, float)) and not isinstance(value, bool), meta
                assert 0.0 <= value <= top, meta
            assert meta["memory_percent"] > 0.0  # three Python processes hold some memory
            assert worker["status"] == "healthy"
            procs = [psutil.Process(daemon.proc.pid), *psutil.Process(daemon.proc.pid).children(recursive=True)]
            titles = [" ".join(p.cmdline()).strip() for p in procs]
            assert any(t.startswith("spooled-supervisor: parent queue=q-hb busy=1/2") for t in titles), titles
            assert any(
                t == f"spooled-supervisor: child 0 busy {job_id}" or t == f"spooled-supervisor: child 1 busy {job_id}"
                for t in titles
            ), titles
            assert any(t.endswith("idle") and "child" in t for t in titles), titles
            daemon.signal(signal.SIGTERM)
            assert daemon.wait(20) == 0
        finally:
            daemon.stop()
    finally:
        server.stop()


@pytest.mark.timeout(60)
def test_a_bad_flag_or_env_value_exits_2_with_one_line_naming_it(dev_server):
    cases = [(["--procs", "abc"], {}, "--procs"), (["--lease", "soon"], {}, "--lease"),
             ([], {"SPOOLED_PROCS": "abc"}, "SPOOLED_PROCS")]
    for extra, env, name in cases:
        d = Daemon(dev_server, "q-cfg", worker_id="w-cfg", args=extra, env=env)
        if env:  # the environment only counts without the flag
            i = d.cmd.index("--procs")
            del d.cmd[i:i + 2]
        d.start()
        assert d.wait(15) == 2
        text = d.out.text().strip()
        assert len(text.splitlines()) == 1 and name in text, text
    assert dev_server.worker("w-cfg") is None
