"""`python -m supervisor dev`: from an empty folder to a handler that runs, reloads on save and stops cleanly,
with real processes (the dev server in `dev`, the daemon, its children) and the folder's own .spooled/."""

from __future__ import annotations

import json
import socket
import sqlite3
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from conftest import wait_until
from support.dev_session import DevSession, end_all, env

HANDLER = '''\
import os
import time

VERSION = {version}


def handle(ctx):
    ctx.log("handling", version=VERSION)
    if ctx.payload.get("fail"):
        raise ValueError("the payload asked to fail")
    time.sleep(ctx.payload.get("sleep", 0))
    while ctx.payload.get("until") and not os.path.exists(ctx.payload["until"]):
        time.sleep(0.05)  # held until the test lets it go
    return {{"version": VERSION, "echo": ctx.payload}}
'''


@pytest.fixture(autouse=True)
def _end_sessions():
    yield
    end_all()


def children(dev: DevSession) -> list[dict]:
    done = dev.cli("status", "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["children"]


def write_handler(folder: Path, version: int, extra: str = "") -> None:
    (folder / "app.py").write_text(HANDLER.format(version=version) + extra)


@pytest.mark.timeout(90)
def test_dev_from_an_empty_folder_runs_the_handler_and_enqueue_finds_it(tmp_path):
    write_handler(tmp_path, 1)
    dev = DevSession(tmp_path, "--handler", "app:handle", "--queue", "work", "--port", "0").start()
    assert dev.key.startswith("sp_test_") and "sp_live_" not in dev.key  # never the key from the environment
    assert f"export SPOOLED_API_URL={dev.url}" in dev.out.text()
    assert f"export SPOOLED_API_KEY={dev.key}" in dev.out.text()
    assert (tmp_path / ".spooled" / ".gitignore").read_text().strip().endswith("*")

    job_id = dev.enqueue('{"n": 1}')  # no URL, key or queue: found through .spooled/dev.json
    job = dev.settled(job_id)
    assert job["status"] == "completed" and job["result"] == {"version": 1, "echo": {"n": 1}}
    dev.wait_for(rf"\+ {job_id[:8]} completed in \d+ ms")
    dev.wait_for(rf"{job_id[:8]} \| handling")  # the handler's ctx.log among the job lines

    failed = dev.enqueue('{"fail": true}', "--max-retries", "0")
    assert dev.settled(failed)["status"] == "deadletter"
    dev.wait_for(rf"x {failed[:8]} failed in \d+ ms: ValueError: the payload asked to fail "
                 r"\(at \S*app.py:\d+ in handle\)")

    status = dev.cli("status")  # no port: the running dev's daemon
    assert status.returncode == 0, status.stderr
    assert "work" in status.stdout and "idle" in status.stdout

    assert dev.stop() == 0
    dev.wait_for(r"dev: stopped after \d+ s: 1 job\(s\) completed, 1 failed")
    assert not (tmp_path / ".spooled" / "dev.json").exists()

    again = DevSession(tmp_path, "--handler", "app:handle", "--queue", "work", "--port", "0").start()
    assert again.key == dev.key  # the folder's own key, the same from run to run
    assert again.job(job_id)["status"] == "completed"  # and its jobs
    assert again.stop() == 0


@pytest.mark.timeout(120)
def test_watch_reloads_on_save_keeps_a_running_job_on_old_code_and_survives_a_syntax_error(tmp_path):
    write_handler(tmp_path, 1)
    dev = DevSession(tmp_path, "--handler", "app:handle", "--queue", "work", "--port", "0", "--procs", "2",
                     "--watch").start()
    dev.wait_for("watching for code changes")
    release = tmp_path / "release"
    slow = dev.enqueue(json.dumps({"until": str(release)}))
    wait_until(lambda: dev.job(slow)["status"] == "processing", 20, what="the slow job to start")
    idle_before = {c["pid"] for c in children(dev) if c["state"] == "idle"}

    write_handler(tmp_path, 2)
    dev.wait_for("reloading the children", 20)
    wait_until(lambda: any(c["state"] == "idle" and c["pid"] not in idle_before for c in children(dev)), 20,
               what="the idle child to be replaced")
    assert dev.job(slow)["status"] == "processing"
    release.touch()
    fast = dev.enqueue('{"n": 2}')
    assert dev.settled(slow)["result"]["version"] == 1  # the running job finished on the old code
    assert dev.settled(fast)["result"]["version"] == 2  # the next one ran the new

    write_handler(tmp_path, 3, extra="\ndef broken(:\n")
    dev.wait_for("does not import", 20)
    after = dev.enqueue('{"n": 3}')
    assert dev.settled(after)["result"]["version"] == 2  # the old children kept running
    assert dev.count("does not import") == 1  # printed once

    before_fix = {c["pid"] for c in children(dev)}
    write_handler(tmp_path, 4)
    dev.wait_for("the handler imports again", 20)
    wait_until(lambda: dev.count("reloading the children") >= 2, 20, what="the second reload")
    wait_until(lambda: (now := children(dev)) and all(c["pid"] not in before_fix for c in now), 30,
               what="every child replaced after the fix")  # a job sent before that may meet an old idle child
    fixed = dev.enqueue('{"n": 4}')
    assert dev.settled(fixed)["result"]["version"] == 4
    assert dev.stop() == 0


@pytest.mark.timeout(90)
def test_a_handler_that_does_not_import_waits_for_a_fix_under_watch(tmp_path):
    (tmp_path / "app.py").write_text("import not_a_module_anywhere\n\ndef handle(ctx):\n    return 1\n")
    no_watch = subprocess.run([sys.executable, "-m", "supervisor", "dev", "--handler", "app:handle", "--queue", "q",
                               "--port", "0"], cwd=tmp_path, env=env(), capture_output=True, text=True, timeout=60)
    assert no_watch.returncode == 3
    assert "cannot import the handler app:handle" in no_watch.stderr and "not_a_module_anywhere" in no_watch.stderr

    dev = DevSession(tmp_path, "--handler", "app:handle", "--queue", "q", "--port", "0", "--watch")
    box: dict = {}
    thread = threading.Thread(target=lambda: box.setdefault("started", dev.start(60)), daemon=True)
    thread.start()
    wait_until(lambda: dev.out is not None, 10, what="dev to start")
    dev.wait_for("waiting for a save that fixes it", 30)
    assert dev.count("cannot import the handler app:handle") == 1

    def save_fixed() -> bool:  # saved again until dev sees it (its watch may start just after the line)
        write_handler(tmp_path, 1)
        return "started" in box or bool(dev.out.search("UI, signed in", 1.0))

    wait_until(save_fixed, 30, what="dev to start once the handler imports")
    thread.join(30)
    job_id = dev.enqueue('{"n": 1}')
    assert dev.settled(job_id)["result"]["version"] == 1
    assert dev.stop() == 0


def run_dev(folder: Path, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "supervisor", "dev", "--handler", "app:handle", "--queue", "q",
                           *flags], cwd=folder, env=env(), capture_output=True, text=True, timeout=60)


