"""The gRPC wire client (the parent's own HTTP/2 connection) against scripted servers on loopback that break
HTTP/2 and gRPC in every way a hostile or broken server (or a proxy in front of one) can: GOAWAY, resets,
flow-control windows, huge and malformed frames, header blocks split over CONTINUATION, stalls and hang-ups
mid-frame, trailers-only errors, odd grpc-status and grpc-message values, floods. Each call ends with a typed
error worth acting on (or its answer), within its deadline, on a loop never held long; the next call gets a
working connection; the key never shows in an error."""

from __future__ import annotations

import struct
import threading
import time
from urllib.parse import quote

import pytest
from support.grpc_support import GrpcDriver

from supervisor.client import rest as api

hpack = pytest.importorskip("hpack")

from support.h2_peer import Conn, H2Peer  # noqa: E402

from supervisor.client.h2grpc import (  # noqa: E402
    CONTINUATION,
    DATA,
    END_HEADERS,
    END_STREAM,
    HEADERS,
    PING,
    frame,
    grpc_message,
)
from supervisor.proto import spooled_pb2 as pb  # noqa: E402

pytestmark = pytest.mark.timeout(60)
KEY = "sp_test_hostile-key-9f3"
Q = "hq"


def job_answer(job_id: str = "j1") -> bytes:
    return pb.DequeueResponse(jobs=[pb.Job(id=job_id, queue_name=Q, lease_id="l-" + job_id)]).SerializeToString()


@pytest.fixture
def peer_of():
    made: list[H2Peer] = []
    drivers: list[GrpcDriver] = []

    def make(answer, settings: bytes = b"", timeout: float = 2.0) -> tuple[H2Peer, GrpcDriver]:
        peer = H2Peer(answer, settings)
        made.append(peer)
        driver = GrpcDriver(peer.address, KEY, timeout=timeout)
        drivers.append(driver)
        return peer, driver

    yield make
    for d in drivers:
        d.close()
    for p in made:
        p.close()
        assert not p.errors, p.errors


def claim(d: GrpcDriver, tag="claim", timeout: float = 10.0):
    return d.call(tag, d.api.claim_call(Q, "w1", 1, 30), timeout=timeout)


def assert_fine(d: GrpcDriver, err) -> None:
    """The key in no error, and no turn of the loop held it long."""
    assert KEY not in str(err) and KEY not in repr(err)
    assert d.longest_turn < 0.5, f"a turn held the loop {d.longest_turn:.2f} s"


def first_ok_then(behaviour):
    """A script: the first request on each connection gets `behaviour`, every later request a proper answer."""

    def answer(conn: Conn, sid: int, fields: dict, body: bytes) -> None:
        if len(conn.requests) == 1 and conn.index == 0:
            behaviour(conn, sid)
        else:
            conn.send(conn.ok(sid, job_answer()))

    return answer


def test_a_well_behaved_answer_and_what_the_client_sent(peer_of):
    peer, d = peer_of(first_ok_then(lambda conn, sid: conn.send(conn.ok(sid, job_answer("j0")))))
    jobs = d.ok("c", d.api.claim_call(Q, "w1", 3, 30))
    assert [j["id"] for j in jobs] == ["j0"]
    (_, sid, fields, body), = peer.requests()
    assert fields[":path"] == "/spooled.v1.QueueService/Dequeue" and fields["te"] == "trailers"
    assert fields["x-api-key"] == KEY and fields["content-type"] == "application/grpc"
    got = pb.DequeueRequest.FromString(body)
    assert (got.queue_name, got.worker_id, got.batch_size, got.lease_duration_secs) == (Q, "w1", 3, 30)


def test_goaway_calls_it_did_not_take_are_sent_again_on_a_new_connection(peer_of):
    held: list[int] = []

    def answer(conn: Conn, sid: int, fields: dict, body: bytes) -> None:
        if conn.index > 0:
            return conn.send(conn.ok(sid, job_answer("fresh")))
        held.append(sid)
        if len(held) == 2:  # both calls are out: take the first, refuse the second
            conn.send(conn.goaway(held[0]) + conn.ok(held[0], job_answer("taken")))

    peer, d = peer_of(answer)
    d.client.submit("a", d.api.claim_call(Q, "w1", 1, 30))
    d.client.submit("b", d.api.claim_call(Q, "w1", 1, 30))
    d.run_until(lambda: {"a", "b"} <= set(d.answers), what="both answers")
    (jobs, err_a), (jobs_b, err_b) = d.answers.pop("a"), d.answers.pop("b")
    assert err_a is None and [j["id"] for j in jobs] == ["taken"]
    assert err_b is None and [j["id"] for j in jobs_b] == ["fresh"]  # never processed: sent again, once
    assert [(c, pb.DequeueRequest.FromString(b).queue_name) for c, _, _, b in peer.requests()] == \
        [(0, Q), (0, Q), (1, Q)]
    jobs, err = claim(d)
    assert err is None and [j["id"] for j in jobs] == ["fresh"] and len(peer.conns) == 2


