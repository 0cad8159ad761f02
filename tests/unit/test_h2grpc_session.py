"""The gRPC wire client's HTTP/2 session (supervisor.client.h2grpc.H2Session), fed bytes in process: what a
well-behaved server sends, and what a broken or hostile one does."""

from __future__ import annotations

import struct

import pytest

hpack = pytest.importorskip("hpack")

from supervisor.client import h2grpc  # noqa: E402
from supervisor.client.h2grpc import (  # noqa: E402
    DATA,
    END_HEADERS,
    END_STREAM,
    GOAWAY,
    HEADERS,
    PING,
    RST_STREAM,
    SETTINGS,
    WINDOW_UPDATE,
    H2Session,
    ProtocolError,
    frame,
    grpc_message,
)

pytestmark = pytest.mark.timeout(30)
KEY = "sp_test_secret-key-123"
PATH = "/spooled.v1.QueueService/Dequeue"


class Server:
    """The peer's side: reads our frames, writes answers with a real HPACK encoder."""

    def __init__(self) -> None:
        self.encoder = hpack.Encoder()
        self.decoder = hpack.Decoder()

    def frames(self, data: bytes) -> list[tuple[int, int, int, bytes]]:
        if data.startswith(h2grpc.PREFACE):
            data = data[len(h2grpc.PREFACE):]
        out = []
        while data:
            length = int.from_bytes(data[:3], "big")
            out.append((data[3], data[4], int.from_bytes(data[5:9], "big"), data[9:9 + length]))
            data = data[9 + length:]
        return out

    def headers(self, sid: int, fields: list, end: bool = False) -> bytes:
        return frame(HEADERS, END_HEADERS | (END_STREAM if end else 0), sid, self.encoder.encode(fields))

    def ok(self, sid: int, body: bytes) -> bytes:
        return (self.headers(sid, [(":status", "200"), ("content-type", "application/grpc")])
                + frame(DATA, 0, sid, grpc_message(body)) + self.headers(sid, [("grpc-status", "0")], end=True))


def session() -> H2Session:
    s = H2Session("127.0.0.1:50051", False, (("x-api-key", KEY),), "test/1")
    s.data_to_send()  # the preface and our settings
    return s


def test_a_call_and_its_answer_and_the_connection_chores():
    s, srv = session(), Server()
    sid = s.start(PATH, b"request-bytes")
    sent = srv.frames(s.data_to_send())
    assert [(k, f & END_STREAM) for k, f, _, _ in sent] == [(HEADERS, 0), (DATA, END_STREAM)]
    fields = dict(srv.decoder.decode(sent[0][3]))
    assert fields[":path"] == PATH and fields[":method"] == "POST" and fields["te"] == "trailers"
    assert fields["x-api-key"] == KEY
    assert sent[1][3] == grpc_message(b"request-bytes")
    # settings and a ping: both answered; then the answer
    answers = s.receive(frame(SETTINGS, 0, 0, struct.pack(">HI", 3, 10)) + frame(PING, 0, 0, b"12345678")
                        + srv.ok(sid, b"reply"))
    assert [(a.stream_id, a.status, a.message) for a in answers] == [(sid, 0, b"reply")]
    chores = srv.frames(s.data_to_send())
    assert (SETTINGS, 1, 0, b"") in chores and (PING, 1, 0, b"12345678") in chores
    # the same answer again, byte for byte after the peer's table is warm, decodes the same
    sid2 = s.start(PATH, b"again")
    assert [(a.status, a.message) for a in s.receive(srv.ok(sid2, b"reply2"))] == [(0, b"reply2")]


def test_the_key_is_a_never_indexed_literal_and_in_no_repr():
    s = session()
    s.start(PATH, b"x")
    block = Server().frames(s.data_to_send())[0][3]
    assert bytes((0x10, len("x-api-key"))) + b"x-api-key" in block  # never indexed, by anyone on the path
    assert KEY not in repr(s) and KEY not in repr(s.calls)


def test_an_error_status_with_an_encoded_message():
    s, srv = session(), Server()
    sid = s.start(PATH, b"x")
    got = s.receive(srv.headers(sid, [(":status", "200"), ("content-type", "application/grpc"),
                                      ("grpc-status", "9"), ("grpc-message", "Lease%20expired%20%E2%9C%93")], end=True))
    assert [(a.status, a.details) for a in got] == [(9, "Lease expired \u2713")]