@pytest.mark.timeout(60)
def test_bad_folder_database_or_port_exit_2_with_one_line(tmp_path):
    write_handler(tmp_path, 1)
    blocked = tmp_path / "blocked"
    blocked.mkdir()
    write_handler(blocked, 1)
    (blocked / ".spooled").write_text("a file where the folder should be")
    done = run_dev(blocked, "--port", "0")
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and ".spooled" in done.stderr, done.stderr

    newer = tmp_path / "newer"
    newer.mkdir()
    write_handler(newer, 1)
    (newer / ".spooled").mkdir()
    with sqlite3.connect(newer / ".spooled" / "dev.db") as db:
        db.execute("PRAGMA user_version=999")
    done = run_dev(newer, "--port", "0")
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "newer" in done.stderr, done.stderr

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = run_dev(tmp_path, "--port", str(port))
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and str(port) in done.stderr, done.stderr


def test_fresh_starts_an_empty_database_with_a_new_key(tmp_path):
    write_handler(tmp_path, 1)
    first = DevSession(tmp_path, "--handler", "app:handle", "--queue", "q", "--port", "0").start()
    job_id = first.enqueue("{}")
    first.settled(job_id)
    assert first.stop() == 0
    fresh = DevSession(tmp_path, "--handler", "app:handle", "--queue", "q", "--port", "0", "--fresh").start()
    assert fresh.key != first.key
    assert fresh.api("GET", f"/api/v1/jobs/{job_id}").status_code == 404
    assert fresh.stop() == 0


def test_solo_runs_jobs_in_the_foreground_process(tmp_path):
    write_handler(tmp_path, 7)
    (tmp_path / "app.py").write_text((tmp_path / "app.py").read_text() + textwrap.dedent('''
        import os
        def where(ctx):
            return {"pid": os.getpid()}
    '''))
    dev = DevSession(tmp_path, "--handler", "app:where", "--queue", "q", "--port", "0", "--solo").start()
    job_id = dev.enqueue("{}")
    assert dev.settled(job_id)["result"] == {"pid": dev.proc.pid}  # the handler ran in dev itself
    assert dev.stop() == 0
