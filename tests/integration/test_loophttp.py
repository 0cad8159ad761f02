"""The parent's non-blocking HTTP client and the shared response parser, driven by a real selector loop."""

from __future__ import annotations

import os
import socket
import threading
import time

import pytest
from support.loop_client import make_client, run_until_done

from supervisor.client import loophttp
from supervisor.client import rest as api
from supervisor.client.httpconn import FramingError, ResponseReader


@pytest.mark.timeout(30)
def test_calls_on_a_kept_alive_connection(dev_server):
    job_id = dev_server.enqueue("q-loop", {"x": 1})
    spooled, client, sel, wake_r = make_client(dev_server.url, dev_server.api_key)
    client.submit("claim", spooled.claim_call("q-loop", "w-loop", 5, 30))
    [(tag, jobs, error)] = run_until_done(client, sel, wake_r)
    assert tag == "claim" and error is None and [j["id"] for j in jobs] == [job_id]
    client.submit("done", spooled.complete_call(job_id, "w-loop", jobs[0]["lease_id"], {"ok": True}))
    [(tag, answer, error)] = run_until_done(client, sel, wake_r)
    assert error is None and answer == {"success": True}
    assert len(client.conns) == 1  # the same connection served both
    client.submit("again", spooled.complete_call(job_id, "w-loop", jobs[0]["lease_id"], {"ok": True}))
    [(_, _, error)] = run_until_done(client, sel, wake_r)
    assert isinstance(error, api.AlreadyFinished) and error.status == 409
    assert dev_server.job(job_id)["result"] == {"ok": True}


@pytest.mark.timeout(30)
def test_a_host_name_is_resolved_off_the_loop(dev_server, monkeypatch):
    monkeypatch.setattr(loophttp, "_is_local", lambda host: False)  # take the resolver-thread path
    spooled, client, sel, wake_r = make_client(dev_server.url.replace("127.0.0.1", "localhost"), dev_server.api_key)
    assert client.addrs is None
    client.submit("claim", spooled.claim_call("q-empty", "w", 1, 30))
    [(_, jobs, error)] = run_until_done(client, sel, wake_r)
    assert error is None and jobs == [] and client.addrs


@pytest.mark.timeout(30)
def test_refused_and_silent_servers_end_in_unavailable():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    spooled, client, sel, wake_r = make_client(f"http://127.0.0.1:{port}", "sp_test_0123456789")
    client.submit("x", spooled.claim_call("q", "w", 1, 30))
    [(_, _, error)] = run_until_done(client, sel, wake_r)
    assert isinstance(error, api.Unavailable) and error.retryable

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen()
    accepted = []
    threading.Thread(target=lambda: accepted.append(silent.accept()), daemon=True).start()
    spooled, client, sel, wake_r = make_client(f"http://127.0.0.1:{silent.getsockname()[1]}", "sp_test_0123456789",
                                               timeout=0.5)
    started = time.monotonic()
    client.submit("x", spooled.claim_call("q", "w", 1, 30))
    [(_, _, error)] = run_until_done(client, sel, wake_r)
    assert isinstance(error, api.Unavailable) and error.code == "TIMEOUT"
    assert 0.4 < time.monotonic() - started < 15  # the 0.5 s deadline, not the OS's minutes
    assert client.conns == []
    silent.close()


def parse_response(data: bytes, eof: bool = False):
    """The answer framed from `data` (fed whole, then the end if `eof`), or None while incomplete."""
    reader = ResponseReader()
    response = reader.feed(data)
    return reader.feed_eof() if response is None and eof else response