def test_goaway_ends_the_calls_it_will_not_process_and_opens_none():
    s, srv = session(), Server()
    first, second = s.start(PATH, b"a"), s.start(PATH, b"b")
    s.data_to_send()
    got = s.receive(frame(GOAWAY, 0, 0, struct.pack(">II", first, 0)))
    assert [(a.stream_id, a.status) for a in got] == [(second, 14)]  # UNAVAILABLE: not processed, safe again
    assert s.goaway
    assert [a.stream_id for a in s.receive(srv.ok(first, b"done"))] == [first]  # the one it took still ends


def test_a_reset_call_is_unavailable_when_refused():
    s = session()
    sid = s.start(PATH, b"x")
    got = s.receive(frame(RST_STREAM, 0, sid, struct.pack(">I", 0x7)))
    assert [(a.stream_id, a.status) for a in got] == [(sid, 14)]


@pytest.mark.parametrize("data, what", [
    (b"\xff" * 20, "frame of"),  # garbage: a frame length far over the 16 KiB we allow
    (frame(HEADERS, END_HEADERS, 1, b"\xff\xff\xff\xff"), "does not decode"),  # a header block that is not HPACK
    (frame(HEADERS, 0, 1, b"") + frame(DATA, 0, 1, b"x"), "interrupted"),  # no CONTINUATION after HEADERS
    (frame(WINDOW_UPDATE, 0, 0, b"\0"), "WINDOW_UPDATE"),
    (frame(SETTINGS, 0, 0, b"\0\0\0"), "SETTINGS"),
])
def test_a_broken_peer_is_a_protocol_error(data, what):
    s = session()
    s.start(PATH, b"x")
    with pytest.raises(ProtocolError, match=what):
        s.receive(data)
    assert [a.status for a in s.fail_all("dropped")] == [14]


def test_a_frame_split_across_reads_is_put_back_together():
    s, srv = session(), Server()
    sid = s.start(PATH, b"x")
    data = srv.ok(sid, b"y" * 3000)
    got = []
    for i in range(0, len(data), 7):
        got += s.receive(data[i:i + 7])
    assert [(a.status, a.message) for a in got] == [(0, b"y" * 3000)]


def test_windows_and_the_stream_limit_are_honoured():
    s, srv = session(), Server()
    s.receive(frame(SETTINGS, 0, 0, struct.pack(">HIHI", 3, 1, 4, 1000)))  # one stream, 1000-byte windows
    s.data_to_send()
    big = s.start(PATH, b"z" * 5000)
    small = s.start(PATH, b"s")
    sent = srv.frames(s.data_to_send())
    assert sum(len(p) for k, _, i, p in sent if k == DATA and i == big) == 1000  # the stream's window
    assert all(i != small for _, _, i, _ in sent)  # the second call waits for a free stream
    s.receive(frame(WINDOW_UPDATE, 0, big, struct.pack(">I", 10_000)))
    sent = srv.frames(s.data_to_send())
    # the connection's window (65535) allows the rest; the stream's has room now
    assert sum(len(p) for k, _, i, p in sent if k == DATA and i == big) == 5005 - 1000
    s.receive(srv.ok(big, b"ok"))
    assert any(i == small for _, _, i, _ in srv.frames(s.data_to_send()))  # its turn now


def test_an_oversized_compressed_or_non_grpc_answer_ends_only_its_call():
    s, srv = session(), Server()
    sid = s.start(PATH, b"x")
    s.receive(srv.headers(sid, [(":status", "200")]))
    chunk = b"x" * 16000
    got = []
    for _ in range(300):  # 4.8 MB: over the 4 MiB a message may have
        got += s.receive(frame(DATA, 0, sid, chunk))
        if got:
            break
    assert [a.status for a in got] == [13]  # INTERNAL: a broken answer, not a rate limit
    assert any(k == RST_STREAM and i == sid for k, _, i, _ in srv.frames(s.data_to_send()))
    sid = s.start(PATH, b"x")
    got = s.receive(srv.headers(sid, [(":status", "200")]) + frame(DATA, 0, sid, b"\x01" + struct.pack(">I", 1) + b"z")
                    + srv.headers(sid, [("grpc-status", "0")], end=True))
    assert [(a.status, a.details) for a in got] == [(13, "a compressed answer (we asked for none)")]
    sid = s.start(PATH, b"x")
    got = s.receive(srv.headers(sid, [(":status", "503"), ("content-type", "text/html")], end=True))
    assert [a.status for a in got] == [14]
    sid = s.start(PATH, b"x")
    got = s.receive(srv.headers(sid, [(":status", "200")]) + frame(DATA, END_STREAM, sid, grpc_message(b"")))
    assert [a.status for a in got] == [13]  # ended without a gRPC status


