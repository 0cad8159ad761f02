"""The pytest plugin `supervisor.testing`: the documented example (docs/testing.md) run as written, the fixture,
and `run_jobs` under the real daemon (real children, real framing), including how it fails and that it leaves
nothing running."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import requests
from conftest import ROOT

import supervisor.testing
from supervisor import demo_handlers, exitcodes
from supervisor.testing import DaemonExited, JobsNotSettled, daemon_args, handler_spec, run_jobs

pytestmark = pytest.mark.timeout(120)
MISBEHAVE = "supervisor.demo_handlers:misbehave"


def descendants() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True) if p.is_running()
            and p.status() != psutil.STATUS_ZOMBIE}


def processes_mentioning(text: str) -> list[str]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if text in cmdline and proc.pid != os.getpid():
            found.append(cmdline)
    return found


def example_files() -> dict[str, str]:
    """The documented example files (docs/testing.md): every python block whose first line is `# <path>.py`."""
    page = (ROOT / "docs" / "testing.md").read_text()
    section = page.split("## Testing your handlers", 1)[1].split("\n## ", 1)[0]
    files = {}
    for block in re.findall(r"```python\n(.*?)```", section, re.S):
        first = block.splitlines()[0]
        if re.fullmatch(r"# [\w/]+\.py", first):
            files[first[2:]] = block
    return files


def run_pytest(project, *args: str) -> subprocess.CompletedProcess:
    """pytest in a fresh process, in `project`, with this checkout's `supervisor` first on the path."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(project), str(ROOT)]))
    env.pop("PYTEST_ADDOPTS", None)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--basetemp", str(project / "tmp"),
           "--timeout", "90", *args]
    return subprocess.run(cmd, cwd=project, env=env, capture_output=True, text=True, timeout=110)


def test_the_plugin_is_loaded_through_its_entry_point(pytestconfig):
    assert pytestconfig.pluginmanager.get_plugin("spooled") is supervisor.testing


def test_the_documented_example_passes_as_written(tmp_path):
    files = example_files()
    assert sorted(files) == ["mypackage/jobs.py", "tests/test_jobs.py"]
    for path, text in files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    (tmp_path / "mypackage" / "__init__.py").write_text("")
    out = run_pytest(tmp_path, "tests/test_jobs.py")
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert re.search(r"^4 passed", out.stdout, re.M), out.stdout[-2000:]
    assert processes_mentioning(str(tmp_path)) == []  # every dev server and daemon of the run is gone


def test_the_fixture_stops_its_server_when_the_test_fails(tmp_path):
    record = tmp_path / "server.txt"
    (tmp_path / "test_fails.py").write_text(
        "def test_fails(spooled_dev_server):\n"
        "    spooled_dev_server.enqueue('q', {'x': 1})\n"
        "    server = spooled_dev_server\n"
        f"    open({str(record)!r}, 'w').write(f'{{server.pid}} {{server.url}}')\n"
        "    assert False, 'the test fails on purpose'\n")
    out = run_pytest(tmp_path, "test_fails.py")
    assert out.returncode == 1 and re.search(r"^1 failed", out.stdout, re.M), out.stdout[-3000:]
    pid, url = record.read_text().split()
    assert url.startswith("http://127.0.0.1:")
    assert not psutil.pid_exists(int(pid)) or psutil.Process(int(pid)).status() == psutil.STATUS_ZOMBIE
    with pytest.raises(requests.ConnectionError):
        requests.get(url + "/health", timeout=2)


