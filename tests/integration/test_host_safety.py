"""Safe on real hosts: no orphaned grandchildren, one live daemon per worker id, several daemons
per host (the systemd template unit), a Kubernetes manifest sized by the cgroup quota.

Processes started by handlers carry HOSTS_TEST_MARKER=<uuid> in their environment (tests/support/handlers_hosts.py),
so they are found by scanning /proc whatever became of their parents; every test kills what it finds
with that marker at the end, whatever happened.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid

import pytest
import yaml
from conftest import PY, ROOT, Daemon, DevServer, parse_ts, wait_for_status, wait_until

from supervisor import exitcodes
from supervisor.parent.childproc import Child, group_besides_child, kill_group, signal_child

HANDLER = "tests.support.handlers_hosts:handle"
DONE = ("completed", "failed", "deadletter")


# --- helpers -----------------------------------------------------------------------------------------

def stat_of(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, pgid) of a process, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rfind(b")") + 2:].split()
    return fields[0].decode(), int(fields[1]), int(fields[2])


def marked(marker: str) -> dict[int, tuple[str, int, int]]:
    """Live (not zombie) processes whose environment carries the marker: pid -> (state, ppid, pgid)."""
    needle = f"HOSTS_TEST_MARKER={marker}".encode()
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                if needle not in f.read():
                    continue
        except OSError:
            continue
        st = stat_of(int(name))
        if st and st[0] != "Z":
            found[int(name)] = st
    return found


def comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def sleeps_settled(marker: str, count: int) -> dict[int, tuple[str, int, int]] | None:
    """The marked processes once they are exactly `count` sleeps (a forked sh that has not exec'd its sleep
    yet, or has not exited after forking it, carries the marker too); else None."""
    found = marked(marker)
    return found if len(found) == count and all(comm(pid) == "sleep" for pid in found) else None


def zombie_children(pid: int) -> list[int]:
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = stat_of(int(name))
            if st and st[0] == "Z" and st[1] == pid:
                out.append(int(name))
    return out


@pytest.fixture
def marker():
    value = uuid.uuid4().hex
    yield value
    for pid in marked(value):  # whatever a failed test left behind
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def hosts_daemon(daemon_factory, **kw) -> Daemon:
    return daemon_factory("hosts", handler=HANDLER, procs=1, **kw).wait_ready()


# --- process groups ------------------------------------------------------------------------------------

@pytest.mark.timeout(60)
def test_a_timed_out_job_leaves_no_process_behind(dev_server, daemon_factory, marker):
    d = hosts_daemon(daemon_factory)
    job = dev_server.enqueue("hosts", {"do": "hang", "marker": marker}, max_retries=0, timeout_seconds=2)
    child = d.busy_child(job)
    procs = wait_until(lambda: sleeps_settled(marker, 2), timeout=10, what="the plain and the double-forked sleep")
    assert stat_of(child)[2] == child != os.getpgid(d.proc.pid)  # the child leads its own group
    assert all(pgid == child for _, _, pgid in procs.values())  # both sleeps are in it
    assert any(ppid == d.proc.pid for _, ppid, _ in procs.values())  # the double-forked one: adopted by us
    (done,) = wait_for_status(dev_server, [job], DONE, timeout=15)
    assert done["status"] == "deadletter" and done["last_error"].startswith("JobTimeout"), done
    wait_until(lambda: not marked(marker), timeout=10, what="every sleep the handler started to be gone")
    wait_until(lambda: not zombie_children(d.proc.pid), timeout=5, what="the daemon to reap what it adopted")
    (logged,) = d.wait_events("stopping a child with the processes in its group")
    assert logged["reason"] == "timeout" and logged["child_pid"] == child
    assert sorted(int(p.split()[0]) for p in logged["processes"]) == sorted(procs), logged
    after = dev_server.enqueue("hosts", {"do": "quick"})
    assert wait_for_status(dev_server, [after], timeout=15)[0]["status"] == "completed"
    assert d.proc.poll() is None


@pytest.mark.timeout(60)
def test_a_child_that_exits_normally_takes_its_background_processes_along(dev_server, daemon_factory, marker):
    d = hosts_daemon(daemon_factory, args=["--max-jobs-per-child", "1"])
    job = dev_server.enqueue("hosts", {"do": "return", "marker": marker})
    (done,) = wait_for_status(dev_server, [job], timeout=15)
    assert done["status"] == "completed"
    # The child is recycled after its one job (a clean exit, no signal): its group's leftovers go with it.
    wait_until(lambda: not marked(marker), timeout=10, what="the sleeps of a recycled child to be gone")
    wait_until(lambda: d.events("replacing child"), timeout=5, what="the recycled child")
    # The child stops what its job left running as the job ends; what it had not yet stopped when it left,
    # the parent stops with its group (logged): either way nothing is left, and nothing is logged for another cause.
    for logged in d.events("stopping a child with the processes in its group"):
        assert logged["reason"] == "max_jobs" and len(logged["processes"]) <= 2, logged
    assert d.proc.poll() is None


@pytest.mark.timeout(60)
def test_a_process_that_escapes_the_group_is_adopted_and_killed_at_shutdown(dev_server, daemon_factory, marker):
    d = hosts_daemon(daemon_factory)
    job = dev_server.enqueue("hosts", {"do": "hang", "marker": marker, "escape": True}, max_retries=0,
                             timeout_seconds=2)
    child = d.busy_child(job)
    wait_until(lambda: sleeps_settled(marker, 3), timeout=10, what="three sleeps")
    wait_for_status(dev_server, [job], DONE, timeout=15)
    # The two in the child's group are gone; the one in its own session is still there, adopted by the daemon.
    left = wait_until(lambda: (lambda m: m if len(m) == 1 else None)(marked(marker)), timeout=10,
                      what="only the escaped sleep to remain")
    ((pid, (_, ppid, pgid)),) = left.items()
    assert ppid == d.proc.pid and pgid not in (child, os.getpgid(d.proc.pid))
    d.signal(signal.SIGTERM)
    assert d.wait(30) == 0
    assert not marked(marker)
    killed = d.events("killing processes that escaped their child's process group")
    assert killed and any(p.startswith(f"{pid} sleep") for p in killed[0]["processes"]), killed


@pytest.mark.timeout(60)
def test_sigterm_mid_job_leaves_no_process_behind(dev_server, daemon_factory, marker):
    d = hosts_daemon(daemon_factory, args=["--drain-timeout", "1"])
    job = dev_server.enqueue("hosts", {"do": "hang", "marker": marker, "escape": True}, timeout_seconds=120)
    d.busy_child(job)
    wait_until(lambda: sleeps_settled(marker, 3), timeout=10, what="three sleeps")
    d.signal(signal.SIGTERM)
    assert d.wait(30) == 0
    wait_until(lambda: not marked(marker), timeout=5, what="every sleep to be gone after the daemon exited")


@pytest.mark.timeout(60)
def test_sigkill_mid_job_leaves_nothing_in_the_childs_group(dev_server, daemon_factory, marker):
    """Covered after SIGKILL of the daemon: the child (PR_SET_PDEATHSIG) and everything in its process group
    (its keeper). Not covered on a bare host: a process that left the group (setsid) goes to init; under
    systemd (KillMode=mixed) or as a container's PID 1 the cgroup / pid namespace takes it down."""
    d = hosts_daemon(daemon_factory)
    job = dev_server.enqueue("hosts", {"do": "hang", "marker": marker}, timeout_seconds=120)
    child = d.busy_child(job)
    wait_until(lambda: sleeps_settled(marker, 2), timeout=10, what="two sleeps")
    os.kill(d.proc.pid, signal.SIGKILL)
    assert d.wait(5) == -signal.SIGKILL
    wait_until(lambda: not marked(marker) and stat_of(child) is None, timeout=10,
               what="the child and both sleeps to be gone after the daemon's SIGKILL")


