"""The dev server's own gRPC server (supervisor.devserver.grpc_wire over h2server), the real process, attacked over
raw sockets on loopback as a hostile or broken client would: bytes that are not HTTP/2, a preface that never
comes, header blocks that do not decode, calls opened and never finished, answers never read, floods of PINGs
and of resets, a message over 4 MiB, unknown methods and bodies that do not parse.

Each attack costs the attacker its call or its connection; after each, the official SDK's client and the REST
API are served as before, and while a connection floods, another's calls are answered within a few seconds."""

from __future__ import annotations

import socket
import struct
import threading
import time

import pytest
from support.grpc_support import start_server

pytest.importorskip("grpc")
hpack = pytest.importorskip("hpack")

from spooled.grpc import SpooledGrpcClient  # noqa: E402

from supervisor.devserver.grpc_wire import MAX_UNSENT, PREFACE_TIMEOUT  # noqa: E402
from supervisor.devserver.h2server import FLOOD, MAX_MESSAGE, MAX_STREAMS  # noqa: E402
from supervisor.proto import spooled_pb2 as pb  # noqa: E402
from supervisor.proto.h2 import (  # noqa: E402
    ACK,
    CONTINUATION,
    DATA,
    END_HEADERS,
    END_STREAM,
    GOAWAY,
    HEADERS,
    PING,
    PREFACE,
    PROTOCOL_ERROR,
    REFUSED_STREAM,
    RST_STREAM,
    S_INITIAL_WINDOW,
    SETTINGS,
    WINDOW_UPDATE,
    frame,
    grpc_message,
)

pytestmark = pytest.mark.timeout(30)
Q = "hostile-q"
STATS = "/spooled.v1.QueueService/GetQueueStats"
GET_JOB = "/spooled.v1.QueueService/GetJob"
STREAM_JOBS = "/spooled.v1.QueueService/StreamJobs"
PROCESS_JOBS = "/spooled.v1.QueueService/ProcessJobs"
WIDE = (1 << 31) - 1


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = start_server(tmp_path_factory.mktemp("grpc-hostile"))
    yield s
    s.stop()
    noise = [line for line in s.out.lines if "Traceback" in line or "warning" in line or "error:" in line]
    assert not noise, noise  # whatever the clients did: no internal error, no stack trace


def serves(server, what: str = "") -> float:
    """The server still answers: the official SDK's gRPC client (enqueue, read back, a worker registered) and
    REST's /health. Returns how long it took."""
    began = time.monotonic()
    client = SpooledGrpcClient(address=server.grpc_address, api_key=server.api_key, timeout=10)
    try:
        made = client.queue.enqueue(Q, {"after": what or "an attack"})
        assert made.created
        job = client.queue.get_job(made.job_id).job
        assert job.id == made.job_id and job.payload == {"after": what or "an attack"}
        assert client.workers.register(Q, "hostile-host", worker_id="after-attack").worker_id == "after-attack"
    finally:
        client.close()
    health = server.request("GET", "/health")
    assert health.status_code == 200, health.text
    return time.monotonic() - began


def parse_frames(buf: bytearray) -> list[tuple[int, int, int, bytes]]:
    """Whole frames off the front of `buf` (what is left is half a frame)."""
    out = []
    while len(buf) >= 9:
        length = int.from_bytes(buf[:3], "big")
        if len(buf) < 9 + length:
            break
        out.append((buf[3], buf[4], int.from_bytes(buf[5:9], "big") & 0x7FFFFFFF, bytes(buf[9:9 + length])))
        del buf[:9 + length]
    return out