def test_the_fixture_yields_a_server_with_a_client(spooled_dev_server):
    assert spooled_dev_server.url.startswith("http://127.0.0.1:")
    assert spooled_dev_server.api_key.startswith("sp_test_")
    jid = spooled_dev_server.enqueue("plain", {"a": [1, 2]}, priority=5, max_retries=0)
    job = spooled_dev_server.job(jid)
    assert (job["status"], job["payload"], job["priority"], job["max_retries"]) == ("pending", {"a": [1, 2]}, 5, 0)
    assert spooled_dev_server.queue_stats("plain")["pending_jobs"] == 1
    with pytest.raises(JobsNotSettled, match=r"1 of 1 jobs not settled after 0.3 s: \{'pending': 1\}"):
        spooled_dev_server.wait([jid], timeout=0.3)
    (done,) = spooled_dev_server.run_jobs(MISBEHAVE, [{"do": "echo", "v": 1}])
    assert done.ok and done.result["echo"] == {"do": "echo", "v": 1}
    assert spooled_dev_server.wait([done.id], timeout=5)[0]["status"] == "completed"
    worker = spooled_dev_server.worker(done.record["assigned_worker_id"])
    assert worker["status"] == "offline" and worker["jobs_processed"] == 1  # the daemon deregistered on SIGTERM


def test_run_jobs_returns_what_the_real_children_did_in_payload_order(spooled_dev_server):
    payloads = [{"do": "echo", "n": 1}, {"do": "raise", "message": "nope"}, {"do": "os_exit", "code": 9},
                {"do": "unserialisable"}, {"do": "kill9"}, {"do": "echo", "n": 2}]
    done = run_jobs(MISBEHAVE, payloads, procs=2, server=spooled_dev_server, max_retries=0)
    assert [j.status for j in done] == ["completed", "deadletter", "deadletter", "deadletter", "deadletter",
                                        "completed"]
    assert [j.result["echo"]["n"] for j in (done[0], done[5])] == [1, 2]
    assert done[0].result["pid"] != os.getpid()  # it ran in a child process
    assert done[1].last_error.startswith("ValueError: nope")
    assert "exited with code 9" in done[2].last_error
    assert done[3].last_error.startswith("ResultNotSerializable")
    assert done[4].last_error.startswith("ChildProcessDied") and "killed by signal 9" in done[4].last_error
    assert all(j.retry_count == 0 and j.max_retries == 0 for j in done)


def test_a_retried_job_settles_after_its_retry(spooled_dev_server):
    (job,) = run_jobs(MISBEHAVE, [{"do": "raise"}], server=spooled_dev_server, max_retries=1, timeout=30)
    assert (job.status, job.retry_count) == ("deadletter", 1)  # two attempts, 1-1.5 s of back-off between


def test_daemon_options_reach_the_daemon(spooled_dev_server):
    """max_jobs_per_child=1: every job gets a fresh child, so three jobs show three pids."""
    done = run_jobs(MISBEHAVE, [{"do": "echo"}] * 3, server=spooled_dev_server, max_jobs_per_child=1, lease=10)
    assert [j.status for j in done] == ["completed"] * 3
    assert len({j.result["pid"] for j in done}) == 3


def test_run_jobs_alone_starts_and_ends_its_own_server():
    before = descendants()
    done = run_jobs(demo_handlers.burn, [{"ms": 5, "echo": i} for i in range(4)], procs=2)
    assert [j.result["echo"] for j in done] == [0, 1, 2, 3] and all(j.ok for j in done)
    assert descendants() <= before


def test_a_handler_that_cannot_be_imported_raises_with_the_exit_code():
    before = descendants()
    with pytest.raises(DaemonExited, match="exited with code 3") as caught:
        run_jobs("no_such_module_for_spooled_tests:handle", [{}], timeout=30)
    assert caught.value.exit_code == exitcodes.HANDLER_IMPORT
    assert "no_such_module_for_spooled_tests" in str(caught.value)  # the daemon's own output is in the error
    assert descendants() <= before


def test_jobs_that_never_settle_end_the_daemon_and_its_children(spooled_dev_server):
    before = descendants()
    # The timeout counts from the daemon's start: 6 s, so a loaded machine still has it claim the job first
    with pytest.raises(JobsNotSettled, match=r"1 of 1 jobs not settled after 6 s: \{'processing': 1\}"):
        run_jobs(MISBEHAVE, [{"do": "hang"}], server=spooled_dev_server, timeout=6, kill_grace=1)
    assert descendants() - before == {spooled_dev_server.pid} - before  # only the fixture's server is left


