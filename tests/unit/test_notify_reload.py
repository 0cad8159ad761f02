"""The reload and stop-timeout messages to systemd, against a real AF_UNIX datagram socket."""

from __future__ import annotations

import os
import socket
import tempfile

import pytest

from supervisor.config import load_config
from supervisor.ops.notify import Notifier
from supervisor.parent import hooks as hooks_module


@pytest.fixture
def listener():
    """(NOTIFY_SOCKET value, bound receiving socket with a receive deadline)."""
    tmpdir = tempfile.mkdtemp(prefix="sdr-", dir="/tmp")  # short: AF_UNIX paths max 107 bytes
    path = os.path.join(tmpdir, "notify")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.settimeout(5)
    sock.bind(path)
    yield path, sock
    sock.close()
    os.unlink(path)
    os.rmdir(tmpdir)


def pending(sock: socket.socket) -> list[str]:
    """Every datagram waiting on `sock`, without blocking."""
    sock.setblocking(False)
    out = []
    try:
        while True:
            out.append(sock.recv(4096).decode())
    except BlockingIOError:
        return out
    finally:
        sock.settimeout(5)


@pytest.mark.timeout(20)
def test_reloading_carries_the_monotonic_time_and_ready_ends_it(listener):
    path, sock = listener
    n = Notifier.from_env({"NOTIFY_SOCKET": path})
    assert n.reloading(1234.5678)
    assert sock.recv(4096).decode() == "RELOADING=1\nMONOTONIC_USEC=1234567800"
    assert n.ready("busy=0/2")
    assert sock.recv(4096).decode() == "READY=1\nSTATUS=busy=0/2"
    n.close()


@pytest.mark.timeout(20)
def test_extend_timeout_in_microseconds_never_negative(listener):
    path, sock = listener
    n = Notifier.from_env({"NOTIFY_SOCKET": path})
    assert n.extend_timeout(42.25)
    assert n.extend_timeout(-3.0)
    assert pending(sock) == ["EXTEND_TIMEOUT_USEC=42250000", "EXTEND_TIMEOUT_USEC=0"]
    n.close()


@pytest.fixture
def daemon_hooks(listener, monkeypatch):
    monkeypatch.setenv("NOTIFY_SOCKET", listener[0])
    hooks = hooks_module.DaemonHooks(load_config(["--queue", "q", "--handler", "supervisor.demo_handlers:noop"],
                                                 {"SPOOLED_API_KEY": "sp_test_0123456789abcdef"}))
    assert "NOTIFY_SOCKET" not in os.environ  # children never inherit it
    yield hooks
    hooks.notifier.close()


@pytest.mark.timeout(20)
def test_extensions_are_sent_every_few_seconds(listener, daemon_hooks):
    """A drain: the same end each time (the time left shrinks), re-sent once per EXTEND_EVERY."""
    every = hooks_module.EXTEND_EVERY
    daemon_hooks.extend_timeout(100.0, 40.0)
    daemon_hooks.extend_timeout(100.0 + every / 2, 40.0 - every / 2)  # too soon: not sent
    daemon_hooks.extend_timeout(100.0 + every, 40.0 - every)
    assert pending(listener[1]) == ["EXTEND_TIMEOUT_USEC=40000000", f"EXTEND_TIMEOUT_USEC={int((40.0 - every) * 1e6)}"]


@pytest.mark.timeout(20)
def test_an_end_much_later_than_promised_is_sent_at_once(listener, daemon_hooks):
    """A reload's short window, then a drain that needs far longer: the drain's is not held back."""
    daemon_hooks.extend_timeout(100.0, 30.0)
    daemon_hooks.extend_timeout(101.0, 30.0)  # the end moved 1 s: waits for its turn
    daemon_hooks.extend_timeout(102.0, 45.0)  # the end moved 17 s: sent now
    assert pending(listener[1]) == ["EXTEND_TIMEOUT_USEC=30000000", "EXTEND_TIMEOUT_USEC=45000000"]
