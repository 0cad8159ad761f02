"""The shipped systemd units under a real systemd (tests/support/systemd_box.py): start through READY=1, the key
through LoadCredential only, reload, stop with a drain, a watchdog restart, and two template instances.

One box serves the module. Inside it the dev server runs as a unit on loopback, and the units are the
files in systemd/ as shipped, run from a venv at the path they name (see `install`). Each test uses its own
queue, so the jobs it counts are its own.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import sysconfig
import tempfile
import time
import uuid
from pathlib import Path

import pytest
from support.systemd_box import SystemdBox

from supervisor import cli

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "systemd" / "spooled-supervisor.service"
TEMPLATE = ROOT / "systemd" / "spooled-supervisor@.service"
VENV = "/opt/spooled-supervisor/venv"  # where the units run the daemon from, as the install steps make it
DEPENDENCIES = "/opt/spooled-test-dependencies"  # this test venv's packages, bound there inside the box
PY = sys.executable  # the dev server's interpreter (it runs as root, outside any sandbox)
KEY = "sp_test_" + uuid.uuid4().hex
API_URL = "http://127.0.0.1:8787"  # the box's own loopback: no port is shared with the host
SERVICE = "spooled-supervisor.service"
HANDLER = "supervisor.demo_handlers:misbehave"
HIDDEN = ("/root", "/home")  # ProtectHome=yes hides these from the units
# What the box must see at the paths the host has them, for a clone and its venv under /tmp (private in the box)
CHECKOUT_AND_VENV = (ROOT, sys.prefix, sysconfig.get_paths()["purelib"])


def box_python() -> str | None:
    """An interpreter the units' dynamic user can run: this one's base, or the system's of the same version,
    when this one lives under /root or /home (pyenv)."""
    base = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    if not base.startswith(HIDDEN):
        return base
    system = f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}"
    return system if os.path.exists(system) else None


BOX_PYTHON = box_python()
pytestmark = pytest.mark.skipif(SystemdBox.unavailable() is not None or BOX_PYTHON is None,
                                reason=str(SystemdBox.unavailable() or "no interpreter outside /root and /home"))

DEV_SERVER_UNIT = f"""[Unit]
Description=Spooled dev server for the tests
[Service]
ExecStart={PY} -m supervisor dev-server --host 127.0.0.1 --port 8787 --db /var/lib/spooled-dev/dev.db \
 --api-key {KEY} --lease-duration 5
StateDirectory=spooled-dev
Environment=PYTHONDONTWRITEBYTECODE=1
"""


def install(box: SystemdBox) -> None:
    """The documented install, offline: a wheel built from this checkout, installed into a venv at the path the
    units name; its dependencies come from this test venv (bound read-only, named in a .pth file) because the
    box has no network. Then the key and the units, as shipped."""
    box.run(PY, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "--no-index",
            "--wheel-dir", "/tmp/wheels", str(ROOT), timeout=240)  # the box's overlay takes its build files
    (wheel,) = box.run("ls", "/tmp/wheels").stdout.split()
    box.run(BOX_PYTHON, "-m", "venv", "--without-pip", VENV)
    box.run(PY, "-m", "pip", "--python", f"{VENV}/bin/python", "install", "--quiet", "--no-deps", "--no-index",
            f"/tmp/wheels/{wheel}", timeout=120)
    box.run("mkdir", "-p", DEPENDENCIES)
    box.run("mount", "--bind", "-o", "ro", sysconfig.get_paths()["purelib"], DEPENDENCIES)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    box.write(f"{VENV}/lib/{version}/site-packages/dependencies.pth", f"{DEPENDENCIES}\n")
    box.write("/etc/spooled-supervisor/api-key", KEY + "\n", mode="0600")
    box.write(f"/etc/systemd/system/{UNIT.name}", UNIT.read_text())  # as shipped
    box.write(f"/etc/systemd/system/{TEMPLATE.name}", TEMPLATE.read_text())
    box.run("systemctl", "daemon-reload")


@pytest.fixture(scope="module")
def box():
    sandbox = SystemdBox(f"{uuid.uuid4().hex[:8]}", expose=CHECKOUT_AND_VENV)
    try:
        sandbox.start()
        install(sandbox)
        sandbox.write("/etc/systemd/system/spooled-dev.service", DEV_SERVER_UNIT)
        sandbox.run("systemctl", "daemon-reload")
        sandbox.run("systemctl", "start", "spooled-dev.service")
        api(sandbox, "wait")
        yield sandbox
    finally:
        sandbox.stop()


# ------------------------------------------------------------------ helpers


def api(box: SystemdBox, *args: str):
    out = box.run("env", f"SPOOLED_API_URL={API_URL}", f"SPOOLED_API_KEY={KEY}", PY, str(ROOT / "tests" / "support" /
                  "systemd_box_api.py"), *args)
    return json.loads(out.stdout) if out.stdout.strip() else None


def settings(box: SystemdBox, path: str, queue: str, **extra: str) -> None:
    lines = {"SPOOLED_API_URL": API_URL, "SPOOLED_QUEUE": queue, "SPOOLED_HANDLER": HANDLER, "SPOOLED_PROCS": "2",
             **extra}
    box.write(path, "".join(f"{k}={v}\n" for k, v in lines.items()))


def show(box: SystemdBox, unit: str, *props: str) -> dict[str, str]:
    out = box.run("systemctl", "show", unit, *(f"--property={p}" for p in props)).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def wait_for(what: str, check, timeout: float):
    """Poll `check()` until it returns something truthy; fail naming `what` at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what} (last: {value!r})")
        time.sleep(0.1)