class Raw:
    """A hand-driven client connection: whatever bytes the test writes; frames the server sends, decoded."""

    def __init__(self, server, settings: bytes = b"", hello: bool = True, rcvbuf: int | None = None):
        host, port = server.grpc_address.rsplit(":", 1)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.connect((host, int(port)))
        self.key = server.api_key
        self.encoder, self.decoder = hpack.Encoder(), hpack.Decoder()
        self.buf = bytearray()
        self.frames: list[tuple[int, int, int, bytes]] = []
        self.received = 0
        self.eof = False
        if hello:
            self.send(PREFACE + frame(SETTINGS, 0, 0, settings))

    def close(self) -> None:
        self.sock.close()

    def send(self, data: bytes, timeout: float = 10.0) -> None:
        self.sock.settimeout(timeout)
        self.sock.sendall(data)

    def headers(self, sid: int, path: str = STATS, end: bool = False, extra: tuple = ()) -> bytes:
        block = self.encoder.encode([(":method", "POST"), (":scheme", "http"), (":path", path),
                                     (":authority", "localhost"), ("content-type", "application/grpc"),
                                     ("te", "trailers"), ("x-api-key", self.key), *extra])
        return frame(HEADERS, END_HEADERS | (END_STREAM if end else 0), sid, block)

    def call(self, sid: int, path: str = STATS, body: bytes | None = None, extra: tuple = ()) -> bytes:
        if body is None:
            body = pb.GetQueueStatsRequest(queue_name=Q).SerializeToString()
        return self.headers(sid, path, extra=extra) + frame(DATA, END_STREAM, sid, grpc_message(body))

    def pump(self, timeout: float) -> bool:
        """One read (at most `timeout` s); False once the server closed the connection."""
        if self.eof:
            return False
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(1 << 20)
        except (TimeoutError, BlockingIOError):
            return True
        except (ConnectionResetError, BrokenPipeError):
            data = b""
        if not data:
            self.eof = True
            return False
        self.received += len(data)
        self.buf += data
        self.frames += parse_frames(self.buf)
        return True

    def drain(self) -> None:
        """Read (and forget) what the server has sent so far."""
        while self.pump(0.001) and self.frames:
            self.frames.clear()

    def wait(self, predicate, timeout: float = 10.0, what: str = "frames") -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            left = deadline - time.monotonic()
            assert left > 0, f"timed out waiting for {what}; got {[f[:3] for f in self.frames][-20:]}"
            if not self.pump(min(left, 0.5)) and not predicate():
                raise AssertionError(f"the server closed the connection while we waited for {what}")

    def closed_within(self, timeout: float) -> float:
        """Read until the server closes the connection; how long that took."""
        began = time.monotonic()
        while self.pump(0.2):
            assert time.monotonic() - began < timeout, f"still open after {timeout} s"
        return time.monotonic() - began

    def answer(self, sid: int, timeout: float = 10.0) -> tuple[dict, list[bytes]]:
        """The call's last HEADERS block (decoded: trailers, or a trailers-only answer) and its messages."""
        self.wait(lambda: any(k == HEADERS and f & END_STREAM and s == sid for k, f, s, _ in self.frames)
                  or any(k == RST_STREAM and s == sid for k, _, s, _ in self.frames), timeout, f"the end of call {sid}")
        fields: dict = {}
        data = b""
        for kind, _, s, payload in self.frames:
            if s != sid:
                continue
            if kind == HEADERS:
                fields.update(dict(self.decoder.decode(payload)))
            elif kind == DATA:
                data += payload
            elif kind == RST_STREAM:
                fields.setdefault("rst", int.from_bytes(payload, "big"))
        messages = []
        while data:
            length = int.from_bytes(data[1:5], "big")
            messages.append(data[5:5 + length])
            data = data[5 + length:]
        return fields, messages

    def goaway(self) -> tuple[int, str] | None:
        for kind, _, _, payload in self.frames:
            if kind == GOAWAY:
                return int.from_bytes(payload[4:8], "big"), payload[8:].decode("utf-8", "replace")
        return None


def stats_of(fields_messages) -> pb.GetQueueStatsResponse:
    fields, messages = fields_messages
    assert fields.get("grpc-status") == "0", fields
    (body,) = messages
    return pb.GetQueueStatsResponse.FromString(body)