def test_after_goaway_a_call_still_out_finishes_on_the_old_connection_while_new_ones_use_a_new_one(peer_of):
    release = threading.Event()

    def answer(conn: Conn, sid: int, fields: dict, body: bytes) -> None:
        if conn.index == 0:
            conn.send(conn.goaway(2 ** 31 - 1))  # a graceful shutdown: every call it has is still served
            release.wait(10)
            conn.send(conn.ok(sid, job_answer("old")))
        else:
            conn.send(conn.ok(sid, job_answer("new")))
            release.set()

    peer, d = peer_of(answer, timeout=5.0)
    d.client.submit("old", d.api.claim_call(Q, "w1", 1, 30))
    d.run_until(lambda: d.client.wire is not None and d.client.wire.spent(), what="the GOAWAY read")
    d.client.submit("new", d.api.claim_call(Q, "w1", 1, 30))
    d.run_until(lambda: {"old", "new"} <= set(d.answers), what="both answers")
    assert [j["id"] for j in d.answers["new"][0]] == ["new"] and [j["id"] for j in d.answers["old"][0]] == ["old"]
    assert d.answers["old"][1] is None and len(peer.conns) == 2
    d.run_until(lambda: not d.client.wire_retiring, what="the old connection closed once its call ended")


def test_after_goaway_settlements_still_out_are_read_on_the_old_connection_at_once(peer_of):
    """A lazy connection (only completes out) that is told GOAWAY and retired must still be read: its
    answers come at once, not after the calls' deadline."""
    release = threading.Event()

    def answer(conn: Conn, sid: int, fields: dict, body: bytes) -> None:
        if conn.index == 0:
            conn.send(conn.goaway(2 ** 31 - 1))
            release.wait(10)
            conn.send(conn.ok(sid, b""))
        else:
            conn.send(conn.ok(sid, b""))
            release.set()

    peer, d = peer_of(answer, timeout=5.0)
    a = d.api
    d.client.submit("old", a.complete_call("j-old", "w1", "l-old", {"ok": True}))
    d.run_until(lambda: d.client.wire is not None and d.client.wire.spent(), what="the GOAWAY read")
    started = time.monotonic()
    d.client.submit("new", a.complete_call("j-new", "w1", "l-new", {"ok": True}))
    d.run_until(lambda: {"old", "new"} <= set(d.answers), what="both answers")
    assert d.answers["old"] == (None, None) and d.answers["new"] == (None, None) and len(peer.conns) == 2
    assert time.monotonic() - started < 2, "the retired connection's answer waited for its deadline"
    d.run_until(lambda: not d.client.wire_retiring, what="the old connection closed once its call ended")


@pytest.mark.parametrize("code, kind", [(0x8, api.Unavailable), (0x2, api.Unavailable), (0xB, api.RateLimited)])
def test_a_reset_call_is_a_typed_error_and_the_connection_goes_on(peer_of, code, kind):
    peer, d = peer_of(first_ok_then(lambda conn, sid: conn.send(conn.reset(sid, code))))
    _, err = claim(d)
    assert isinstance(err, kind), err
    jobs, err2 = claim(d, "again")
    assert err2 is None and jobs and len(peer.conns) == 1  # a reset ends the call, not the connection
    assert_fine(d, err)


def test_a_refused_stream_is_sent_again_and_a_server_that_always_refuses_is_an_error(peer_of):
    peer, d = peer_of(first_ok_then(lambda conn, sid: conn.send(conn.reset(sid, 0x7))))
    jobs, err = claim(d)
    assert err is None and jobs and len(peer.requests()) == 2  # refused (never processed), sent again: answered
    peer.answer = lambda conn, sid, f, b: conn.send(conn.reset(sid, 0x7))
    _, err = claim(d, "always")
    assert isinstance(err, api.Unavailable) and "HTTP/2 error 7" in str(err)
    assert len(peer.requests()) == 2 + 4  # the first try and three more, then the error is the answer
    assert_fine(d, err)


