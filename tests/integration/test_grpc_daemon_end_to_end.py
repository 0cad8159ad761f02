"""The daemon with --transport grpc (the real dev server's gRPC port, real children, real signals):
the REST daemon scenarios that matter, read back over REST."""

from __future__ import annotations

import signal
import time

import psutil
import pytest
from conftest import Daemon, reload_while_jobs_run, wait_for_status, wait_until
from support.grpc_support import start_server


@pytest.fixture
def server(tmp_path):
    s = start_server(tmp_path)
    yield s
    s.stop()


@pytest.fixture
def daemons(server):
    started: list[Daemon] = []

    def make(queue: str, args: list[str] | None = None, **kw) -> Daemon:
        d = Daemon(server, queue, args=["--transport", "grpc", "--grpc-url", server.grpc_address, *(args or [])], **kw)
        started.append(d)
        return d.start()

    yield make
    for d in started:
        d.stop()


@pytest.mark.timeout(60)
def test_jobs_completed_with_results_over_grpc(server, daemons):
    ids = [server.enqueue("g-all", {"do": "echo", "n": i}) for i in range(30)]
    daemon = daemons("g-all", procs=2, worker_id="g-all")
    jobs = wait_for_status(server, ids, timeout=40)
    for i, job in enumerate(jobs):
        assert job["result"]["echo"] == {"do": "echo", "n": i}
        assert job["assigned_worker_id"] == "g-all" and job["retry_count"] == 0
    worker = server.worker("g-all")
    assert worker["jobs_processed"] == 30 and worker["jobs_failed"] == 0
    assert len(daemon.wait_events("job completed", 30)) == 30
    assert server.request("GET", "/api/v1/workers/g-all").json()["worker_type"] == "spooled-supervisor"


@pytest.mark.timeout(60)
def test_handler_sees_ints_and_children_never_import_grpc(server, daemons):
    typed = server.enqueue("g-types", {"i": 5, "f": 2.5, "s": "x", "big": 2 ** 40})
    listed = server.enqueue("g-types", [1, 2])
    daemons("g-types", procs=1, worker_id="g-types", handler="tests.support.handlers_grpc:types")
    a, b = wait_for_status(server, [typed, listed], timeout=30)
    assert a["result"]["types"] == {"i": "int", "f": "float", "s": "str", "big": "int"}
    assert a["result"]["grpc_imported"] is False
    assert b["result"]["payload_is_none"] is True  # a non-object payload arrives missing


@pytest.mark.timeout(60)
def test_non_object_result_is_delivered_over_rest(server, daemons):
    job_id = server.enqueue("g-list", {"x": 1}, max_retries=0)
    daemons("g-list", procs=1, worker_id="g-list", handler="tests.support.handlers_grpc:listy")
    job = wait_for_status(server, [job_id], timeout=30)[0]
    assert job["result"] == [1, 2, 3]


@pytest.mark.timeout(60)
def test_raising_handler_is_retried_then_dead_lettered(server, daemons):
    job_id = server.enqueue("g-raise", {"do": "raise", "message": "bad input 42"}, max_retries=1)
    daemons("g-raise", procs=1, worker_id="g-raise")
    job = wait_for_status(server, [job_id], statuses=("deadletter",), timeout=30)[0]
    assert job["last_error"].startswith("ValueError: bad input 42") and "Traceback" in job["last_error"]
    assert job["retry_count"] == 2  # a gRPC fail counts every attempt, the dead-lettering one too
    assert server.worker("g-raise")["jobs_failed"] == 2


@pytest.mark.timeout(60)
def test_job_over_its_timeout_is_killed_and_failed(server, daemons):
    hung = server.enqueue("g-timeout", {"do": "hang"}, timeout_seconds=2, max_retries=0)
    others = [server.enqueue("g-timeout", {"do": "cpu", "ms": 200}) for _ in range(10)]
    daemon = daemons("g-timeout", procs=2, worker_id="g-timeout")
    job = wait_for_status(server, [hung], statuses=("deadletter",), timeout=30)[0]
    assert job["last_error"].startswith("JobTimeout: the job ran past its timeout of 2 s")
    wait_for_status(server, others, timeout=30)
    assert daemon.proc.poll() is None


