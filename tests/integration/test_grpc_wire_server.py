"""The dev server's wire gRPC server's own thread, in process on loopback: what other threads hand it is run
at once however they race, and stopping closes the listener and writes what was answered."""

from __future__ import annotations

import socket
import threading
import time

import pytest

pytest.importorskip("hpack")
pytest.importorskip("grpc")

from supervisor.devserver.grpc_wire import WireGrpcServer  # noqa: E402
from supervisor.proto.h2 import PREFACE  # noqa: E402

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def server():
    s = WireGrpcServer({})
    port = s.listen("127.0.0.1", 0)
    s.start()
    yield s, port
    assert s.stop(0.5).wait(10)


def posted_within(s: WireGrpcServer) -> float:
    done = threading.Event()
    start = time.monotonic()
    s.post(done.set)
    assert done.wait(5)
    return time.monotonic() - start


def test_a_post_is_run_at_once_after_posts_raced_the_wake_up(server):
    """Many threads posting at once (so posts land while the I/O thread reads its wake-up bytes), then single
    posts: they run within a fraction of the 0.25 s sweep, not each waiting for it (a lost wake-up would)."""
    s, _ = server
    for _ in range(5):
        stop = time.monotonic() + 0.4

        def hammer(stop: float = stop) -> None:
            while time.monotonic() < stop:
                s.post(lambda: None)

        threads = [threading.Thread(target=hammer) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        waits = sorted(posted_within(s) for _ in range(5))
        # a lost wake-up makes every later post wait for the 0.25 s sweep; a busy machine, the odd one
        assert waits[2] < 0.1, waits


def test_a_posted_function_that_fails_does_not_stop_the_server(server, capfd):
    s, port = server

    def boom() -> None:
        raise RuntimeError("a bug in a posted function")

    s.post(boom)
    assert posted_within(s) < 1.0  # the thread still runs
    with socket.create_connection(("127.0.0.1", port), timeout=5) as c:  # and still serves
        c.sendall(PREFACE)
        assert c.recv(9)  # its SETTINGS
    assert "a bug in a posted function" in capfd.readouterr().err


def test_stop_closes_the_listener():
    s = WireGrpcServer({})
    port = s.listen("127.0.0.1", 0)
    s.start()
    with socket.create_connection(("127.0.0.1", port), timeout=5) as c:
        c.sendall(PREFACE)
        assert c.recv(9)
        assert s.stop(0.5).wait(10)
        c.settimeout(5)
        rest = c.recv(65536)  # the GOAWAY, then the end of the stream
        while rest:
            more = c.recv(65536)
            if not more:
                break
            rest += more
        assert b"\x00\x00\x08\x07\x00\x00\x00\x00\x00" in rest  # a GOAWAY frame (8 bytes, stream 0) was written
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()


def test_out_of_descriptors_pauses_accepting_instead_of_spinning(server, capfd):
    """accept() failing (EMFILE) leaves the listener unwatched until the next sweep: the thread does not spin
    on a listener that stays readable, and the waiting connection is taken once accept works again."""
    s, port = server
    real = s.listener
    calls = []

    class Exhausted:
        def __init__(self, sock):
            self.sock = sock

        def fileno(self):
            return self.sock.fileno()

        def accept(self):
            calls.append(time.monotonic())
            if len(calls) <= 3:
                raise OSError(24, "Too many open files")
            return self.sock.accept()

        def close(self):
            self.sock.close()

    swapped = threading.Event()

    def swap() -> None:
        s.listener = Exhausted(real)
        swapped.set()

    s.post(swap)
    assert swapped.wait(5)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as c:
        c.settimeout(5)
        c.sendall(PREFACE)
        assert c.recv(9)  # accepted, after the failures
    assert 3 < len(calls) < 12, len(calls)  # one failed accept per sweep, not thousands in a tight loop
    assert calls[3] - calls[0] >= 0.4  # the three failures were a sweep apart
    assert "gRPC accept failed" in capfd.readouterr().err