def fake_child(pid: int) -> Child:
    return Child(slot=0, proc=None, chan=None, started_at=0.0, pid=pid)  # type: ignore[arg-type]


@pytest.mark.timeout(30)
def test_signal_child_signals_the_group_of_a_leader_and_only_the_pid_otherwise(marker):
    env = dict(os.environ, HOSTS_TEST_MARKER=marker)
    leader = subprocess.Popen(["sh", "-c", "sleep 300 & wait"], env=env, start_new_session=True)
    wait_until(lambda: len(marked(marker)) == 2, timeout=5, what="sh and its sleep")
    signal_child(fake_child(leader.pid), signal.SIGTERM)
    assert leader.wait(5) == -signal.SIGTERM
    wait_until(lambda: not marked(marker), timeout=5, what="the whole group to be gone")
    # Not a group leader (a child that has not called setpgid yet): only that pid, never its group (ours here).
    lone = subprocess.Popen(["sleep", "300"], env=env)
    signal_child(fake_child(lone.pid), signal.SIGTERM)
    assert lone.wait(5) == -signal.SIGTERM


@pytest.mark.timeout(30)
def test_kill_group_stops_and_logs_what_a_finished_childs_group_left(marker, caplog):
    env = dict(os.environ, HOSTS_TEST_MARKER=marker)
    leader = subprocess.Popen(["sh", "-c", "sleep 300 & sleep 301 & exit 0"], env=env, start_new_session=True)
    assert leader.wait(5) == 0
    wait_until(lambda: sorted(comm(pid) for pid in marked(marker)) == ["sleep", "sleep"], timeout=5,
               what="the two sleeps left behind (exec'd, not still a forked sh)")
    with caplog.at_level("WARNING", logger="supervisor"):
        left = kill_group(fake_child(leader.pid))
    assert len(left) == 2
    wait_until(lambda: not marked(marker), timeout=5, what="the leftovers to be SIGKILLed")
    msg = "stopping processes left in a finished child's process group"
    (record,) = [r for r in caplog.records if r.getMessage() == msg]
    assert sorted(p.split(" ", 1)[1] for p in record.fields["processes"]) == ["sleep: sleep 300", "sleep: sleep 301"]
    assert kill_group(fake_child(leader.pid)) == []  # nothing left: nothing done