@pytest.mark.timeout(60)
def test_long_job_keeps_its_lease_over_grpc(server, daemons):
    job_id = server.enqueue("g-lease", {"do": "sleep", "secs": 12}, timeout_seconds=60)
    daemon = daemons("g-lease", procs=1, worker_id="g-lease", args=["--lease", "5"])
    job = wait_for_status(server, [job_id], timeout=45)[0]
    assert job["retry_count"] == 0 and job["result"]["slept"] == 12
    assert not daemon.events("lease lost; stopping the job's work")


@pytest.mark.timeout(60)
def test_sigterm_drains_deregisters_and_exits_0(server, daemons):
    ids = [server.enqueue("g-drain", {"do": "sleep", "secs": 2}) for _ in range(2)]
    daemon = daemons("g-drain", procs=2, worker_id="g-drain", args=["--drain-timeout", "20"])
    wait_for_status(server, ids, statuses=("processing",), timeout=20)
    later = server.enqueue("g-drain", {"do": "echo"})
    daemon.signal(signal.SIGTERM)
    assert daemon.wait(25) == 0
    assert all(server.job(i)["status"] == "completed" for i in ids)
    assert server.job(later)["status"] == "pending"
    assert server.worker("g-drain")["status"] == "offline"
    assert daemon.events("deregistered")


@pytest.mark.timeout(120)
def test_a_reload_under_load_over_grpc_gives_no_new_job_to_a_leaving_child(server, daemons, tmp_path):
    """SIGHUP while jobs keep coming over gRPC: every child is replaced, every job started after that ran the
    new code, no job ran twice (one start each, on the server's own history: started once, completed once)."""
    version = tmp_path / "version"
    version.write_text("one")
    ids = [server.enqueue("g-reload", {"do": "version", "secs": 0.4}) for _ in range(30)]
    d = daemons("g-reload", handler="tests.support.handlers_memory:handle", procs=2, worker_id="g-reload",
                env={"MEMORY_VERSION_FILE": str(version)}).wait_ready(60)
    _, _, jobs, runs, later = reload_while_jobs_run(d, server, version, ids, first=3)
    assert later and set(later) == {"two"}, runs  # a leaving child was handed nothing new
    assert all(j["retry_count"] == 0 for j in jobs), [j["retry_count"] for j in jobs]  # none ran twice
    d.signal(signal.SIGTERM)
    assert d.wait(30) == 0


@pytest.mark.timeout(90)
@pytest.mark.exclusive
def test_chaos_killed_children_and_unavailable_faults_lose_nothing(server, daemons):
    ids = [server.enqueue("g-chaos", {"do": "sleep", "secs": 0.3, "n": i}, max_retries=10) for i in range(24)]
    daemon = daemons("g-chaos", procs=2, worker_id="g-chaos", args=["--lease", "5"])
    server.faults(fail_503=0.25, cut=0.1)
    killed = 0
    deadline = time.monotonic() + 30
    while killed < 3 and time.monotonic() < deadline:  # SIGKILL busy children while the faults are on
        pids = daemon.child_pids()
        if pids:
            try:
                psutil.Process(pids[0]).kill()
                killed += 1
            except psutil.Error:
                pass
        wait_until(lambda: len(daemon.child_pids()) >= 1, timeout=15, what="a child again")

    def all_completed():
        server.faults(fail_503=0.0, cut=0.0)
        try:
            jobs = [server.job(j) for j in ids]
        finally:
            server.faults(fail_503=0.25, cut=0.1)
        return jobs if all(j["status"] == "completed" for j in jobs) else None

    try:
        jobs = wait_until(all_completed, timeout=60, interval=0.5, what="every job completed despite the chaos")
    finally:
        server.faults(fail_503=0.0, cut=0.0)
    assert all(j["result"]["slept"] == 0.3 for j in jobs)
    stats = server.stats()
    assert stats["completed"] == 24 and stats["processing"] == 0 and stats["deadletter"] == 0, stats
    assert killed == 3 and daemon.proc.poll() is None


