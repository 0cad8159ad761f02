"""End to end in a real memory cgroup of its own (made for the test, cgroup v2 or v1): memory pressure with
thresholds low enough to trip on a small allocation (pause, shed the newest job, renewals go on, resume),
and a real kernel OOM kill named as such."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import requests
from conftest import Daemon, wait_for_status, wait_until
from support.intake_helpers import status as status_of

MiB = 2**20
DONE = ("completed", "deadletter", "failed")
NO_CGROUP = "no writable memory cgroup to run the daemon in"


def make_cgroup(name: str, limit_mib: int) -> Path | None:
    """A new memory cgroup below this process's own, limited to `limit_mib`; None if none can be made."""
    lines = Path("/proc/self/cgroup").read_text().splitlines()
    candidates = []
    for line in lines:
        hier, controllers, path = line.split(":", 2)
        if hier == "0" and controllers == "":
            candidates.append((Path("/sys/fs/cgroup") / path.lstrip("/"), "memory.max"))
        elif "memory" in controllers.split(","):
            candidates.append((Path("/sys/fs/cgroup/memory") / path.lstrip("/"), "memory.limit_in_bytes"))
    for parent, limit_file in candidates:
        cg = parent / name
        try:
            cg.mkdir(exist_ok=True)
            (cg / limit_file).write_text(str(limit_mib * MiB))
            return cg
        except OSError:
            try:
                cg.rmdir()
            except OSError:
                pass
    return None


@pytest.fixture
def cgroup(request):
    made: list[Path] = []

    def make(limit_mib: int) -> Path:
        cg = make_cgroup(f"spooled-i25-{os.getpid()}-{len(made)}", limit_mib)
        if cg is None:
            pytest.skip(NO_CGROUP)
        made.append(cg)
        return cg

    yield make
    for cg in made:
        procs = cg / "cgroup.procs"
        wait_until(lambda p=procs: not p.read_text().strip(), timeout=20, what="the cgroup empty")
        cg.rmdir()


def daemon_in(cg: Path, dev_server, queue: str, args: list[str], procs: int = 2) -> Daemon:
    d = Daemon(dev_server, queue, handler="tests.support.handlers_memory:handle", procs=procs, args=args)
    d.cmd = ["sh", "-c", f'echo $$ > "{cg}/cgroup.procs" && exec "$@"', "sh", *d.cmd]
    return d.start()


@pytest.mark.timeout(120)
def test_pressure_pauses_sheds_the_newest_job_keeps_renewing_and_resumes(dev_server, cgroup):
    cg = cgroup(1024)
    d = daemon_in(cg, dev_server, "pressure", ["--memory-high", "220", "--memory-max", "330", "--lease", "5",
                                               "--health-port", "0"]).wait_ready(60)
    port = d.health_port
    try:
        # An older job holds 100 MiB for 14 s (under the high threshold alone), on a lease of 5 s.
        older = dev_server.enqueue("pressure", {"do": "alloc", "mb": 100, "secs": 14}, max_retries=0)
        d.busy_child(older)
        # The newest takes 260 MiB more: over the max. It is stopped and failed; the older one goes on.
        newest = dev_server.enqueue("pressure", {"do": "alloc", "mb": 260, "secs": 30}, max_retries=0)
        shed = wait_for_status(dev_server, [newest], DONE, timeout=30)[0]
        assert shed["status"] == "deadletter", shed
        assert shed["last_error"].startswith("MemoryPressure: this worker's memory reached "), shed
        assert "this job, the newest running, was stopped so that it can retry elsewhere" in shed["last_error"]
        d.wait_events("memory above the max threshold: stopping the newest running job", job_id=newest)

        d.wait_events("memory above the high threshold: pausing claims and handing reserved jobs back")
        memory = status_of(port)["memory"]
        assert memory["source"] in ("cgroup1", "cgroup2") and memory["limit_bytes"] == 1024 * MiB
        assert memory["shed_jobs"] == 1 and memory["high_bytes"] == 220 * MiB and memory["max_bytes"] == 330 * MiB
        # While paused (the older job's 100 MiB and a new child may keep it above the resume line), a new job waits.
        waiting = dev_server.enqueue("pressure", {"do": "version"})
        held = dev_server.job(waiting)["status"]
        if status_of(port)["memory"]["paused"]:  # paused from before it was enqueued to after it was read
            assert held == "pending"
        # The memory gauges are refreshed once a second: wait for a refresh that saw the children's memory.
        gauges = ('spooled_supervisor_memory_pressure{state="max"}', "spooled_supervisor_memory_limit_bytes 1073741824",
                  "spooled_supervisor_child_memory_bytes{")
        metrics = wait_until(lambda: (lambda t: t if all(g in t for g in gauges) else None)(
            requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text), timeout=10, what="the memory gauges")
        assert 'spooled_supervisor_memory_pressure{state="max"}' in metrics
        assert "spooled_supervisor_memory_limit_bytes 1073741824" in metrics
        assert "spooled_supervisor_child_memory_bytes{" in metrics

        # The older job outlives its 5 s lease several times over: renewals went on while paused.
        done = wait_for_status(dev_server, [older, waiting], DONE, timeout=40)
        assert [j["status"] for j in done] == ["completed", "completed"], done
        d.wait_events("memory back below the high threshold: resuming claims")
    finally:
        d.stop()


@pytest.mark.timeout(120)
def test_a_child_killed_by_the_kernel_oom_killer_is_named_so(dev_server, cgroup):
    cg = cgroup(300)
    d = daemon_in(cg, dev_server, "oom", ["--memory-high", "99%", "--memory-max", "100%", "--health-port", "0"],
                  procs=1).wait_ready(60)
    port = d.health_port
    try:
        started = time.monotonic()
        job_id = dev_server.enqueue("oom", {"do": "alloc", "mb": 600, "secs": 5}, max_retries=0)
        job = wait_for_status(dev_server, [job_id], DONE, timeout=40)[0]
        assert job["status"] == "deadletter", job
        assert job["last_error"].startswith("ChildProcessDied: the child process running this job (pid "), job
        assert job["last_error"].endswith("killed by the kernel OOM killer (SIGKILL)"), job
        assert time.monotonic() - started < 40
        # The job's failure is sent when the death is seen; /status is a snapshot published at most every 100 ms.
        memory = wait_until(lambda: (lambda m: m if m["oom_kills"] else None)(status_of(port)["memory"]),
                            timeout=5, what="the OOM kill in /status")
        assert memory["oom_kills"] == 1
        metrics = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        assert "spooled_supervisor_oom_kills_total 1" in metrics
        ok = wait_for_status(dev_server, [dev_server.enqueue("oom", {"do": "version"})], timeout=30)[0]
        assert ok["status"] == "completed"  # a new child took over
    finally:
        d.stop()
