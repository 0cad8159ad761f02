"""README promises no other test checked (issue 15), each against the real outcome: the real daemon and
dev server, job records read back, exit codes, process trees, /metrics."""

from __future__ import annotations

import os
import signal

import psutil
import pytest
import requests
from conftest import (
    PY,
    Daemon,
    DevServer,
    free_port,
    metric,
    parse_ts,
    wait_for_status,
    wait_until,
)

from supervisor.ops import hooks as hooks_module
from supervisor.ops.health import liveness

CHAOS = "tests.handlers_chaos"
DONE = ("completed", "failed", "deadletter")


@pytest.fixture
def stopped(dev_server):
    """Daemons appended here are stopped before the dev server is (so they can deregister)."""
    daemons: list[Daemon] = []
    yield daemons
    for d in daemons:
        d.stop()


def status_of(port: int) -> dict:
    return requests.get(f"http://127.0.0.1:{port}/status", timeout=5).json()


# ---------------------------------------------------------------- signals
@pytest.mark.timeout(60)
def test_sigint_drains_and_a_second_sigint_stops_at_once(dev_server, daemon_factory):
    ids = [dev_server.enqueue("q-int", {"do": "sleep", "secs": 60}, timeout_seconds=120) for _ in range(2)]
    d = daemon_factory("q-int", procs=2, worker_id="w-int", args=["--drain-timeout", "60"])
    wait_for_status(dev_server, ids, statuses=("processing",), timeout=20)
    later = dev_server.enqueue("q-int", {"do": "echo"})
    d.signal(signal.SIGINT)
    d.out.wait_for(r"stop signal: draining")
    wait_until(lambda: dev_server.worker("w-int")["status"] == "draining", timeout=20, what="heartbeat draining")
    assert d.proc.poll() is None  # draining: waiting for the two jobs
    d.signal(signal.SIGINT)
    assert d.wait(30) == 0  # at once, not after the 60 s drain timeout
    assert d.events("second stop signal: stopping at once")
    assert [dev_server.job(i)["status"] for i in ids] == ["pending", "pending"]  # handed back by deregister
    assert dev_server.job(later)["status"] == "pending"  # no claim after the first signal
    assert dev_server.worker("w-int")["status"] == "offline"


@pytest.mark.timeout(60)
def test_children_ignore_a_terminals_sigint_and_finish_their_job(dev_server, daemon_factory):
    """Ctrl-C reaches the whole process group; the children carry on, the parent drains."""
    d = daemon_factory("q-ctrlc", procs=2, worker_id="w-ctrlc", args=["--drain-timeout", "60"]).wait_ready()
    job_id = dev_server.enqueue("q-ctrlc", {"do": "sleep", "secs": 3})
    pid = d.busy_child(job_id)
    group = [p.pid for p in psutil.Process(d.proc.pid).children(recursive=True)]
    os.killpg(d.proc.pid, signal.SIGINT)  # the daemon leads its own group (start_new_session)
    assert d.wait(40) == 0
    job = dev_server.job(job_id)
    assert job["status"] == "completed" and job["retry_count"] == 0, job
    assert job["result"]["pid"] == pid and pid in group  # the child that got SIGINT finished the job
    assert not d.events("child died during a job")


@pytest.mark.timeout(60)
def test_sigttou_lets_a_busy_child_finish_its_job_before_leaving(dev_server, stopped):
    port = free_port()
    d = Daemon(dev_server, "q-ttou", procs=2, worker_id="w-ttou", args=["--health-port", str(port)]).start()
    stopped.append(d)
    d.wait_ready()
    ids = [dev_server.enqueue("q-ttou", {"do": "sleep", "secs": 3}) for _ in range(2)]
    pids = {d.busy_child(job_id) for job_id in ids}
    assert len(pids) == 2  # both children busy
    d.signal(signal.SIGTTOU)
    wait_until(lambda: status_of(port)["procs"] == 1, timeout=10, what="procs 1")
    jobs = wait_for_status(dev_server, ids, DONE, timeout=30)
    for job in jobs:  # neither job was cut short: each finished on the child that started it
        assert job["status"] == "completed" and job["retry_count"] == 0, job
    assert {j["result"]["pid"] for j in jobs} == pids
    wait_until(lambda: len(d.child_pids()) == 1, timeout=10, what="one child left")
    assert set(d.child_pids()) < pids  # the one that stayed is one of the two, not a new one
    assert not d.events("child died during a job")