@pytest.mark.timeout(30)
def test_the_keeper_is_known_by_the_pid_the_child_reported_before_its_title_is_set(marker):
    """A keeper forks before it sets its title: until then only its pid tells it from a handler's process."""
    env = dict(os.environ, HOSTS_TEST_MARKER=marker)
    leader = subprocess.Popen(["sh", "-c", "sleep 300 & sleep 301 & wait"], env=env, start_new_session=True)
    try:
        procs = wait_until(lambda: (lambda m: m if sorted(map(comm, m)).count("sleep") == 2 else None)(marked(marker)),
                           timeout=5, what="sh and its two sleeps")
        sleeps = [pid for pid in procs if comm(pid) == "sleep"]
        child = fake_child(leader.pid)
        stand_in = max(sleeps)  # plays the untitled keeper
        child.keeper_pid = stand_in
        listed = [int(text.split()[0]) for text in group_besides_child(child)]
        assert stand_in not in listed and sorted(listed) == sorted(p for p in sleeps if p != stand_in)
    finally:
        os.killpg(leader.pid, signal.SIGKILL)
        leader.wait(5)
    wait_until(lambda: not marked(marker), timeout=5, what="the test's processes to be gone")


SUBREAPER_SCRIPT = r"""
import multiprocessing, os, subprocess, sys, time
from supervisor.child import forkservers
from supervisor.parent import childproc, orphans

assert orphans.become_subreaper() and orphans.is_subreaper()
forkservers.start_forkserver()
helpers = childproc.multiprocessing_helper_pids()
assert helpers, helpers
env = dict(os.environ, HOSTS_TEST_MARKER=sys.argv[1])
subprocess.run(["sh", "-c", "(sleep 300 &)"], env=env, check=True)   # an orphan: re-parented to us
subprocess.run(["sh", "-c", "(sleep 0.2 &)"], env=env, check=True)   # one that dies soon: a zombie of ours
adopted = orphans.adopted()
assert len(adopted) == 2 and not set(adopted) & helpers, (adopted, helpers)
deadline = time.monotonic() + 10
reaped = []
while not reaped and time.monotonic() < deadline:
    reaped = orphans.reap_adopted()
    time.sleep(0.05)
assert len(reaped) == 1, reaped
killed = orphans.kill_adopted(grace=1.0)
assert len(killed) == 1 and "sleep" in killed[0], killed
assert not orphans.adopted()
for pid in helpers:   # multiprocessing's own children were never reaped by us: it can still wait for them
    assert os.waitpid(pid, os.WNOHANG) == (0, 0), pid
proc = multiprocessing.get_context("forkserver").Process(target=os.getpid)
proc.start(); proc.join(10)
assert proc.exitcode == 0
print("OK")
"""


@pytest.mark.timeout(60)
def test_the_subreaper_adopts_orphans_and_reaps_only_them(marker):
    """In a fresh interpreter (a subreaper pytest would adopt every test's orphans)."""
    out = subprocess.run([PY, "-c", SUBREAPER_SCRIPT, marker], cwd=ROOT, capture_output=True, text=True, timeout=50)
    assert out.returncode == 0 and out.stdout.strip() == "OK", out.stdout + out.stderr
    assert not marked(marker)