def test_response_framings():
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
    whole = head + b"Content-Length: 2\r\n\r\n{}"
    assert parse_response(whole[:-1]) is None
    response = parse_response(whole)
    assert response.status == 200 and response.body == b"{}" and not response.close
    assert parse_response(whole + b"HTTP/1.1").close  # bytes after the answer end the connection
    chunked = head + b"Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n"
    assert parse_response(chunked).body == b"abcde"
    assert parse_response(chunked[:-3]) is None
    closing = head + b"\r\npartial body"
    assert parse_response(closing) is None
    response = parse_response(closing, eof=True)
    assert response.body == b"partial body" and response.close
    response = parse_response(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n")
    assert response.status == 204 and response.body == b""
    with pytest.raises(FramingError):
        parse_response(b"garbage\r\n\r\n")
    with pytest.raises(ConnectionResetError):
        parse_response(head + b"Content-Length: 10\r\n\r\nshort", eof=True)


def one_shot_server(answer: bytes | None):
    """A loopback server that answers each connection's first request with `answer` (None: just close)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()

    def serve():
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)
                if answer is not None:
                    conn.sendall(answer)

    threading.Thread(target=serve, daemon=True).start()
    return srv


@pytest.mark.timeout(30)
def test_a_2xx_answer_of_the_wrong_shape_is_an_error_not_a_lost_call():
    body = b'[{"id": "x"}]'
    srv = one_shot_server(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                          + str(len(body)).encode() + b"\r\n\r\n" + body)
    spooled, client, sel, wake_r = make_client(f"http://127.0.0.1:{srv.getsockname()[1]}", "sp_test_0123456789")
    client.submit("claim", spooled.claim_call("q", "w", 1, 30))
    [(tag, result, error)] = run_until_done(client, sel, wake_r)
    assert tag == "claim" and result is None
    assert isinstance(error, api.Unavailable) and error.code == "BAD_ANSWER"
    srv.close()


@pytest.mark.timeout(30)
def test_blocking_call_to_a_server_that_hangs_up_is_unavailable():
    srv = one_shot_server(None)
    spooled = api.SpooledAPI(f"http://127.0.0.1:{srv.getsockname()[1]}", api.Secret("sp_test_0123456789"), timeout=2)
    with pytest.raises(api.Unavailable):
        spooled.deregister("w", timeout=1)
    srv.close()


@pytest.mark.timeout(30)
def test_calls_waiting_for_a_connection_time_out_at_their_own_deadline_and_the_scan_waits_for_the_first():
    """In-process, no server: with no connection allowed, calls wait in the queue. The queue is scanned
    only once the first deadline comes; each call fails at its own, with TIMEOUT 'no free connection'."""
    spooled, client, _, _ = make_client("http://127.0.0.1:9", "k", timeout=5.0)
    client.max_connections = 0
    t0 = time.monotonic()
    client.submit("a", spooled.complete_call("ja", "w", "La", None))
    client.submit("b", spooled.complete_call("jb", "w", "Lb", None), first=True)  # ahead, but later
    deadline_a = client.queue[1][2]
    assert client.next_deadline() == deadline_a and deadline_a <= client.queue[0][2]
    client.expire(t0 + 4.9)
    assert client.done() == [] and len(client.queue) == 2
    client.expire(deadline_a)
    [(tag, result, error)] = client.done()
    assert tag == "a" and result is None and error.code == "TIMEOUT" and "no free connection" in str(error)
    assert [item[0] for item in client.queue] == ["b"] and client.next_deadline() == client.queue[0][2]
    client.expire(client.queue[0][2])
    assert [t for t, _, _ in client.done()] == ["b"] and not client.queue and client.next_deadline() is None


@pytest.mark.timeout(60)
def test_a_huge_answer_is_read_over_many_turns_and_none_holds_the_loop():
    """An answer of 8 MiB sent as fast as loopback goes: each turn reads at most READ_BUDGET of it, so a peer
    that floods (or never ends its body) cannot hold the loop; the answer still arrives whole."""
    size = 8 * 2**20
    body = b'{"jobs": [], "pad": "' + b"x" * size + b'"}'
    srv = one_shot_server(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                          + str(len(body)).encode() + b"\r\n\r\n" + body)
    spooled, client, sel, wake_r = make_client(f"http://127.0.0.1:{srv.getsockname()[1]}", "sp_test_0123456789")
    client.submit("stats", spooled.queue_stats_call("q"))
    turns, done = 0, []
    deadline = time.monotonic() + 30
    while not done and time.monotonic() < deadline:
        for key, mask in sel.select(0.05):
            if key.data[0] == "http":
                client.on_ready(key.data[1], mask, time.monotonic())
                turns += 1
            else:
                os.read(wake_r, 4096)
        done = client.done()
    assert done and done[0][0] == "stats"
    assert turns >= size // (loophttp.READ_BUDGET + 65536), turns  # read a budget at a time
    srv.close()