# ---------------------------------------------------------------- exit codes
@pytest.mark.timeout(60)
def test_repeated_errors_in_the_main_loop_exit_1(dev_server):
    """A bug that fails every turn (here: the per-turn telemetry hook raising) is logged and retried for a
    hundred turns, then the daemon exits 1 (so systemd restarts it) and takes its children with it."""
    # Polling every 0.2 s keeps the idle loop turning several times a second; listening for events it
    # turns once a second, and a hundred failing turns would take longer than the test waits.
    d = Daemon(dev_server, "q-bug", procs=1, worker_id="w-bug", args=["--wake", "poll"])
    code = ("import sys; import supervisor.ops.hooks as h; import supervisor.parent.arbiter as a\n"
            "def tick(self, now):\n    raise RuntimeError('injected bug in tick')\n"
            "h.DaemonHooks.tick = tick\n"
            "a.LOOP_ERROR_PAUSE = 0.01\n"  # the pauses after the hundred errors add up to 1 s, not 10
            "from supervisor.cli import main\nsys.exit(main(sys.argv[1:]))")
    d.cmd[1:3] = ["-c", code]  # the same command line, run through a patched entry point
    d.start()
    assert d.wait(50) == 1
    errors = [line for line in d.out.lines if "unexpected error in the main loop; carrying on" in line]
    assert len(errors) >= 100, len(errors)
    assert "injected bug in tick" in d.out.text()
    wait_until(lambda: not [p for p in psutil.process_iter(["cmdline"])
                            if "spooled-supervisor: child" in " ".join(p.info["cmdline"] or [])
                            and p.ppid() in (1, d.proc.pid)], timeout=10, what="no child left behind")


@pytest.mark.timeout(30)
def test_a_registration_refused_as_invalid_exits_2(tmp_path):
    server = DevServer(str(tmp_path / "dev.db"), extra=["--max-body-bytes", "64"]).start()  # refuses the body
    d = Daemon(server, "q-refused", procs=1, worker_id="w-refused").start()
    assert d.wait(20) == 2
    line = d.events("registration refused; fix the configuration")
    assert line and line[0]["level"] == "error" and "400" in line[0]["error"], d.out.text()
    assert server.worker("w-refused") is None


# ---------------------------------------------------------------- API failures
@pytest.mark.timeout(90)
@pytest.mark.parametrize("status", [408, 500, 502, 504])
def test_408_and_5xx_other_than_503_are_retried_and_lose_nothing(dev_server, stopped, status):
    d = Daemon(dev_server, "q-5xx", procs=1, worker_id="w-5xx").start()
    stopped.append(d)
    d.wait_ready()
    job_id = dev_server.enqueue("q-5xx", {"do": "sleep", "secs": 1.5})
    d.busy_child(job_id)
    dev_server.set_faults(fail_503=1.0, fail_status=status)  # every API call answered `status`
    try:
        wait_until(lambda: [e for e in d.events("complete not delivered yet; will retry") if str(status) in e["error"]],
                   timeout=20, what=f"the result held back by {status}")
        wait_until(lambda: [e for e in d.events("claim failed") + d.events("heartbeat failed")
                            if str(status) in e["error"]], timeout=20, what=f"claims or heartbeats meeting {status}")
        assert d.proc.poll() is None
    finally:
        dev_server.set_faults(fail_503=0, fail_status=503)
    job = wait_for_status(dev_server, [job_id], DONE, timeout=30)[0]
    assert job["status"] == "completed" and job["retry_count"] == 0 and job["result"]["slept"] == 1.5
    more = dev_server.enqueue("q-5xx", {"do": "echo"})
    assert wait_for_status(dev_server, [more], timeout=20)[0]["status"] == "completed"