# --- one live daemon per worker id --------------------------------------------------------------------

@pytest.fixture
def fast_server(tmp_path):
    server = DevServer(str(tmp_path / "hosts.db"),
                       extra=["--lease-sweep-interval", "0.2", "--heartbeat-interval", "2"]).start()
    yield server
    server.stop()


@pytest.fixture
def daemons(fast_server):
    started: list[Daemon] = []

    def make(**kw) -> Daemon:
        d = Daemon(fast_server, "ids", handler=HANDLER, procs=1, worker_id="shared", **kw)
        started.append(d)
        return d.start()

    yield make
    for d in started:
        d.stop()




def wait_heartbeat_metadata(server: DevServer, daemon: Daemon) -> dict:
    def check():
        row = server.worker(daemon.worker_id)
        meta = (row or {}).get("metadata") or {}
        return row if meta.get("pid") == daemon.proc.pid and meta.get("heartbeat_interval") else None

    return wait_until(check, timeout=15, what="a heartbeat carrying the instance metadata")


@pytest.mark.timeout(90)
def test_a_second_daemon_on_a_live_worker_id_exits_6_and_the_first_loses_no_job(fast_server, daemons):
    first = daemons().wait_ready()
    row = wait_heartbeat_metadata(fast_server, first)
    jobs = [fast_server.enqueue("ids", {"do": "quick", "secs": 0.1}) for _ in range(20)]
    second = daemons()
    assert second.wait(30) == exitcodes.WORKER_ID_IN_USE
    (line,) = [e for e in second.records() if e.get("level") == "error"]
    meta = row["metadata"]
    assert f"pid {first.proc.pid}" in line["msg"] and meta["instance_id"] in line["msg"]
    assert meta["host"] in line["msg"] and meta["started_at"] in line["msg"]
    assert "--worker-id" in line["msg"] and "SPOOLED_WORKER_ID" in line["msg"]
    assert not second.events("registered")
    done = wait_for_status(fast_server, jobs, timeout=40)
    assert all(j["status"] == "completed" and j["retry_count"] == 0 for j in done)
    worker = fast_server.worker("shared")
    assert worker["status"] == "healthy" and worker["metadata"]["pid"] == first.proc.pid
    assert first.proc.poll() is None


@pytest.mark.timeout(60)
def test_a_restart_right_after_sigkill_starts_at_once_on_the_same_host(fast_server, daemons):
    first = daemons().wait_ready()
    wait_heartbeat_metadata(fast_server, first)
    os.kill(first.proc.pid, signal.SIGKILL)
    first.wait(5)
    started = time.monotonic()
    second = daemons().wait_ready(timeout=20)
    assert time.monotonic() - started < 2.0 + 8  # one 2 s heartbeat interval, plus start-up on a loaded machine
    assert second.events("the previous instance on this host is gone; taking the worker id over")
    assert fast_server.worker("shared")["metadata"]["pid"] == second.proc.pid


@pytest.mark.timeout(60)
def test_a_dead_predecessor_elsewhere_blocks_a_start_for_about_one_heartbeat_interval(fast_server, daemons):
    """A row last heartbeated by an instance we cannot check locally (another pid namespace: a container
    restarted in the same pod) is watched for about one interval; it does not advance, so we take over."""
    meta = {"instance_id": "deadbeef", "host": "old-pod", "pid": 1, "pid_ns": "pid:[1]", "boot_id": "elsewhere",
            "started_at": "2026-01-01T00:00:00.000Z", "heartbeat_interval": 2}
    r = fast_server.request("POST", "/api/v1/workers/register",
                            json={"queue_name": "ids", "worker_id": "shared", "hostname": "old-pod", "metadata": meta})
    assert r.status_code == 201, r.text
    d = daemons().wait_ready(timeout=30)
    (watching,) = d.events("worker id has a recent heartbeat from another instance; watching whether it is alive")
    (taken,) = d.events("the other instance stopped heartbeating; taking the worker id over")
    waited = parse_ts(taken["ts"]) - parse_ts(watching["ts"])
    assert 2.0 <= waited <= 3.5 + 2.0, waited  # watch_deadline(2 s) = 3.5 s, with slack for a loaded machine
    assert "deadbeef" in watching["other"] and "old-pod" in watching["other"]
    assert fast_server.worker("shared")["metadata"]["pid"] == d.proc.pid


# --- systemd template unit and the Kubernetes manifest -----------------------------------------------