def unit_processes(box: SystemdBox, unit: str) -> dict[int, str]:
    """pid -> command line (the process title) of every process in the unit's cgroup."""
    cgroup = show(box, unit, "ControlGroup")["ControlGroup"]
    script = ("import sys,pathlib;cg=pathlib.Path('/sys/fs/cgroup'+sys.argv[1]);"
              "pids=[p for f in [cg,*cg.rglob('*')] if (f/'cgroup.procs').exists() for p in (f/'cgroup.procs')"
              ".read_text().split()];"
              "[print(p, pathlib.Path(f'/proc/{p}/cmdline').read_bytes().replace(b'\\0',b' ').decode().strip())"
              " for p in pids]")
    out = box.run(PY, "-c", script, cgroup).stdout
    return {int(pid): rest for pid, _, rest in (line.partition(" ") for line in out.splitlines())}


def children(box: SystemdBox, unit: str) -> set[int]:
    return {pid for pid, title in unit_processes(box, unit).items() if title.startswith("spooled-supervisor: child")}


def statuses(box: SystemdBox, ids: list[str]) -> dict[str, str]:
    return api(box, "statuses", *ids)


def all_completed(box: SystemdBox, ids: list[str]):
    found = statuses(box, ids)
    return found if set(found.values()) == {"completed"} else None


def processing(box: SystemdBox, ids: list[str], n: int):
    found = statuses(box, ids)
    return [i for i, s in found.items() if s == "processing"] if list(found.values()).count("processing") >= n else None


def start(box: SystemdBox, *units: str) -> None:
    """`systemctl start` (for Type=notify it returns once READY=1 came); on failure, show the journal."""
    out = box.run("systemctl", "start", *units, check=False, timeout=60)
    if out.returncode != 0:
        journal = box.run("journalctl", "--no-pager", "-n", "60", *(f"--unit={u}" for u in units), check=False)
        raise AssertionError(f"systemctl start failed: {out.stderr}\n{journal.stdout}")


def stop_clean(box: SystemdBox, unit: str) -> dict[str, str]:
    """`systemctl stop` (it returns once the unit is down); the unit's end as systemd saw it, read before
    reset-failed clears it for the next test."""
    box.run("systemctl", "stop", unit, timeout=90)
    end = show(box, unit, "ActiveState", "Result", "ExecMainCode", "ExecMainStatus")
    box.run("systemctl", "reset-failed", unit, check=False)
    return end


# ------------------------------------------------------------------ the tests


@pytest.mark.timeout(90)
def test_start_reaches_active_through_ready_and_only_the_parent_gets_the_key(box):
    queue = "start"
    settings(box, "/etc/spooled-supervisor/supervisor.env", queue)
    start(box, SERVICE)  # Type=notify: returns once READY=1 arrived
    try:
        state = show(box, SERVICE, "ActiveState", "SubState", "StatusText", "MainPID", "Result")
        assert (state["ActiveState"], state["SubState"], state["Result"]) == ("active", "running", "success")
        assert f"queue={queue}" in state["StatusText"]  # sent with READY=1 and after
        main = int(state["MainPID"])
        uid = box.run("stat", "-c", "%u", f"/proc/{main}").stdout.strip()
        assert uid != "0"  # DynamicUser
        installed = box.run(f"{VENV}/bin/spooled-supervisor", "--version").stdout
        assert installed == f"spooled-supervisor {cli.version()}\n"  # the wheel's console script
        kids = wait_for("two children", lambda: (lambda c: c if len(c) == 2 else None)(children(box, SERVICE)), 30)
        for pid in unit_processes(box, SERVICE):
            environ = box.run("cat", f"/proc/{pid}/environ", check=False).stdout
            if pid == main:
                assert "CREDENTIALS_DIRECTORY=" in environ and KEY not in environ  # a file, not a variable
            else:
                assert KEY not in environ and "SPOOLED_API_KEY" not in environ
                assert "CREDENTIALS_DIRECTORY" not in environ
                assert "NOTIFY_SOCKET" not in environ
        assert kids <= set(unit_processes(box, SERVICE))
        ids = api(box, "enqueue", queue, json.dumps({"do": "echo", "n": 1}), "4")
        wait_for("the jobs to complete", lambda: all_completed(box, ids), 30)
        journal = box.run("journalctl", "-u", SERVICE, "--no-pager", "-o", "cat").stdout
        assert "ready" in journal and KEY not in journal
    finally:
        stop_clean(box, SERVICE)
    assert show(box, SERVICE, "ActiveState")["ActiveState"] == "inactive"