def test_a_settlement_reset_mid_call_may_have_been_applied_so_a_later_not_found_is_success(peer_of):
    def answer(conn: Conn, sid: int, fields: dict, body: bytes) -> None:
        if len(conn.requests) == 1:
            conn.send(conn.reset(sid, 0x2))  # INTERNAL_ERROR: no word of whether it was applied
        else:
            conn.send(conn.status(sid, 5, "Job not found or not authorized"))

    peer, d = peer_of(answer)
    _, err = d.call("c1", d.api.complete_call("j1", "w1", "l1", {"r": 1}))
    assert isinstance(err, api.Unavailable) and err.retryable
    result, err = d.call("c2", d.api.complete_call("j1", "w1", "l1", {"r": 1}))
    assert err is None and result is None  # the first copy was applied: the job is not lost, nor run twice
    got = [pb.CompleteRequest.FromString(b) for _, _, _, b in peer.requests()]
    assert [(r.job_id, r.lease_id) for r in got] == [("j1", "l1"), ("j1", "l1")]


def test_a_tiny_window_is_honoured_and_the_whole_request_arrives(peer_of):
    completes: list[bytes] = []

    def answer(conn: Conn, sid: int, fields: dict, body: bytes) -> None:
        if fields[":path"].endswith("/Complete"):
            completes.append(body)
        conn.send(conn.ok(sid, b"" if completes else job_answer()))

    # 10-byte stream windows: the client waits for WINDOW_UPDATEs, which a thread hands out 50 bytes at a time
    peer, d = peer_of(answer, settings=struct.pack(">HI", 4, 10))
    jobs, err = claim(d)  # (its body may go out before the server's SETTINGS are read: HTTP/2 allows that)
    assert err is None and jobs
    d.client.submit("c", d.api.complete_call("j1", "w1", "l1", {"blob": "x" * 3000}))

    def grant() -> None:
        for _ in range(400):
            if completes:
                return
            time.sleep(0.005)
            conn = peer.conns[0]
            for sid in {s for k, _, s, _ in list(conn.frames) if k == HEADERS}:
                conn.send(frame(8, 0, sid, struct.pack(">I", 50)))

    threading.Thread(target=grant, daemon=True).start()
    d.run_until(lambda: "c" in d.answers, what="the answer")
    assert d.answers.pop("c") == (None, None)
    req = pb.CompleteRequest.FromString(completes[0])
    assert req.job_id == "j1" and len(req.result.fields["blob"].string_value) == 3000
    sids = [s for k, _, s, p in peer.conns[0].frames if k == HEADERS]
    data = [p for k, _, s, p in peer.conns[0].frames if k == DATA and s == sids[-1]]
    assert max(len(p) for p in data) <= 50 and len(data) > 20  # never past the window it was given


def test_a_window_never_opened_times_out_and_the_next_call_gets_a_fresh_connection(peer_of):
    def answer(conn: Conn, sid: int, fields: dict, body: bytes) -> None:
        conn.send(conn.ok(sid, job_answer()))

    peer, d = peer_of(answer, settings=struct.pack(">HI", 4, 0), timeout=1.0)
    jobs, err = claim(d)  # sent before the server's SETTINGS were read
    assert err is None and jobs
    started = time.monotonic()
    _, err = claim(d, "stuck")  # now its body waits for a window that never opens
    assert isinstance(err, api.Unavailable) and "within 1 s" in str(err) and time.monotonic() - started < 3
    peer.settings = b""  # the next connection gets the default window
    jobs, err2 = claim(d, "again")
    assert err2 is None and jobs and len(peer.conns) == 2
    assert_fine(d, err)