def test_a_well_behaved_raw_call_is_answered(server):
    """The raw client itself speaks well enough: one call, its answer, a PING answered."""
    c = Raw(server)
    try:
        c.send(c.call(1) + frame(PING, 0, 0, b"hostile!"))
        assert stats_of(c.answer(1)).queue_name == Q
        c.wait(lambda: (PING, ACK, 0, b"hostile!") in c.frames, what="the PING's ACK")
        assert c.frames[0][0] == SETTINGS and c.goaway() is None
    finally:
        c.close()


# ------------------------------------------------------------------ not HTTP/2 at all
@pytest.mark.parametrize("junk", [b"\x00\x01garbage\xff" * 50,
                                  b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: keep-alive\r\n\r\n",
                                  b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03" + b"\x00" * 40,  # a TLS hello
                                  b"PRI * HTTP/2.0\r\n\r\nXX\r\n\r\n"])
def test_bytes_that_are_not_http2_close_the_connection(server, junk):
    c = Raw(server, hello=False)
    try:
        c.send(junk)
        assert c.closed_within(5) < 5
        assert c.frames[0][0] == SETTINGS  # the server spoke first, as HTTP/2 servers do
        assert c.goaway() == (PROTOCOL_ERROR, "not an HTTP/2 client (no connection preface)")
    finally:
        c.close()
    serves(server, "junk")


def test_a_connection_that_never_sends_the_preface_is_closed_after_the_preface_timeout(server):
    silent, half = Raw(server, hello=False), Raw(server, hello=False)
    good = Raw(server)
    try:
        began = time.monotonic()
        half.send(PREFACE[:12])
        both = {}

        def watch(name, conn):
            conn.closed_within(PREFACE_TIMEOUT + 5)
            both[name] = time.monotonic() - began

        threads = [threading.Thread(target=watch, args=pair) for pair in (("silent", silent), ("half", half))]
        for t in threads:
            t.start()
        serves(server, "while two connections say nothing")  # they hold nothing meanwhile
        for t in threads:
            t.join(PREFACE_TIMEOUT + 6)
        assert set(both) == {"silent", "half"}, both
        assert all(PREFACE_TIMEOUT - 0.5 <= t < PREFACE_TIMEOUT + 3 for t in both.values()), both
        assert silent.goaway() is None and half.goaway() is None  # they never spoke HTTP/2: just closed
        # one that sent its preface and then nothing is not closed: it is an idle HTTP/2 connection
        good.send(frame(PING, 0, 0, b"still-ok"))
        good.wait(lambda: (PING, ACK, 0, b"still-ok") in good.frames, what="the idle connection's PING ACK")
        good.send(good.call(1))
        assert stats_of(good.answer(1)).queue_name == Q
    finally:
        for c in (silent, half, good):
            c.close()
    serves(server, "preface timeout")


# ------------------------------------------------------------------ broken HTTP/2
def _undecodable(c: Raw) -> bytes:
    return frame(HEADERS, END_HEADERS, 1, b"\xff\xff\xff\xff\x0f")


def _interrupted(c: Raw) -> bytes:
    block = c.headers(1)[9:]
    return frame(HEADERS, 0, 1, block[:3]) + frame(PING, 0, 0, b"12345678") + frame(CONTINUATION, END_HEADERS, 1,
                                                                                     block[3:])


def _continuation_flood(c: Raw) -> bytes:
    return frame(HEADERS, 0, 1, c.headers(1)[9:12]) + frame(CONTINUATION, 0, 1, b"") * (FLOOD + 2)


def _oversized_frame(c: Raw) -> bytes:
    return c.headers(1) + frame(DATA, 0, 1, b"x" * (16384 + 1))


def _data_on_an_idle_stream(c: Raw) -> bytes:
    return frame(DATA, 0, 99, b"x")