# ---------------------------------------------------------------- handlers
@pytest.mark.timeout(60)
def test_coroutine_handler_is_run_to_completion(dev_server, daemon_factory):
    daemon_factory("q-async", handler=f"{CHAOS}:coro", procs=1, worker_id="w-async")
    job_id = dev_server.enqueue("q-async", {"n": 7})
    job = wait_for_status(dev_server, [job_id], DONE, timeout=30)[0]
    assert job["status"] == "completed" and job["result"]["async"] is True and job["result"]["payload"] == {"n": 7}


@pytest.mark.timeout(60)
def test_ctx_log_and_ctx_progress_reach_the_daemons_log(dev_server, daemon_factory):
    d = daemon_factory("q-chatty", handler=f"{CHAOS}:chatty", procs=1, worker_id="w-chatty")
    job_id = dev_server.enqueue("q-chatty", {})
    assert wait_for_status(dev_server, [job_id], DONE, timeout=30)[0]["status"] == "completed"
    started = d.out.wait_for(r'"msg":"resizing started"')
    assert job_id in started.string and '"step":1' in started.string
    half = d.out.wait_for(r'"msg":"progress 50%: half way"')
    assert job_id in half.string and '"progress":50' in half.string
    d.out.wait_for(r'"msg":"progress 100%"')


# ---------------------------------------------------------------- environment
@pytest.mark.timeout(60)
def test_the_environment_variables_take_effect(dev_server, stopped, tmp_path):
    """No flag at all: every setting from SPOOLED_* variables, checked by what the daemon then does."""
    port = free_port()
    key_file = tmp_path / "key"
    key_file.write_text(dev_server.api_key + "\n")
    env = {"SPOOLED_API_KEY": "", "SPOOLED_API_KEY_FILE": str(key_file), "SPOOLED_QUEUE": "q-env",
           "SPOOLED_HANDLER": "supervisor.demo_handlers:misbehave", "SPOOLED_PROCS": "3",
           "SPOOLED_API_URL": dev_server.url, "SPOOLED_WORKER_ID": "w-from-env", "SPOOLED_LEASE": "45",
           "SPOOLED_POLL_INTERVAL": "0.2", "SPOOLED_HEALTH_PORT": str(port), "SPOOLED_HEALTH_HOST": "127.0.0.1",
           "SPOOLED_LOG_FORMAT": "json", "SPOOLED_LOG_LEVEL": "DEBUG", "SPOOLED_MAX_RESULT_BYTES": "5000",
           "SPOOLED_MAX_JOBS_PER_CHILD": "2", "SPOOLED_KILL_GRACE": "1", "SPOOLED_DRAIN_TIMEOUT": "7",
           "SPOOLED_API_TIMEOUT": "10"}
    d = Daemon(dev_server, "unused", worker_id="unused", env=env)
    d.cmd = [PY, "-m", "supervisor", "run"]
    stopped.append(d.start())
    d.wait_ready()
    snap = wait_until(lambda: (lambda s: s if len(s["children"]) == 3 else None)(status_of(port)), timeout=15,
                      what="three children (SPOOLED_PROCS)")
    assert snap["worker_id"] == "w-from-env" and snap["queue"] == "q-env" and snap["procs"] == 3
    assert dev_server.worker("w-from-env")["status"] == "healthy"  # the key came from the file
    big = dev_server.enqueue("q-env", {"do": "big_result", "bytes": 6000}, max_retries=0)
    job = wait_for_status(dev_server, [big], DONE, timeout=20)[0]
    assert "over the 5000 byte limit" in job["last_error"], job["last_error"]  # SPOOLED_MAX_RESULT_BYTES
    held = dev_server.enqueue("q-env", {"do": "sleep", "secs": 2})
    job = wait_for_status(dev_server, [held], ("processing",), timeout=20)[0]
    lease = parse_ts(job["lease_expires_at"]) - parse_ts(job["started_at"])
    assert 44 <= lease <= 46, lease  # SPOOLED_LEASE (the dev server's default is 30)
    ids = [dev_server.enqueue("q-env", {"do": "sleep", "secs": 0.3}) for _ in range(6)]
    jobs = wait_for_status(dev_server, [held, *ids], timeout=30)
    assert {j["assigned_worker_id"] for j in jobs} == {"w-from-env"}
    recycled = d.wait_events("replacing child", reason="max_jobs")
    assert all(e["jobs_done"] == 2 for e in recycled)  # SPOOLED_MAX_JOBS_PER_CHILD
    assert d.events("job started")  # a DEBUG line: SPOOLED_LOG_LEVEL
    assert all(line.startswith("{") for line in d.out.lines if line.strip())  # SPOOLED_LOG_FORMAT=json
    assert d.events("supervisor starting")[0]["procs"] == 3
    d.signal(signal.SIGTERM)
    assert d.wait(20) == 0