def test_goaway_or_used_up_stream_ids_make_the_session_spent():
    s = session()
    assert not s.spent()
    s.receive(frame(GOAWAY, 0, 0, struct.pack(">II", 0, 0)))
    assert s.spent()
    s = session()
    s.next_id = 2 ** 31 + 1
    assert s.spent()


def test_a_flood_of_frames_that_finish_nothing_is_a_protocol_error_but_answers_reset_the_count():
    s, srv = session(), Server()
    sid = s.start(PATH, b"x")
    below = h2grpc.FLOOD * 9 // 10
    s.receive(frame(PING, 0, 0, b"12345678") * below + srv.ok(sid, b"done"))  # an answer: the count starts again
    s.data_to_send()
    s.start(PATH, b"y")
    s.receive(frame(PING, 0, 0, b"12345678") * below)
    with pytest.raises(ProtocolError, match="flood"):
        s.receive(frame(PING, 0, 0, b"12345678") * (h2grpc.FLOOD // 5))


def test_a_peer_that_stops_reading_is_given_up():
    s = session()
    s.receive(frame(SETTINGS, 0, 0, struct.pack(">HI", 4, 2 ** 31 - 1))
              + frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", 2 ** 31 - 1 - 65535)))
    s.start(PATH, b"z" * (17 * 1024 * 1024))  # windows wide open: the whole body waits in our output
    with pytest.raises(ProtocolError, match="does not read"):
        s.receive(frame(PING, 0, 0, b"12345678"))


def test_pushed_streams_and_bad_settings_are_protocol_errors():
    for data, words in [(frame(5, END_HEADERS, 1, b"\0\0\0\2"), "pushed"),
                        (frame(SETTINGS, 0, 0, struct.pack(">HI", 5, 1 << 24)), "MAX_FRAME_SIZE"),
                        (frame(SETTINGS, 0, 0, struct.pack(">HI", 4, 1 << 31)), "INITIAL_WINDOW_SIZE"),
                        (frame(PING, 0, 1, b"12345678"), "PING")]:
        with pytest.raises(ProtocolError, match=words):
            session().receive(data)


def test_every_connection_of_a_loop_shares_one_lookup_of_the_servers_address():
    """A new connection after a GOAWAY uses the addresses already known: a new lookup would run on its
    thread off loopback, and the calls sent again meanwhile would fail at once."""
    import selectors

    from supervisor.client.grpc_transport import GrpcAPI, LoopGrpc
    from supervisor.client.rest import Secret

    sel = selectors.DefaultSelector()
    try:
        loop = LoopGrpc(GrpcAPI("grpc.example.invalid:443", Secret("sp_test_x")), sel)
        first = loop._addresses()
        assert loop._addresses() is first and first.host == "grpc.example.invalid" and first.port == 443
    finally:
        sel.close()


def test_a_header_blocks_reading_is_remembered_only_while_the_table_stands():
    from supervisor.proto.h2 import BlockDecoder

    enc, reads = hpack.Encoder(), []

    def read(fields):
        reads.append(fields)
        return dict(fields).get(b"grpc-status")

    dec = BlockDecoder(65536, read)

    first = enc.encode([(":status", "200"), ("grpc-status", "0")])  # adds grpc-status to the dynamic table
    assert dec.decode(first) == b"0" and len(reads) == 1  # the table changed: not remembered
    again = enc.encode([(":status", "200"), ("grpc-status", "0")])  # now all indexed: leaves the table as is
    assert dec.decode(again) == b"0" and dec.decode(again) == b"0" and len(reads) == 2
    changed = enc.encode([("grpc-status", "5")])  # a new entry: what was remembered is forgotten
    assert dec.decode(changed) == b"5" and len(reads) == 3
    # read again, not remembered: the same bytes now point at the newer entry of the table
    assert dec.decode(again) == b"5" and len(reads) == 4