def _huge_header(c: Raw) -> bytes:
    block = c.encoder.encode([(":method", "POST"), (":path", STATS), ("x-big", "\x7f" * 40_000)])
    return frame(HEADERS, 0, 1, block[:16384]) + frame(CONTINUATION, 0, 1, block[16384:32768])


@pytest.mark.parametrize("attack, why", [(_undecodable, "a header block that does not decode"),
                                         (_interrupted, "a header block was interrupted"),
                                         (_continuation_flood, "a flood"),
                                         (_oversized_frame, "a frame of 16385 bytes"),
                                         (_data_on_an_idle_stream, "DATA on a stream that was never opened"),
                                         (_huge_header, "a header block over")])
def test_broken_http2_ends_the_connection_with_a_goaway(server, attack, why):
    c = Raw(server)
    try:
        c.send(attack(c))
        assert c.closed_within(5) < 5
        code, text = c.goaway()
        assert code == PROTOCOL_ERROR and why in text, text
    finally:
        c.close()
    serves(server, why)


# ------------------------------------------------------------------ calls the client never finishes
def test_calls_opened_and_never_finished_hold_only_their_own_connection(server):
    c = Raw(server)
    try:
        # every call it may have open, and one more; the first with a deadline
        opened = c.headers(1, extra=(("grpc-timeout", "1S"),)) + b"".join(c.headers(2 * i + 1)
                                                                        for i in range(1, MAX_STREAMS + 1))
        c.send(opened)
        extra = 2 * MAX_STREAMS + 1
        c.wait(lambda: (RST_STREAM, 0, extra, struct.pack(">I", REFUSED_STREAM)) in c.frames,
               what="the call past MAX_STREAMS refused")
        assert serves(server, "calls left open") < 5  # another connection is not held by them
        fields, messages = c.answer(1, timeout=5)  # its deadline passes: answered, and the client told to stop
        assert (fields["grpc-status"], fields["grpc-message"], messages) == ("4", "Deadline Exceeded", [])
        assert (RST_STREAM, 0, 1, struct.pack(">I", 0)) in c.frames
        # its place is free again; a reset frees another; the connection still takes whole calls
        c.send(c.call(extra + 2) + frame(RST_STREAM, 0, 3, struct.pack(">I", 8)) + c.call(extra + 4))
        assert stats_of(c.answer(extra + 2)).queue_name == Q
        assert stats_of(c.answer(extra + 4)).queue_name == Q
        assert c.goaway() is None
    finally:
        c.close()
    serves(server, "calls never finished")


# ------------------------------------------------------------------ answers never read
@pytest.fixture(scope="module")
def big_job(server):
    """A job whose GetJob answer is about 900 KB."""
    return server.enqueue("hostile-big", {"blob": "b" * 900_000})


def _get_job(c: Raw, sid: int, job_id: str) -> bytes:
    return c.call(sid, GET_JOB, pb.GetJobRequest(job_id=job_id).SerializeToString())


def _closed_by_the_server(c: Raw, timeout: float) -> float:
    """Without reading: poke the connection until a write fails (the server closed it); how long that took."""
    began = time.monotonic()
    while time.monotonic() - began < timeout:
        try:
            c.send(frame(0x42, 0, 0))  # a frame of a kind it ignores: it changes nothing
        except OSError:
            return time.monotonic() - began
        time.sleep(0.05)
    raise AssertionError(f"the server kept the connection open for {timeout} s")


