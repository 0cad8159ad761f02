"""The command line: `--version` on every command, the program named as invoked, and the reload command."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from conftest import own, wait_until

from supervisor import cli

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(sys.executable).parent / "spooled-supervisor"  # the console script of this venv
PYPROJECT_VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def test_the_version_is_the_packages():
    assert cli.version() == metadata.version("spooled-supervisor") == PYPROJECT_VERSION


@pytest.mark.parametrize("argv", [["--version"], ["-V"], *([name, "--version"] for name in cli.SUBCOMMANDS)])
def test_every_command_answers_version(argv, capsys):
    try:
        code = cli.main(argv)
    except SystemExit as exc:  # argparse's version action exits
        code = exc.code
    assert code == 0
    assert capsys.readouterr().out == f"spooled-supervisor {PYPROJECT_VERSION}\n"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("invocation, named", [([sys.executable, "-m", "supervisor"], "python -m supervisor"),
                                               ([str(SCRIPT)], "spooled-supervisor")])
def test_help_and_errors_name_the_program_as_invoked(invocation, named):
    named = named.replace("python", Path(sys.executable).name)
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    version = subprocess.run([*invocation, "--version"], capture_output=True, text=True, timeout=30, env=env)
    assert (version.returncode, version.stdout) == (0, f"spooled-supervisor {PYPROJECT_VERSION}\n")
    top = subprocess.run([*invocation, "--help"], capture_output=True, text=True, timeout=30, env=env)
    assert top.stdout.startswith(f"usage: {named} [SUBCOMMAND]")
    bad = subprocess.run([*invocation, "status", "--bogus"], capture_output=True, text=True, timeout=30, env=env)
    assert bad.returncode == 2 and f"{named} status: error: unrecognized arguments: --bogus" in bad.stderr
    assert bad.stderr.startswith(f"usage: {named} status")
    run = subprocess.run([*invocation, "--bogus"], capture_output=True, text=True, timeout=30, env=env)
    assert run.returncode == 2 and run.stderr.count("\n") == 1 and f"see {named} run --help" in run.stderr
    unknown = subprocess.run([*invocation, "frobnicate"], capture_output=True, text=True, timeout=30, env=env)
    assert unknown.returncode == 2 and unknown.stderr.startswith(f"{named}: error: unknown subcommand 'frobnicate'")


def test_the_program_name_follows_argv0(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["/usr/local/bin/spooled-supervisor", "status"])
    assert cli.program() == "spooled-supervisor"
    monkeypatch.setattr(sys, "argv", [str(ROOT / "supervisor" / "__main__.py")])
    assert cli.program() == f"{Path(sys.executable).name} -m supervisor"


# ------------------------------------------------------------------ reload

@pytest.mark.timeout(30)
@pytest.mark.parametrize("pid, says", [("0", "is not a process id"), ("999999999", "no process has pid"),
                                       ("self", "is not a spooled-supervisor daemon")])
def test_reload_refuses_what_is_not_a_daemon_in_one_line(pid, says):
    pid = str(os.getpid()) if pid == "self" else pid
    out = subprocess.run([sys.executable, "-m", "supervisor", "reload", pid], capture_output=True, text=True,
                         timeout=20)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and says in out.stderr, out.stderr


FAKE_DAEMON = """
import signal, sys, setproctitle
setproctitle.setproctitle("spooled-supervisor: parent queue=q busy=0/1 inflight=0")
signal.signal(signal.SIGHUP, lambda *a: (print("SIGHUP", flush=True), sys.exit(0)))
print("up", flush=True)
signal.pause()
"""


@pytest.mark.timeout(30)
def test_reload_sends_reloading_to_systemd_then_sighup_to_the_daemon():
    tmpdir = tempfile.mkdtemp(prefix="rl-", dir="/tmp")  # short: AF_UNIX paths max 107 bytes
    path = os.path.join(tmpdir, "notify")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.settimeout(10)
    sock.bind(path)
    daemon = own(subprocess.Popen([sys.executable, "-c", FAKE_DAEMON], stdout=subprocess.PIPE, text=True,
                                  start_new_session=True))
    try:
        assert daemon.stdout is not None and daemon.stdout.readline() == "up\n"
        wait_until(lambda: Path(f"/proc/{daemon.pid}/cmdline").read_bytes().startswith(b"spooled-supervisor"),
                   what="the title")
        out = subprocess.run([sys.executable, "-m", "supervisor", "reload", str(daemon.pid)], capture_output=True,
                             text=True, timeout=20, env={**os.environ, "NOTIFY_SOCKET": path})
        assert out.returncode == 0, out.stderr
        message = sock.recv(4096).decode()
        assert message.startswith("RELOADING=1\nMONOTONIC_USEC=") and int(message.rsplit("=", 1)[1]) > 0
        assert daemon.stdout.readline() == "SIGHUP\n" and daemon.wait(10) == 0
    finally:
        if daemon.poll() is None:
            daemon.send_signal(signal.SIGKILL)
        sock.close()
        os.unlink(path)
        os.rmdir(tmpdir)


def test_run_jobs_does_not_take_version_for_a_daemon_option():
    from supervisor.testing import daemon_args

    with pytest.raises(TypeError, match="unknown daemon option 'version'"):
        daemon_args({"version": True})


PROJECT_HANDLER = '''
import os


def resize(ctx):
    return {"pid": os.getpid(), "width": ctx.payload["width"] * 2}
'''


@pytest.mark.timeout(60)
def test_the_installed_script_finds_the_code_of_the_project_folder_it_runs_in(dev_server, tmp_path):
    """`cd myproject; spooled-supervisor --handler mypackage.jobs:resize`, as with `python -m supervisor`: the
    children and the import probe (no --queue: the queue would come from an SDK worker) find the package."""
    package = tmp_path / "mypackage"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "jobs.py").write_text(PROJECT_HANDLER)
    job = dev_server.enqueue("project-q", {"width": 21})
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"SPOOLED_API_KEY": dev_server.api_key}
    args = ["--handler", "mypackage.jobs:resize", "--procs", "1", "--api-url", dev_server.url, "--until-empty",
            "--poll-interval", "0.2", "--worker-id", "w-project", "--queue", "project-q"]
    done = subprocess.run([str(SCRIPT), *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=45)
    assert done.returncode == 0, done.stderr[-3000:]
    assert dev_server.job(job)["result"]["width"] == 42
    probed = subprocess.run([str(SCRIPT), *args[:-2]], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=45)  # no --queue: the probe imports the handler, finds no SDK worker
    assert probed.returncode == 2 and "--queue is required" in probed.stderr, probed.stderr[-3000:]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("queue", [["--queue", "nowhere-q"], []])
def test_a_handler_module_found_nowhere_exits_3_with_one_line_saying_where_and_what_to_do(dev_server, tmp_path,
                                                                                         queue):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"SPOOLED_API_KEY": dev_server.api_key}
    done = subprocess.run([str(SCRIPT), "--handler", "mypackage.jobs:resize", "--procs", "1", "--api-url",
                           dev_server.url, "--log-format", "text", *queue], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=45)
    assert done.returncode == 3, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if "No module named" in line]
    assert len(errors) == 1, done.stderr
    assert str(tmp_path) in errors[0] and "pip install -e ." in errors[0] and "PYTHONPATH" in errors[0]
    assert "Traceback" not in done.stderr and "importlib" not in done.stderr