@pytest.mark.timeout(90)
def test_reload_replaces_the_children_and_the_unit_shows_reloading_until_they_are_new(box):
    """`systemctl reload` waits while the busy child finishes its job and is replaced; the unit shows
    `reloading` meanwhile, then `active` with two new children."""
    queue = "reload"
    settings(box, "/etc/spooled-supervisor/supervisor.env", queue)
    start(box, SERVICE)
    try:
        before = wait_for("two children", lambda: (lambda c: c if len(c) == 2 else None)(children(box, SERVICE)), 30)
        # 8 s: long enough that the job is still running when a busy host has shown `reloading`
        ids = api(box, "enqueue", queue, json.dumps({"do": "sleep", "secs": 8}), "1")
        wait_for("the job to run", lambda: processing(box, ids, 1), 20)
        began = time.monotonic()
        reload = box.popen("systemctl", "reload", SERVICE)
        wait_for("the unit to show reloading", lambda: show(box, SERVICE, "ActiveState")["ActiveState"] == "reloading",
                 10)
        assert statuses(box, ids) == {ids[0]: "processing"}  # still reloading: the busy child is not new yet
        _, err = reload.communicate(timeout=30)
        took = time.monotonic() - began
        assert reload.returncode == 0, err
        assert show(box, SERVICE, "ActiveState")["ActiveState"] == "active"
        assert statuses(box, ids) == {ids[0]: "completed"}  # the busy child finished its job before it went
        after = children(box, SERVICE)
        assert len(after) == 2 and not (after & before), (before, after)
        assert took < 20, took  # the job's end, then one child's start-up
        journal = box.run("journalctl", "-u", SERVICE, "--no-pager", "-o", "cat").stdout
        assert "reload complete" in journal
    finally:
        stop_clean(box, SERVICE)


@pytest.mark.timeout(90)
def test_stop_drains_running_jobs_and_hands_the_rest_back(box):
    queue = "stop"
    settings(box, "/etc/spooled-supervisor/supervisor.env", queue)
    start(box, SERVICE)
    try:
        ids = api(box, "enqueue", queue, json.dumps({"do": "sleep", "secs": 2}), "6")
        running = wait_for("two jobs running", lambda: processing(box, ids, 2), 20)
    finally:
        started = time.monotonic()
        end = stop_clean(box, SERVICE)  # blocks until the daemon has drained and exited
    took = time.monotonic() - started
    assert (end["ActiveState"], end["Result"], end["ExecMainStatus"]) == ("inactive", "success", "0"), end
    found = statuses(box, ids)
    assert all(found[i] == "completed" for i in running), found  # finished, not killed
    assert set(found.values()) <= {"completed", "pending"}, found  # none lost, none left processing
    assert took < 25, took  # the drain waited for the jobs, not for a timeout