@pytest.mark.parametrize("data, words", [
    (struct.pack(">I", 1 << 20)[1:] + bytes((0, 0)) + struct.pack(">I", 1), "frame of 1048576 bytes"),  # huge frame
    (frame(HEADERS, END_HEADERS, 1, b"\xff\xff\xff\xff\xff"), "does not decode"),  # not HPACK
    (frame(5, END_HEADERS, 1, b"\0\0\0\2"), "pushed stream"),  # PUSH_PROMISE, refused by our settings
    (frame(4, 0, 0, struct.pack(">HI", 5, 100)), "MAX_FRAME_SIZE"),  # a frame size below the minimum
    (frame(4, 0, 0, struct.pack(">HI", 4, 1 << 31)), "INITIAL_WINDOW_SIZE"),
    (frame(8, 0, 0, struct.pack(">I", (1 << 31) - 1)), "largest window"),  # the connection window overflows
    (frame(PING, 0, 0, b"abc"), "PING"),
    (b"HTTP/1.1 400 Bad Request\r\n\r\n", "frame of"),  # not HTTP/2 at all
])
def test_a_broken_frame_ends_the_connection_with_a_clear_error_and_the_next_call_reconnects(peer_of, data, words):
    peer, d = peer_of(first_ok_then(lambda conn, sid: conn.send(data)))
    started = time.monotonic()
    _, err = claim(d)
    assert isinstance(err, api.Unavailable) and words in str(err), err
    assert time.monotonic() - started < 1.5  # at once, not at the deadline
    jobs, err2 = claim(d, "again")
    assert err2 is None and jobs and len(peer.conns) == 2
    assert_fine(d, err)


def test_header_blocks_split_over_continuation_frames_decode(peer_of):
    def answer(conn: Conn, sid: int, fields: dict, body: bytes) -> None:
        head = conn.block([(":status", "200"), ("content-type", "application/grpc"), ("x-pad", "p" * 3000)])
        trailers = conn.block([("grpc-status", "0"), ("x-more", "q" * 200)])
        out = frame(HEADERS, 0, sid, head[:7]) + frame(CONTINUATION, 0, sid, head[7:1000])
        out += frame(CONTINUATION, END_HEADERS, sid, head[1000:])
        msg = grpc_message(job_answer("split"))
        out += frame(DATA, 0, sid, msg[:3]) + frame(DATA, 0, sid, msg[3:])  # the message split over two frames
        out += frame(HEADERS, END_STREAM, sid, trailers[:3]) + frame(CONTINUATION, END_HEADERS, sid, trailers[3:])
        conn.send(out[:50])
        time.sleep(0.05)  # and the bytes in two reads
        conn.send(out[50:])

    peer, d = peer_of(answer)
    jobs, err = claim(d)
    assert err is None and [j["id"] for j in jobs] == ["split"]


def test_a_header_block_interrupted_or_continued_on_another_stream_is_a_protocol_error(peer_of):
    def answer(conn: Conn, sid: int, fields: dict, body: bytes) -> None:
        if conn.index < 2:  # (encoded only when sent: the encoder's table must match what the client read)
            block = conn.block([(":status", "200"), ("grpc-status", "0")])
        if conn.index == 0:
            conn.send(frame(HEADERS, END_STREAM, sid, block[:2])
                      + frame(CONTINUATION, END_HEADERS, sid + 2, block[2:]))
        elif conn.index == 1:
            conn.send(frame(HEADERS, END_STREAM, sid, block[:2]) + frame(DATA, 0, sid, b""))
        else:
            conn.send(conn.ok(sid, job_answer()))

    peer, d = peer_of(answer)
    _, err = claim(d)
    assert isinstance(err, api.Unavailable) and "CONTINUATION without its HEADERS" in str(err)
    _, err = claim(d, "second")
    assert isinstance(err, api.Unavailable) and "interrupted" in str(err)
    jobs, err = claim(d, "third")
    assert err is None and jobs


# behaviours of a server's answer, for first_ok_then
def stall(conn: Conn, sid: int) -> None:
    conn.send(conn.ok(sid, job_answer())[:20])  # the headers frame cut short, then nothing more


def hang_up(conn: Conn, sid: int) -> None:
    conn.send(conn.ok(sid, job_answer())[:30])
    conn.close()


def flood(conn: Conn, sid: int) -> None:
    conn.quiet = True
    conn.send(frame(PING, 0, 0, b"12345678") * 12_000)


def pour(conn: Conn, sid: int) -> None:  # 5 MiB of one message's DATA, past the 4 MiB limit
    conn.send(conn.headers(sid, [(":status", "200"), ("content-type", "application/grpc")]))
    conn.send(frame(DATA, 0, sid, b"\0" * 16000) * 330)


def test_a_server_that_stalls_mid_frame_times_out_and_the_connection_is_replaced(peer_of):
    peer, d = peer_of(first_ok_then(stall), timeout=1.0)
    started = time.monotonic()
    _, err = claim(d)
    assert isinstance(err, api.Unavailable) and "within 1 s" in str(err) and time.monotonic() - started < 3
    jobs, err2 = claim(d, "again")
    assert err2 is None and jobs and len(peer.conns) == 2  # the stalled connection was given up
    assert_fine(d, err)