@pytest.mark.timeout(60)
def test_grpc_with_no_rest_url_sends_nothing_anywhere_and_asks_for_api_url(server):
    """A self-hosted gRPC server named, no REST URL: the daemon would otherwise send REST requests, with the
    key, to Spooled Cloud. It exits 2 before any request, asking for --api-url."""
    since = time.time()
    d = Daemon(server, "g-norest", args=["--transport", "grpc", "--grpc-url", server.grpc_address])
    d.cmd[d.cmd.index("--api-url"):d.cmd.index("--api-url") + 2] = []  # the REST URL not given at all
    d.start()
    assert d.wait(20) == 2
    lines = [line for line in d.out.text().splitlines() if line.strip()]
    assert len(lines) == 1 and "--api-url" in lines[0] and "Spooled Cloud" in lines[0], lines
    assert server.requests_seen(since) == [] and "api.spooled.cloud" not in d.out.text().replace(lines[0], "")


@pytest.mark.timeout(120)
def test_connections_cut_mid_frame_lose_no_job_and_run_none_twice(server):
    """A proxy that cuts every gRPC connection after a few kilobytes from the server, inside whatever frame
    they carry: the daemon's own HTTP/2 client reconnects, and every job completes once, with its result."""
    import random

    from support.h2_peer import CuttingProxy

    rng = random.Random(7)
    proxy = CuttingProxy(server.grpc_address, lambda: rng.randrange(500, 4000))
    ids = [server.enqueue("g-cut", {"do": "echo", "n": i}, max_retries=10) for i in range(30)]
    # (no prefetch: a claim whose answer is cut strands its jobs for their 5 s lease, so keep claims small)
    daemon = Daemon(server, "g-cut", procs=2, worker_id="g-cut", args=[
        "--transport", "grpc", "--grpc-url", proxy.address, "--lease", "5", "--prefetch", "0"]).start()
    try:
        jobs = wait_for_status(server, ids, timeout=90)
        for i, job in enumerate(jobs):
            assert job["result"]["echo"] == {"do": "echo", "n": i}
        assert proxy.cuts >= 3 and proxy.connections >= 4, (proxy.cuts, proxy.connections)
        stats = server.stats()
        assert stats["completed"] == 30 and stats["processing"] == 0 and stats["deadletter"] == 0, stats
        ran = daemon.wait_events("job completed", count=30)  # the server records a completion before its log line
        assert len({e["job_id"] for e in ran}) == 30 and len(ran) == 30  # each job ran to completion once
        assert daemon.proc.poll() is None and server.api_key not in daemon.out.text()
    finally:
        daemon.stop()
        proxy.close()


def _requests(port: int) -> float:
    from conftest import scrape

    return sum(v for (name, _), v in scrape(port).items() if name == "spooled_supervisor_api_requests_total")


@pytest.mark.timeout(90)
def test_an_idle_grpc_daemon_costs_no_more_requests_than_an_idle_rest_one(server, daemons):
    """Both idle on an empty queue for the same 12 s: gRPC's requests (its own calls and the REST events
    stream it listens on) are no more than REST's."""
    rest = Daemon(server, "idle-rest", procs=2, worker_id="idle-rest", args=["--health-port", "0"]).start()
    try:
        grpc_d = daemons("idle-grpc", procs=2, worker_id="idle-grpc", args=["--health-port", "0"])
        rest.wait_ready()
        grpc_d.wait_ready()
        ports = rest.health_port, grpc_d.health_port
        wait_until(lambda: all(_requests(p) >= 2 for p in ports), timeout=15, what="registered and a first claim")
        seen: list = []

        def settled():  # the start-up's one-time calls are over (on a busy host they can run late): no new
            seen.append([_requests(p) for p in ports])  # request in two reads 1.5 s apart
            return seen[-1] if len(seen) >= 2 and seen[-1] == seen[-2] else None

        before = wait_until(settled, timeout=30, interval=1.5, what="both daemons past their start-up calls")
        time.sleep(12.0)  # the window measured, not a wait for something
        spent = [_requests(p) - b for p, b in zip(ports, before, strict=True)]
        assert spent[1] <= spent[0] + 1, f"idle for 12 s: REST made {spent[0]:g} requests, gRPC {spent[1]:g}"
        assert spent[0] <= 6, spent  # idle means idle: a heartbeat every 10 s, no polling
    finally:
        rest.stop()