def test_a_client_that_opens_its_windows_and_never_reads_is_closed_past_max_unsent(server, big_job):
    c = Raw(server, settings=struct.pack(">HI", S_INITIAL_WINDOW, WIDE), rcvbuf=32 * 1024)
    try:
        c.send(frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", WIDE - 65535)))
        calls = MAX_UNSENT // 900_000 + 20  # answers well past MAX_UNSENT
        c.send(b"".join(_get_job(c, 2 * i + 1, big_job) for i in range(calls)))
        assert _closed_by_the_server(c, 10) < 10
    finally:
        c.close()
    assert serves(server, "answers never read") < 5


def test_a_client_that_keeps_its_windows_shut_and_never_reads(server, big_job):
    """Its unary answers wait for windows it never opens (past the first 64 KiB), as grpcio's server would hold
    them: at most MAX_STREAMS calls of them, then its calls are refused; others are served meanwhile, and once
    its windows open (it still reads nothing) the answers pass MAX_UNSENT and it is closed."""
    c = Raw(server, rcvbuf=32 * 1024)
    try:
        c.send(b"".join(_get_job(c, 2 * i + 1, big_job) for i in range(MAX_STREAMS + 5)))
        assert serves(server, "answers held for shut windows") < 5
        c.send(frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", WIDE - 65535))
               + b"".join(frame(WINDOW_UPDATE, 0, 2 * i + 1, struct.pack(">I", WIDE - 65535))
                          for i in range(MAX_STREAMS)))
        assert _closed_by_the_server(c, 10) < 10
    finally:
        c.close()
    assert serves(server, "windows opened, never read") < 5


def test_many_large_answers_at_once_to_a_client_that_reads_are_all_delivered(server, big_job):
    """The other side of the bounds: grpcio's client, 15 GetJob calls of 900 KB at once on one channel (most of
    MAX_UNSENT, waiting for its windows at first), reading them as they come: none is cut."""
    import grpc

    from supervisor.proto import spooled_pb2_grpc

    with grpc.insecure_channel(server.grpc_address) as channel:
        stub = spooled_pb2_grpc.QueueServiceStub(channel)
        md = [("x-api-key", server.api_key)]
        calls = [stub.GetJob.future(pb.GetJobRequest(job_id=big_job), metadata=md, timeout=20) for _ in range(15)]
        jobs = [call.result() for call in calls]
    assert {j.job.id for j in jobs} == {big_job}
    assert all(j.job.payload["blob"] == "b" * 900_000 for j in jobs)


def test_calls_after_the_one_that_got_the_connection_closed_are_not_run(server, big_job):
    """The answers that pass MAX_UNSENT close the connection in the middle of what it sent at once: the calls
    after them must not start (a stream started on a closed connection would never end, holding a pool thread
    and one of its organization's 100 open streams)."""
    c = Raw(server, settings=struct.pack(">HI", S_INITIAL_WINDOW, WIDE), rcvbuf=32 * 1024)
    try:
        c.send(frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", WIDE - 65535)))
        sids = [2 * i + 1 for i in range(MAX_UNSENT // 900_000 + 20)]  # well past it, whatever the socket takes
        streams = [sids[-1] + 2 * (i + 1) for i in range(101)]
        c.send(b"".join(_get_job(c, sid, big_job) for sid in sids)
               + b"".join(c.headers(sid, PROCESS_JOBS) for sid in streams))
        assert _closed_by_the_server(c, 10) < 10
    finally:
        c.close()
    server.enqueue("hostile-after-close", {"n": 2})
    client = SpooledGrpcClient(address=server.grpc_address, api_key=server.api_key, timeout=10)
    try:  # not "Stream limit reached": none of the 101 streams is left open
        job = next(iter(client.queue.stream_jobs("hostile-after-close", "after-close", lease_duration_secs=30)))
        assert job.payload == {"n": 2}
    finally:
        client.close()
    serves(server, "a connection closed mid-batch")


def test_a_stream_whose_client_never_opens_its_window_is_closed_past_max_unsent(server):
    """ProcessJobs: each request has its answer (here a job of 900 KB); a client that never reads them or opens
    its window cannot make the server hold them without end: past MAX_UNSENT on the stream, it is closed."""
    queue = "hostile-bidi"
    for i in range(MAX_UNSENT // 900_000 + 3):
        server.enqueue(queue, {"blob": "p" * 900_000, "n": i})
    c = Raw(server, rcvbuf=32 * 1024)
    request = grpc_message(pb.ProcessRequest(dequeue=pb.DequeueRequest(queue_name=queue, worker_id="shut",
                                                                       lease_duration_secs=5)).SerializeToString())
    try:
        c.send(c.headers(1, PROCESS_JOBS))
        for _ in range(MAX_UNSENT // 900_000 + 3):
            c.send(frame(DATA, 0, 1, request))
        assert _closed_by_the_server(c, 10) < 10
    finally:
        c.close()
    assert serves(server, "a stream never read") < 5


# ------------------------------------------------------------------ floods
def test_a_ping_flood_is_cut(server):
    c = Raw(server, rcvbuf=1 << 20)
    try:
        c.send(c.call(1))
        assert stats_of(c.answer(1)).queue_name == Q  # the count starts after a call
        c.send(frame(PING, 0, 0, b"floodfld") * (FLOOD + 1))
        assert c.closed_within(10) < 10
        assert c.goaway() == (PROTOCOL_ERROR, f"over {FLOOD} frames in a row that carry no call (a flood)")
        assert sum(1 for k, f, _, p in c.frames if k == PING and f == ACK) == FLOOD + 1  # each answered, then cut
    finally:
        c.close()
    serves(server, "ping flood")


def test_a_rapid_reset_flood_leaves_the_server_serving(server):
    c = Raw(server, rcvbuf=1 << 20)
    try:
        for round_ in range(4):
            first = 1 + round_ * 5000 * 2
            wire = b"".join(c.headers(sid) + frame(RST_STREAM, 0, sid, struct.pack(">I", 8))
                            for sid in range(first, first + 10_000, 2))
            c.send(wire)
        last = 1 + 4 * 10_000
        c.send(c.call(last))
        assert stats_of(c.answer(last, timeout=15)).queue_name == Q  # the same connection is served after it
        assert c.goaway() is None and not any(k == RST_STREAM for k, _, _, _ in c.frames)
    finally:
        c.close()
    assert serves(server, "rapid reset") < 5


def test_a_rapid_reset_flood_of_streams_with_their_requests_leaves_the_server_serving(server):
    """StreamJobs calls sent whole and reset at once: each was handed to a pool thread; none may run long or
    keep the pool from the next stream."""
    c = Raw(server, rcvbuf=1 << 20)
    request = pb.StreamJobsRequest(queue_name="hostile-empty", worker_id="rr").SerializeToString()
    try:
        wire = b"".join(c.call(sid, STREAM_JOBS, request) + frame(RST_STREAM, 0, sid, struct.pack(">I", 8))
                        for sid in range(1, 6000, 2))
        began = time.monotonic()
        c.send(wire)
        assert serves(server, "rapid reset of streams") < 5
        c.send(c.call(7001))
        assert stats_of(c.answer(7001, timeout=15)).queue_name == Q
        assert time.monotonic() - began < 10
    finally:
        c.close()
    server.enqueue("hostile-stream", {"n": 1})
    client = SpooledGrpcClient(address=server.grpc_address, api_key=server.api_key, timeout=10)
    try:  # a real stream gets its job at once: no queue of dead calls ahead of it
        began = time.monotonic()
        job = next(iter(client.queue.stream_jobs("hostile-stream", "after-rr", lease_duration_secs=30)))
        assert job.payload == {"n": 1} and time.monotonic() - began < 3
    finally:
        client.close()


def _flooder(server, stop: threading.Event, kind: str, counts: dict) -> None:
    """Flood until told to stop, on a new connection each time one is cut."""
    while not stop.is_set():
        c = Raw(server)
        try:
            sid = 1
            while not stop.is_set():
                if kind == "ping":  # as many PINGs as allowed in a row, then a call to start the count again
                    c.send(frame(PING, 0, 0, b"pingpong") * (FLOOD // 2) + c.call(sid))
                elif kind == "calls":  # whole calls, as fast as it can write them
                    c.send(b"".join(c.call(s) for s in range(sid, sid + 4000, 2)))
                    sid += 4000
                else:  # calls opened and reset
                    c.send(b"".join(c.headers(s) + frame(RST_STREAM, 0, s, struct.pack(">I", 8))
                                    for s in range(sid, sid + 2000, 2)))
                    sid += 2000
                sid += 2
                counts[kind] = counts.get(kind, 0) + 1
                c.drain()
        except OSError:
            counts["cut"] = counts.get("cut", 0) + 1
        finally:
            c.close()


@pytest.mark.parametrize("kind", ["ping", "reset", "calls"])
def test_a_flooding_connection_does_not_hold_another_clients_calls(server, kind):
    stop, counts = threading.Event(), {}
    flooders = [threading.Thread(target=_flooder, args=(server, stop, kind, counts), daemon=True) for _ in range(2)]
    for t in flooders:
        t.start()
    try:
        deadline = time.monotonic() + 10
        while counts.get(kind, 0) < 2:
            assert time.monotonic() < deadline, counts
            time.sleep(0.05)
        before = counts[kind]
        took = [serves(server, f"during a {kind} flood") for _ in range(3)]
        assert max(took) < 3, took
        deadline = time.monotonic() + 10  # the flood goes on beside them (a loaded host may run a round slowly)
        while counts[kind] <= before:
            assert time.monotonic() < deadline, counts
            time.sleep(0.05)
    finally:
        stop.set()
        for t in flooders:
            t.join(10)
    serves(server, f"after a {kind} flood")


# ------------------------------------------------------------------ calls the server refuses
def test_a_message_over_4_mib_ends_its_call_and_the_connection_goes_on(server):
    c = Raw(server)
    try:
        c.send(c.headers(1, GET_JOB) + frame(DATA, 0, 1, b"\0" + struct.pack(">I", MAX_MESSAGE + 1) + b"j" * 16000))
        fields, messages = c.answer(1)
        assert (fields["grpc-status"], messages) == ("8", [])
        assert fields["grpc-message"] == f"Received message larger than max ({MAX_MESSAGE + 1} vs. {MAX_MESSAGE})"
        # the rest of it arrives all the same (the window was given): dropped
        rest = b"j" * (MAX_MESSAGE + 1 - 16000 + 5)
        c.send(b"".join(frame(DATA, 0, 1, rest[i:i + 16384]) for i in range(0, len(rest), 16384)))
        c.send(c.call(3))
        assert stats_of(c.answer(3)).queue_name == Q and c.goaway() is None
    finally:
        c.close()
    serves(server, "a message over 4 MiB")


def test_an_unknown_method_is_unimplemented_and_a_body_that_does_not_parse_is_internal(server):
    c = Raw(server)
    try:
        c.send(c.call(1, "/spooled.v1.QueueService/NoSuchMethod", b"")
               + c.call(3, "/nothing", b"")
               + c.call(5, GET_JOB, b"\xff\xff\xff\xff")  # a field with no number: not protobuf
               + c.call(7, STATS, b"\x0a\x10short")  # a string longer than the body
               + c.call(9, "/spooled.v1.WorkerService/Register", b"\x08"))  # a varint cut off
        for sid in (1, 3):
            fields, messages = c.answer(sid)
            assert (fields["grpc-status"], fields["grpc-message"], messages) == ("12", "Method not found!", [])
        for sid in (5, 7, 9):
            fields, messages = c.answer(sid)
            assert (fields["grpc-status"], fields["grpc-message"], messages) == \
                ("13", "Exception deserializing request!", [])
        c.send(c.call(11))
        assert stats_of(c.answer(11)).queue_name == Q and c.goaway() is None
    finally:
        c.close()
    serves(server, "unknown methods and bad bodies")