def test_a_server_that_trickles_pings_but_answers_nothing_does_not_keep_its_connection(peer_of):
    stop = threading.Event()

    def trickle(conn: Conn, sid: int) -> None:
        def ping() -> None:
            while not stop.is_set() and not conn.closed:
                conn.send(frame(PING, 0, 0, b"12345678"))
                time.sleep(0.1)

        threading.Thread(target=ping, daemon=True).start()

    peer, d = peer_of(first_ok_then(trickle), timeout=1.0)
    try:
        _, err = claim(d)
        assert isinstance(err, api.Unavailable) and "within 1 s" in str(err)
        jobs, err2 = claim(d, "again")
        assert err2 is None and jobs and len(peer.conns) == 2
    finally:
        stop.set()


def test_a_server_that_hangs_up_mid_frame_fails_the_call_at_once(peer_of):
    peer, d = peer_of(first_ok_then(hang_up), timeout=5.0)
    started = time.monotonic()
    _, err = claim(d)
    assert isinstance(err, api.Unavailable) and "closed the connection mid-answer" in str(err), err
    assert time.monotonic() - started < 2  # the hang-up is seen, not waited out
    jobs, err2 = claim(d, "again")
    assert err2 is None and jobs
    assert_fine(d, err)


@pytest.mark.parametrize("code, message, kind, words", [
    (9, "Lease%20expired", api.LeaseLost, "Lease expired"),  # FAILED_PRECONDITION on a job route
    (5, "Job not found or not authorized", api.LeaseLost, "Job not found"),
    (16, "API%20key%20has%20expired", api.Unauthorized, "API key has expired"),
    (8, "Rate limit exceeded", api.RateLimited, "Rate limit"),
    (3, "caf%C3%A9 %E2%9C%93 100%25", api.Rejected, "café ✓ 100%"),  # percent-encoded UTF-8
    (13, "%FF%FE broken utf-8", api.Unavailable, "broken utf-8"),
    (14, "", api.Unavailable, "gRPC call failed"),
])
def test_trailers_only_errors_are_decoded_into_typed_errors(peer_of, code, message, kind, words):
    peer, d = peer_of(lambda conn, sid, f, b: conn.send(conn.status(sid, code, message)))
    _, err = d.call("c", d.api.complete_call("j1", "w1", "l1", None))
    assert isinstance(err, kind) and words in err.message, err


@pytest.mark.parametrize("fields, words", [
    ([(":status", "200"), ("grpc-status", "abc")], "UNKNOWN"),
    ([(":status", "200"), ("grpc-status", "9" * 5000)], "UNKNOWN"),
    ([(":status", "200")], "without a gRPC status"),
    ([(":status", "503"), ("content-type", "text/html")], "HTTP status 503"),
    ([(":status", "401")], "HTTP status 401"),
])
def test_odd_statuses_are_retryable_errors_never_a_crash(peer_of, fields, words):
    peer, d = peer_of(lambda conn, sid, f, b: conn.send(conn.headers(sid, fields, end=True)))
    _, err = claim(d)
    assert isinstance(err, api.Unavailable) and err.retryable and words in str(err), err
    jobs, err = claim(d, "again")  # the connection is fine
    assert isinstance(err, api.Unavailable) and len(peer.conns) == 1


def test_a_message_naming_the_key_is_scrubbed_and_a_long_one_cut(peer_of):
    echoed = f"invalid key {KEY} " + "x" * 20_000  # (a header block over a frame: sent with CONTINUATION)

    peer, d = peer_of(lambda conn, sid, f, b: conn.send(conn.status(sid, 16, quote(echoed))))
    _, err = claim(d)
    assert isinstance(err, api.Unauthorized)
    assert KEY not in str(err) and "***" in err.message and len(err.message) <= 500


def test_an_answer_that_is_not_its_message_type_is_an_error(peer_of):
    peer, d = peer_of(lambda conn, sid, f, b: conn.send(conn.ok(sid, b"\xff\xff\xff\xff")))
    _, err = claim(d)
    assert isinstance(err, api.Unavailable) and "not a DequeueResponse" in str(err)


