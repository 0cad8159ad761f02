"""sd_notify against real AF_UNIX datagram sockets, both a path socket and an abstract one."""

from __future__ import annotations

import os
import socket
import tempfile
import uuid

import pytest

from supervisor.ops.notify import Notifier


@pytest.fixture(params=["path", "abstract"])
def listener(request):
    """(NOTIFY_SOCKET value, bound receiving socket) for a path or an abstract socket."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.settimeout(5)  # a deadline for recv, not a sleep
    tmpdir = None
    if request.param == "path":
        tmpdir = tempfile.mkdtemp(prefix="sdn-", dir="/tmp")  # short: AF_UNIX paths max 107 bytes
        value = address = os.path.join(tmpdir, "notify")
    else:
        name = f"spooled-test-{uuid.uuid4().hex}"
        value, address = "@" + name, "\0" + name
    sock.bind(address)
    yield value, sock
    sock.close()
    if tmpdir:
        os.unlink(value)
        os.rmdir(tmpdir)


def recv(sock: socket.socket) -> str:
    return sock.recv(4096).decode()


def test_ready_status_stopping_watchdog(listener):
    value, sock = listener
    n = Notifier.from_env({"NOTIFY_SOCKET": value, "WATCHDOG_USEC": "20000000"}, pid=os.getpid())
    assert n.enabled
    assert n.watchdog_interval == 10.0

    assert n.ready("2/2 children up")
    assert recv(sock) == "READY=1\nSTATUS=2/2 children up"
    assert n.status("busy 1/2")
    assert recv(sock) == "STATUS=busy 1/2"
    assert n.watchdog()
    assert recv(sock) == "WATCHDOG=1"
    assert n.stopping("draining 1 job")
    assert recv(sock) == "STOPPING=1\nSTATUS=draining 1 job"
    n.close()


def test_status_dedup_and_watchdog_rate_limit(listener):
    value, sock = listener
    n = Notifier.from_env({"NOTIFY_SOCKET": value, "WATCHDOG_USEC": "2000000"}, pid=123)
    n.status("a")
    n.status("a")  # unchanged: not re-sent
    n.status("b")
    assert recv(sock) == "STATUS=a"
    assert recv(sock) == "STATUS=b"

    assert n.watchdog_if_due(now=1000.0)
    assert recv(sock) == "WATCHDOG=1"
    assert not n.watchdog_if_due(now=1000.5)  # interval is 1 s
    assert n.watchdog_if_due(now=1001.0)
    assert recv(sock) == "WATCHDOG=1"
    sock.setblocking(False)
    with pytest.raises(BlockingIOError):
        sock.recv(4096)


def test_watchdog_pid_mismatch_disables_watchdog_only(listener):
    value, sock = listener
    env = {"NOTIFY_SOCKET": value, "WATCHDOG_USEC": "5000000", "WATCHDOG_PID": "1"}
    n = Notifier.from_env(env, pid=4242)
    assert n.enabled
    assert n.watchdog_interval is None
    assert not n.watchdog()
    assert not n.watchdog_if_due()
    n.ready()
    assert recv(sock) == "READY=1"

    same = Notifier.from_env({**env, "WATCHDOG_PID": "4242"}, pid=4242)
    assert same.watchdog_interval == 2.5


def test_disabled_without_socket_and_never_raises(tmp_path):
    off = Notifier.from_env({"WATCHDOG_USEC": "1000000"})
    assert not off.enabled
    assert off.watchdog_interval is None
    assert off.ready("x") is False and off.watchdog() is False

    assert not Notifier.from_env({"NOTIFY_SOCKET": "vsock:2:1234"}).enabled
    gone = Notifier.from_env({"NOTIFY_SOCKET": str(tmp_path / "nobody-listens")})
    assert gone.enabled
    assert gone.ready("x") is False  # ENOENT swallowed
    assert gone.stopping() is False


def test_unset_env_removes_notify_variables(monkeypatch):
    monkeypatch.setenv("NOTIFY_SOCKET", "/run/systemd/notify")
    monkeypatch.setenv("WATCHDOG_USEC", "1000")
    monkeypatch.setenv("WATCHDOG_PID", "1")
    monkeypatch.setenv("SPOOLED_QUEUE", "keep-me")
    n = Notifier.from_env()
    Notifier.unset_env()
    for key in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"):
        assert key not in os.environ
    assert os.environ["SPOOLED_QUEUE"] == "keep-me"
    assert n.enabled  # the parent keeps its own notifier


def test_child_process_does_not_inherit_notify_socket(listener, monkeypatch):
    """What the daemon does: read the variables into its notifier, unset them from its own environment,
    then start processes; a process started afterwards finds no NOTIFY_SOCKET, yet the parent still notifies."""
    import subprocess
    import sys

    value, sock = listener
    monkeypatch.setenv("NOTIFY_SOCKET", value)
    monkeypatch.setenv("WATCHDOG_USEC", "1000000")
    n = Notifier.from_env()
    Notifier.unset_env()  # the process's own environment, as the daemon calls it
    probe = "import os; print(os.environ.get('NOTIFY_SOCKET'), os.environ.get('WATCHDOG_USEC'))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=30)  # inherits
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "None None"
    assert n.ready("up")
    assert recv(sock) == "READY=1\nSTATUS=up"
