"""The parent-child frame protocol: frames of several MiB cross a socketpair both ways without deadlock."""

from __future__ import annotations

import socket
import threading

import pytest

from supervisor.child import wire


@pytest.mark.timeout(20)
def test_frames_of_several_mib_cross_a_socketpair_without_deadlock():
    parent, child = socket.socketpair()
    chan = wire.Channel(parent)
    big = {"t": "job", "job": {"id": "j", "payload": "x" * (6 * 2**20)}}
    received = []
    reader = threading.Thread(target=lambda: received.append(wire.read_frame(child)))
    reader.start()
    chan.send(big)
    while chan.wants_write:  # non-blocking: the parent writes in pieces as the reader drains
        chan.flush()
    reader.join(10)
    assert received == [big]
    wire.write_frame(child, {"t": "done", "id": "j", "ok": True, "result": 1})
    wire.write_frame(child, {"t": "ready", "pid": 1})
    messages = []
    while len(messages) < 2:
        messages += chan.receive()
    assert [m["t"] for m in messages] == ["done", "ready"]
    child.close()
    with pytest.raises(EOFError):
        while True:
            chan.receive()


def test_a_budget_bounds_what_one_receive_reads_and_the_rest_comes_next_time():
    """A child that sends a flood of frames holds the parent's loop for one budget a turn, and loses nothing."""
    Channel, encode = wire.Channel, wire.encode
    a, b = socket.socketpair()
    a.setblocking(False)
    b.setblocking(False)
    frame = encode({"t": "log", "x": "y" * 1000})
    sent = 0
    try:
        while True:
            sent += b.send(frame)
    except BlockingIOError:
        pass
    whole = sent // len(frame)
    chan = Channel(a)
    first = chan.receive(budget=64 * 1024)
    assert 0 < len(first) <= 64 * 1024 // len(frame) + 1
    rest = []
    while len(first) + len(rest) < whole:
        got = chan.receive(budget=64 * 1024)
        assert got or len(first) + len(rest) == whole
        rest += got
    assert len(first) + len(rest) == whole and all(m == {"t": "log", "x": "y" * 1000} for m in first + rest)
    a.close()
    b.close()