def test_an_answer_that_parses_but_cannot_be_read_is_the_calls_error_and_claiming_goes_on(peer_of):
    """A job timestamped past any calendar (time.gmtime refuses it) made reading the claim's answer raise
    in the loop, and the claim was never answered: the daemon stopped claiming. It is the claim's error."""
    def answer(conn: Conn, sid: int, fields: dict, body: bytes) -> None:
        if len(conn.requests) == 1:
            bad = pb.Job(id="j-bad", queue_name=Q, lease_id="l")
            bad.created_at.seconds = 2 ** 62
            conn.send(conn.ok(sid, pb.DequeueResponse(jobs=[bad]).SerializeToString()))
        else:
            conn.send(conn.ok(sid, job_answer()))

    peer, d = peer_of(answer)
    _, err = claim(d)
    assert isinstance(err, api.Unavailable) and err.code == "BAD_ANSWER" and "could not be read" in str(err), err
    jobs, err2 = claim(d, "again")
    assert err2 is None and [j["id"] for j in jobs] == ["j1"]
    assert_fine(d, err)


def test_a_flood_of_pings_ends_the_connection_without_holding_the_loop(peer_of):
    peer, d = peer_of(first_ok_then(flood), timeout=5.0)
    started = time.monotonic()
    _, err = claim(d)
    assert isinstance(err, api.Unavailable) and "flood" in str(err), err
    assert time.monotonic() - started < 3
    jobs, err2 = claim(d, "again")
    assert err2 is None and jobs
    assert_fine(d, err)


def test_a_server_that_never_stops_sending_does_not_hold_the_loop(peer_of):
    stop = threading.Event()

    def firehose(conn: Conn, sid: int) -> None:
        conn.send(conn.headers(sid, [(":status", "200"), ("content-type", "application/grpc")]))

        def pour() -> None:  # endless DATA on the call: its message grows past the 4 MiB limit
            chunk = frame(DATA, 0, sid, b"\0" * 16000)
            while not stop.is_set() and not conn.closed:
                conn.send(chunk * 16)

        threading.Thread(target=pour, daemon=True).start()

    peer, d = peer_of(first_ok_then(firehose), timeout=5.0)
    try:
        _, err = claim(d)
        assert isinstance(err, api.Unavailable) and "over 4194304 bytes" in str(err), err
        assert d.longest_turn < 0.5, d.longest_turn
    finally:
        stop.set()


def test_stream_ids_used_up_move_new_calls_to_a_new_connection(peer_of):
    peer, d = peer_of(lambda conn, sid, f, b: conn.send(conn.ok(sid, job_answer(f"c{conn.index}"))))
    jobs, err = claim(d)
    assert err is None and [j["id"] for j in jobs] == ["c0"]
    d.client.wire.session.next_id = 2 ** 31 + 1  # as after a billion calls
    jobs, err = claim(d, "again")
    assert err is None and [j["id"] for j in jobs] == ["c1"] and len(peer.conns) == 2


def test_end_stream_on_data_without_trailers_is_an_error(peer_of):
    def answer(conn: Conn, sid: int, fields: dict, body: bytes) -> None:
        conn.send(conn.headers(sid, [(":status", "200")]) + frame(DATA, END_STREAM, sid, grpc_message(job_answer())))

    peer, d = peer_of(answer)
    _, err = claim(d)
    assert isinstance(err, api.Unavailable) and "without a gRPC status" in str(err)


@pytest.mark.parametrize("behaviour, words", [(stall, "within 1 s"), (hang_up, "closed the connection mid-answer"),
                                              (flood, "flood"), (pour, "over 4194304 bytes")])
def test_a_settlement_whose_answer_is_read_at_the_loops_pace_meets_a_hostile_server_as_a_claim_does(
        peer_of, behaviour, words):
    """With only a complete out, the connection does not wake the loop and is read each turn instead: a stall,
    a hang-up, a flood and an endless answer still end the call with its error, in about the same time, on
    a loop never held; the next call gets a working connection."""
    peer, d = peer_of(first_ok_then(behaviour), timeout=1.0)
    started = time.monotonic()
    _, err = d.call("settle", d.api.complete_call("j1", "w1", "l-j1", {"ok": True}), timeout=10)
    assert isinstance(err, api.Unavailable) and words in str(err), err
    assert time.monotonic() - started < 4
    assert d.client.wire is None or not d.client.wire.lazy  # nothing out: the connection wakes the loop again
    jobs, err2 = claim(d, "again")
    assert err2 is None and jobs
    assert_fine(d, err)