def test_daemon_options_map_to_flags_and_bad_ones_fail_before_anything_starts():
    assert daemon_args({"lease": 10, "max_memory_per_child": 256, "allow_insecure_http": True,
                        "ca_bundle": None, "log_level": "DEBUG"}) == [
        "--lease", "10", "--max-memory-per-child", "256", "--allow-insecure-http", "--log-level", "DEBUG"]
    assert daemon_args({"allow_insecure_http": False}) == []
    with pytest.raises(TypeError, match="unknown daemon option 'leese'"):
        daemon_args({"leese": 10})
    with pytest.raises(TypeError, match="sets --queue itself"):
        daemon_args({"queue": "other"})
    with pytest.raises(TypeError, match="is a switch"):
        daemon_args({"allow_insecure_http": "yes"})
    before = descendants()
    with pytest.raises(TypeError, match="unknown daemon option"):
        run_jobs(MISBEHAVE, [{}], no_such_option=1)
    assert descendants() <= before


def test_handlers_are_named_or_module_level_functions():
    assert handler_spec(MISBEHAVE) == MISBEHAVE
    assert handler_spec(demo_handlers.misbehave) == MISBEHAVE
    with pytest.raises(ValueError, match="cannot be imported by a child"):
        handler_spec(lambda ctx: None)
    with pytest.raises(ValueError, match="package.module:function"):
        handler_spec("no_colon")
    assert run_jobs(MISBEHAVE, []) == []


def test_run_jobs_and_enqueue_carry_a_trace_context(spooled_dev_server):
    parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    (done,) = run_jobs(MISBEHAVE, [{"do": "echo"}], server=spooled_dev_server, traceparent=parent)
    assert done.result["echo"] == {"do": "echo", "_spooled_trace": {"traceparent": parent}}
    jid = spooled_dev_server.enqueue("traced", {"a": 1}, traceparent=parent)
    assert spooled_dev_server.job(jid)["payload"]["_spooled_trace"] == {"traceparent": parent}
    with pytest.raises(ValueError, match="object payload"):
        spooled_dev_server.enqueue("traced", "text", traceparent=parent)


@pytest.mark.timeout(60)
def test_the_readmes_handler_runs_as_written(dev_server, tmp_path):
    """README's handler file and command, literally (the key and URL pointed at the dev server)."""
    readme = (ROOT / "README.md").read_text().split("## A handler", 1)[1].split("\n## ", 1)[0]
    (code,) = re.findall(r"```python\n(.*?)```", readme, re.S)
    (command,) = re.findall(r"```sh\n(.*?)```", readme, re.S)
    path = code.splitlines()[0].removeprefix("# ")
    (tmp_path / path).parent.mkdir(parents=True)
    (tmp_path / path).parent.joinpath("__init__.py").write_text("")
    (tmp_path / path).write_text(code)
    words = command.strip().splitlines()[-1].split()
    assert words[0].startswith("SPOOLED_API_KEY=") and words[1] == "spooled-supervisor", command
    queue = words[words.index("--queue") + 1]
    job = dev_server.enqueue(queue, {"width": 640, "height": 480})
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"SPOOLED_API_KEY": dev_server.api_key}
    script = str(Path(sys.executable).parent / words[1])
    args = [*words[2:], "--procs", "1", "--api-url", dev_server.url, "--until-empty", "--poll-interval", "0.2"]
    run = subprocess.run([script, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=45)
    assert run.returncode == 0, run.stderr[-3000:]
    assert dev_server.job(job)["result"] == {"width": 320, "height": 240}
    assert '"msg":"resizing"' in run.stderr and '"width":640' in run.stderr