@pytest.mark.timeout(90)
def test_a_drain_longer_than_timeoutstopsec_is_extended_not_killed(box):
    """A drop-in cuts TimeoutStopSec to 2 s; a 5 s job still finishes because the daemon sends
    EXTEND_TIMEOUT_USEC while it drains (without it systemd would SIGKILL at 2 s: Result=timeout)."""
    queue = "extend"
    settings(box, "/etc/spooled-supervisor/supervisor.env", queue)
    box.write(f"/etc/systemd/system/{SERVICE}.d/short-stop.conf", "[Service]\nTimeoutStopSec=2\n")
    box.run("systemctl", "daemon-reload")
    try:
        start(box, SERVICE)
        ids = api(box, "enqueue", queue, json.dumps({"do": "sleep", "secs": 5}), "1")
        wait_for("the job to run", lambda: processing(box, ids, 1), 20)
        end = stop_clean(box, SERVICE)
        assert (end["Result"], end["ExecMainStatus"]) == ("success", "0"), end  # exited 0, not SIGKILLed
        assert statuses(box, ids) == {ids[0]: "completed"}
    finally:
        box.run("rm", "-r", f"/etc/systemd/system/{SERVICE}.d")
        box.run("systemctl", "daemon-reload")
        stop_clean(box, SERVICE)


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_a_frozen_parent_is_killed_by_the_watchdog_and_restarted_and_its_jobs_complete(box):
    """A drop-in shortens the shipped WatchdogSec=30 and RestartSec=5 to 10 s and 1 s (the daemon pings every
    5 s, half of it), and a 6 s lease lets the frozen parent's jobs go back to the queue by the time it is
    restarted: killed, back and done within seconds rather than a minute."""
    queue = "watchdog"
    settings(box, "/etc/spooled-supervisor/supervisor.env", queue, SPOOLED_LEASE="6")
    box.write(f"/etc/systemd/system/{SERVICE}.d/short-watchdog.conf", "[Service]\nWatchdogSec=10\nRestartSec=1\n")
    box.run("systemctl", "daemon-reload")
    try:
        start(box, SERVICE)
        assert show(box, SERVICE, "WatchdogUSec")["WatchdogUSec"] in ("10s", "10000000")  # the drop-in took
        ids = api(box, "enqueue", queue, json.dumps({"do": "sleep", "secs": 1}), "6")
        wait_for("a job to run", lambda: processing(box, ids, 1), 20)
        main = show(box, SERVICE, "MainPID")["MainPID"]
        box.run("kill", "-STOP", main)
        restarted = wait_for("systemd to restart the unit", lambda: (lambda s: s if s["NRestarts"] == "1" and
                             s["ActiveState"] == "active" and s["MainPID"] != main else None)(
                             show(box, SERVICE, "NRestarts", "ActiveState", "MainPID")), 90)
        assert restarted["MainPID"] != main
        journal = box.run("journalctl", "-u", SERVICE, "--no-pager", "-o", "cat").stdout
        assert "Watchdog timeout" in journal, journal[-3000:]
        wait_for("every job to complete after the restart", lambda: all_completed(box, ids), 60)
    finally:
        box.run("rm", "-r", f"/etc/systemd/system/{SERVICE}.d")
        box.run("systemctl", "daemon-reload")
        stop_clean(box, SERVICE)


@pytest.mark.timeout(90)
def test_the_template_runs_two_instances_side_by_side(box):
    hostname = box.run("hostname").stdout.strip() or socket.gethostname()
    for name in ("alpha", "beta"):
        settings(box, f"/etc/spooled-supervisor/{name}.env", f"tpl-{name}")
    units = ["spooled-supervisor@alpha.service", "spooled-supervisor@beta.service"]
    try:
        start(box, *units)
        pids = {show(box, u, "MainPID")["MainPID"] for u in units}
        assert len(pids) == 2 and "0" not in pids
        assert all(show(box, u, "ActiveState")["ActiveState"] == "active" for u in units)
        workers = api(box, "workers")
        for name in ("alpha", "beta"):
            assert workers.get(f"{hostname}-{name}") == "healthy", workers
        ids = {name: api(box, "enqueue", f"tpl-{name}", json.dumps({"do": "echo"}), "3") for name in ("alpha", "beta")}
        for name, job_ids in ids.items():
            wait_for(f"{name}'s jobs to complete", lambda job_ids=job_ids: all_completed(box, job_ids), 30)
    finally:
        for u in units:
            stop_clean(box, u)


@pytest.mark.timeout(60)
def test_a_box_sees_a_checkout_under_tmp_and_keeps_its_writes():
    """A clone under /tmp works: the box's /tmp is private, but what it is told to expose is there, at the same
    path, and what the box writes into it (a wheel build's files) never reaches the host."""
    clone = Path(tempfile.mkdtemp(prefix="spooled-clone-", dir="/tmp"))
    try:
        (clone / "marker").write_text("from the host\n")
        inner = SystemdBox(uuid.uuid4().hex[:8], expose=[clone, clone / "marker"])
        try:
            inner.start()
            assert inner.run("cat", str(clone / "marker")).stdout == "from the host\n"
            inner.run("touch", str(clone / "built-inside"))
            assert inner.run("ls", "/tmp").stdout.split() == [clone.name]  # nothing else of the host's /tmp
        finally:
            inner.stop()
        assert sorted(p.name for p in clone.iterdir()) == ["marker"]
    finally:
        shutil.rmtree(clone, ignore_errors=True)