# ---------------------------------------------------------------- health
def test_readyz_not_healthz_follows_the_api_silence_limit(monkeypatch, tmp_path):
    """The decision (in-process): the daemon's health port is built with --ready-api-silence (default 60 s);
    /readyz answers 200 at 59 s of API silence and 503 at 60 s, /healthz 200 throughout."""
    from supervisor.config import load_config

    monkeypatch.setenv("SPOOLED_API_KEY", "sp_test_" + "1" * 40)
    cfg = load_config(["--queue", "q", "--handler", "supervisor.demo_handlers:noop", "--health-port", "0",
                       "--api-url", "http://127.0.0.1:9"])
    assert cfg.ready_api_silence == 60.0
    snap = {"loop_age_secs": 0.1, "api_age_secs": 59.0, "registered": True, "draining": False, "inflight": 0,
            "children": []}
    hooks = hooks_module.DaemonHooks(cfg)
    hooks.start(lambda: dict(snap))
    try:
        base = f"http://127.0.0.1:{hooks.health.port}"
        assert requests.get(base + "/readyz", timeout=5).status_code == 200
        snap["api_age_secs"] = 60.0
        r = requests.get(base + "/readyz", timeout=5)
        assert r.status_code == 503 and "last answered 60.0s ago" in r.json()["reason"]
        assert requests.get(base + "/healthz", timeout=5).status_code == 200
    finally:
        hooks.stop()
    assert liveness({"loop_age_secs": 0.1, "api_age_secs": 1e9}, 10.0, 120.0) is None


# ---------------------------------------------------------------- metrics from a real daemon
@pytest.mark.timeout(90)
def test_outcomes_and_child_restarts_in_metrics_of_a_real_daemon(dev_server, stopped):
    port = free_port()
    d = Daemon(dev_server, "q-out", procs=2, worker_id="w-out", args=["--health-port", str(port)]).start()
    stopped.append(d)
    d.wait_ready()
    cases = {"completed": {"do": "echo"}, "failed": {"do": "raise"}, "timed_out": {"do": "hang"},
             "crashed": {"do": "os_exit", "code": 9}}
    ids = {k: dev_server.enqueue("q-out", p, max_retries=0, timeout_seconds=1) for k, p in cases.items()}
    jobs = dict(zip(ids, wait_for_status(dev_server, list(ids.values()), DONE, timeout=30), strict=False))
    assert jobs["completed"]["status"] == "completed"
    assert jobs["timed_out"]["last_error"].startswith("JobTimeout")
    assert jobs["crashed"]["last_error"].startswith("ChildProcessDied") and "code 9" in jobs["crashed"]["last_error"]
    lost = dev_server.enqueue("q-out", {"do": "sleep", "secs": 30}, max_retries=0, timeout_seconds=60)
    d.busy_child(lost)
    dev_server.steal_lease(lost, "w-thief")
    d.out.wait_for(r"lease lost; stopping the job's work")

    def counts():
        values = {o: metric(port, "jobs_total", queue="q-out", outcome=o)
                  for o in ("completed", "failed", "timed_out", "crashed", "lease_lost")}
        restarts = {r: metric(port, "child_restarts_total", reason=r) for r in ("timeout", "crashed", "lease_lost")}
        return (values, restarts) if all(v == 1 for v in [*values.values(), *restarts.values()]) else None

    wait_until(counts, timeout=30, what="one of each outcome and restart in /metrics")