SYSTEMD = ROOT / "systemd"
TEMPLATE = SYSTEMD / "spooled-supervisor@.service"
SYSTEMD_ANALYZE = shutil.which("systemd-analyze")
needs_systemd_analyze = pytest.mark.skipif(SYSTEMD_ANALYZE is None, reason="systemd-analyze not installed")


def unit_lines(path) -> dict[str, list[str]]:
    """Key -> every value it is given in the [Service] section (systemd allows repeats)."""
    section, out = None, {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            section = line
        elif section == "[Service]":
            key, _, value = line.partition("=")
            out.setdefault(key, []).append(value)
    return out


def test_both_units_do_not_restart_on_a_worker_id_in_use():
    for path in (SYSTEMD / "spooled-supervisor.service", TEMPLATE):
        (prevented,) = unit_lines(path)["RestartPreventExitStatus"]
        assert exitcodes.WORKER_ID_IN_USE in {int(code) for code in prevented.split()}, path


def test_the_template_takes_its_worker_id_and_settings_from_the_instance_name():
    t, single = unit_lines(TEMPLATE), unit_lines(SYSTEMD / "spooled-supervisor.service")
    assert "SPOOLED_WORKER_ID=%H-%i" in " ".join(t["Environment"])
    assert "/etc/spooled-supervisor/%i.env" in t["EnvironmentFile"]  # required: no instance without its file
    # Same hardening and stop semantics as the single unit: only the instance-specific lines differ.
    differ = {"Environment", "EnvironmentFile", "RestartPreventExitStatus"}
    assert {k: v for k, v in t.items() if k not in differ} == {k: v for k, v in single.items() if k not in differ}


def template_instance(tmp_path, instance: str, extra: str = ""):
    """A copy of the template (ExecStart pointed at an existing interpreter, which verify checks) and an
    instance of it, `spooled-supervisor@<instance>.service`, linked to it as systemd does."""
    text = TEMPLATE.read_text().replace("/opt/spooled-supervisor/venv/bin/python", sys.executable)
    if extra:
        text = text.replace("[Service]\n", "[Service]\n" + extra + "\n", 1)
    (tmp_path / TEMPLATE.name).write_text(text)
    link = tmp_path / f"spooled-supervisor@{instance}.service"
    link.symlink_to(tmp_path / TEMPLATE.name)
    return link


def analyze(*args) -> subprocess.CompletedProcess:
    return subprocess.run([SYSTEMD_ANALYZE, *args], capture_output=True, text=True, timeout=60)


@needs_systemd_analyze
def test_systemd_analyze_verifies_an_instance_of_the_template(tmp_path):
    out = analyze("verify", "--man=no", str(template_instance(tmp_path, "emails")))
    complaints = [line for line in (out.stdout + out.stderr).splitlines() if "spooled-supervisor@" in line]
    assert out.returncode == 0 and complaints == [], out.stdout + out.stderr


@needs_systemd_analyze
def test_systemd_analyze_would_catch_a_bad_key_in_the_template(tmp_path):
    """Negative control for the test above: verify really reads the template through the instance."""
    out = analyze("verify", "--man=no", str(template_instance(tmp_path, "emails", extra="KillMod=mixed")))
    assert any("spooled-supervisor@.service" in line and "KillMod" in line
               for line in (out.stdout + out.stderr).splitlines()), out.stdout + out.stderr


@needs_systemd_analyze
def test_the_template_security_exposure_stays_low(tmp_path):
    link = template_instance(tmp_path, "emails")
    out = analyze("security", "--offline=yes", "--threshold=20", "--no-pager", str(link))
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr  # exposure <= 2.0 ("OK")


def test_the_deployment_leaves_procs_to_the_cgroup_quota():
    (doc,) = [d for d in yaml.safe_load_all((ROOT / "deploy" / "k8s" / "deployment.yaml").read_text()) if d]
    (c,) = doc["spec"]["template"]["spec"]["containers"]
    assert "--procs" not in " ".join(c["args"])
    assert "SPOOLED_PROCS" not in {e["name"] for e in c.get("env", [])}
    # The limit is what the daemon reads (cpu.max); request == limit so the pod gets what it is sized for.
    assert str(c["resources"]["limits"]["cpu"]) == str(c["resources"]["requests"]["cpu"])


def test_exit_code_6_is_named():
    assert exitcodes.WORKER_ID_IN_USE == 6 and exitcodes.NAMES[6] == "worker id in use by another live daemon"
