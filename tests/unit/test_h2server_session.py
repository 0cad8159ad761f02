"""The dev server's HTTP/2 server session (supervisor.devserver.h2server.ServerSession), fed bytes in process:
a well-behaved gRPC client's calls, and everything a broken or hostile client does to it (bad framing, floods,
oversized and unfinished messages, too many calls, flow-control windows it keeps shut or overruns)."""

from __future__ import annotations

import struct

import pytest

hpack = pytest.importorskip("hpack")

from supervisor.devserver import h2server  # noqa: E402
from supervisor.devserver.h2server import (  # noqa: E402
    FLOOD,
    MAX_BUFFERED,
    MAX_MESSAGE,
    MAX_STREAMS,
    STREAM_WINDOW,
    Cancelled,
    HalfClosed,
    Message,
    ServerSession,
    Started,
    parse_timeout,
    percent_encode,
)
from supervisor.proto.h2 import (  # noqa: E402
    ACK,
    CONTINUATION,
    DATA,
    END_HEADERS,
    END_STREAM,
    FLOW_CONTROL_ERROR,
    GOAWAY,
    HEADERS,
    MAX_FRAME,
    NO_ERROR,
    PADDED,
    PING,
    PREFACE,
    PRIORITY_FRAME,
    PUSH_PROMISE,
    REFUSED_STREAM,
    RST_STREAM,
    S_INITIAL_WINDOW,
    S_MAX_CONCURRENT,
    S_MAX_HEADER_LIST,
    SETTINGS,
    WINDOW_UPDATE,
    ProtocolError,
    frame,
    grpc_message,
    literal,
)

pytestmark = pytest.mark.timeout(60)
KEY = "sp_test_server-session-key"
PATH = "/spooled.v1.QueueService/GetJob"
CHUNK = MAX_FRAME


def rst(sid: int, code: int = 0x8) -> bytes:
    return frame(RST_STREAM, 0, sid, struct.pack(">I", code))


def window(sid: int, grant: int) -> bytes:
    return frame(WINDOW_UPDATE, 0, sid, struct.pack(">I", grant))


def data_frames(sid: int, payload: bytes, end: bool = False) -> bytes:
    """`payload` as DATA frames of at most MAX_FRAME bytes (END_STREAM on the last when `end`)."""
    pieces = [payload[i:i + CHUNK] for i in range(0, len(payload), CHUNK)] or [b""]
    return b"".join(frame(DATA, END_STREAM if end and i == len(pieces) - 1 else 0, sid, p)
                    for i, p in enumerate(pieces))


def parse(data: bytes) -> list[tuple[int, int, int, bytes]]:
    out = []
    while data:
        assert len(data) >= 9, "half a frame"
        length = int.from_bytes(data[:3], "big")
        assert len(data) >= 9 + length, "half a frame"
        out.append((data[3], data[4], int.from_bytes(data[5:9], "big") & 0x7FFFFFFF, data[9:9 + length]))
        data = data[9 + length:]
    return out


class Client:
    """The client's side of one connection: a real HPACK encoder for its headers, a decoder for the session's."""

    def __init__(self, settings: bytes = b"") -> None:
        self.session = ServerSession()
        self.encoder, self.decoder = hpack.Encoder(), hpack.Decoder()
        self.hello = parse(self.session.data_to_send())  # the session's SETTINGS and connection window
        assert self.session.receive(PREFACE + frame(SETTINGS, 0, 0, settings)) == []
        assert parse(self.session.data_to_send()) == [(SETTINGS, ACK, 0, b"")]

    def block(self, path: str = PATH, method: str = "POST", content_type: str | None = "application/grpc",
              extra: tuple = ()) -> bytes:
        fields = [(":method", method), (":scheme", "http"), (":path", path), (":authority", "localhost")]
        if content_type is not None:
            fields.append(("content-type", content_type))
        fields += [("te", "trailers"), ("x-api-key", KEY), *extra]
        return self.encoder.encode(fields)

    def headers(self, sid: int, end: bool = False, **kw) -> bytes:
        return frame(HEADERS, END_HEADERS | (END_STREAM if end else 0), sid, self.block(**kw))

    def call(self, sid: int, body: bytes, **kw) -> bytes:
        return self.headers(sid, **kw) + frame(DATA, END_STREAM, sid, grpc_message(body))

    def send(self, data: bytes) -> list:
        return self.session.receive(data)

    def frames(self) -> list[tuple[int, int, int, bytes]]:
        return parse(self.session.data_to_send())

    def fields(self, payload: bytes) -> dict[str, str]:
        return dict(self.decoder.decode(payload))


def kinds(frames) -> list[tuple[int, int, int]]:
    return [(k, f, s) for k, f, s, _ in frames]


def answer_frames(c: Client, frames) -> tuple[list[dict], bytes]:
    """The HEADERS blocks (decoded) and the DATA bytes among `frames`."""
    blocks = [c.fields(p) for k, _, _, p in frames if k == HEADERS]
    return blocks, b"".join(p for k, _, _, p in frames if k == DATA)


# ------------------------------------------------------------------ a well-behaved client
def test_the_session_opens_with_its_settings_and_a_wide_connection_window():
    c = Client()
    (k1, f1, s1, settings), (k2, _, s2, grant) = c.hello
    assert (k1, f1, s1, k2, s2) == (SETTINGS, 0, 0, WINDOW_UPDATE, 0)
    assert dict(struct.iter_unpack(">HI", settings)) == {S_MAX_CONCURRENT: MAX_STREAMS,
                                                         S_INITIAL_WINDOW: STREAM_WINDOW,
                                                         S_MAX_HEADER_LIST: h2server.MAX_HEADER_LIST}
    assert int.from_bytes(grant, "big") == h2server.CONNECTION_WINDOW - 65535


def test_a_unary_call_its_events_and_its_answer():
    c = Client()
    events = c.send(c.call(1, b"request", extra=(("grpc-timeout", "5S"), ("user-agent", "grpc-python/1.0"),
                                                 ("x-trace-bin", "AAEC"), ("X-Mixed", "v"))))
    assert events == [Started(1, PATH, (("x-api-key", KEY), ("user-agent", "grpc-python/1.0"),
                                        ("x-trace-bin", b"\x00\x01\x02"), ("x-mixed", "v")), 5.0),
                      Message(1, b"request"), HalfClosed(1)]
    assert c.frames() == []  # no window back for the client's last DATA: nothing more comes
    assert c.session.send_message(1, b"answer") and c.session.finish(1, 0)
    out = c.frames()
    assert kinds(out) == [(HEADERS, END_HEADERS, 1), (DATA, 0, 1), (HEADERS, END_HEADERS | END_STREAM, 1)]
    assert c.fields(out[0][3]) == {":status": "200", "content-type": "application/grpc"}
    assert out[1][3] == grpc_message(b"answer")
    assert c.fields(out[2][3]) == {"grpc-status": "0"}
    assert c.session.streams == {} and not c.session.waiting
    assert not c.session.send_message(1, b"late") and not c.session.finish(1, 13)  # the call is over
    assert c.frames() == []


def test_grpc_timeout_units_and_malformed_values():
    c = Client()
    started, _, _ = c.send(c.call(1, b"", extra=(("grpc-timeout", "100m"),)))
    assert started.timeout == pytest.approx(0.1)
    assert c.send(c.call(3, b""))[0].timeout is None
    assert [parse_timeout(v) for v in (b"1H", b"2M", b"3S", b"4m", b"5u", b"6n")] == \
        [3600.0, 120.0, 3.0, pytest.approx(0.004), pytest.approx(5e-6), pytest.approx(6e-9)]
    assert [parse_timeout(v) for v in (b"", b"S", b"5", b"5s", b"-5S", b"123456789S", b"5 S", b"x5S")] == [None] * 8
    assert parse_timeout(b"12345678S") == 12345678.0


def test_several_messages_in_one_frame_and_one_message_over_many_frames():
    c = Client()
    big = bytes(range(256)) * 300  # 76,800 bytes: five DATA frames
    events = c.send(c.headers(1) + frame(DATA, 0, 1, grpc_message(b"a") + grpc_message(b"") + grpc_message(b"bc")))
    assert events == [Started(1, PATH, (("x-api-key", KEY),), None), Message(1, b"a"), Message(1, b""),
                      Message(1, b"bc")]
    wire = grpc_message(big)
    # fed a byte short of the end, then the last byte and END_STREAM
    assert c.send(data_frames(1, wire[:-1])) == []
    assert c.session.buffered == len(wire) - 1
    assert c.send(frame(DATA, END_STREAM, 1, wire[-1:])) == [Message(1, big), HalfClosed(1)]
    assert c.session.buffered == 0
    grants = [int.from_bytes(p, "big") for k, _, s, p in c.frames() if k == WINDOW_UPDATE and s == 1]
    # each DATA frame's bytes back at once, but for the last (END_STREAM)
    assert sum(grants) == len(grpc_message(b"a") + grpc_message(b"") + grpc_message(b"bc")) + len(wire) - 1


def test_padded_data_counts_against_the_window_with_its_padding():
    c = Client()
    c.send(c.headers(1))
    padded = bytes((7,)) + grpc_message(b"xyz") + b"\0" * 7
    assert c.send(frame(DATA, PADDED, 1, padded)) == [Message(1, b"xyz")]
    assert c.frames() == [(WINDOW_UPDATE, 0, 1, struct.pack(">I", len(padded)))]
    assert c.session.recv_window == h2server.CONNECTION_WINDOW - len(padded)
    assert c.send(frame(DATA, PADDED | END_STREAM, 1, b"\2\0\0")) == [HalfClosed(1)]
    with pytest.raises(ProtocolError, match="bad padding"):
        c.send(c.headers(3) + frame(DATA, PADDED, 3, bytes((200,)) + b"short"))


def test_a_whole_connection_fed_one_byte_at_a_time():
    s = ServerSession()
    block = literal(b":method", b"POST") + literal(4, PATH.encode()) + literal(b"content-type", b"application/grpc")
    wire = PREFACE + frame(SETTINGS, 0, 0) + frame(HEADERS, END_HEADERS, 1, block) + \
        frame(DATA, END_STREAM, 1, grpc_message(b"hello"))
    events = []
    for i in range(len(wire)):
        events += s.receive(wire[i:i + 1])
    assert events == [Started(1, PATH, (), None), Message(1, b"hello"), HalfClosed(1)]


def test_an_error_before_any_message_is_trailers_only_with_a_percent_encoded_message():
    c = Client()
    c.send(c.call(1, b"req"))
    c.frames()
    assert c.session.finish(1, 5, "Job not found: é 100%\n")
    (kind, flags, sid, block), = c.frames()  # one frame, and no RST: the client had half-closed
    assert (kind, flags, sid) == (HEADERS, END_HEADERS | END_STREAM, 1)
    fields = c.fields(block)
    assert fields == {":status": "200", "content-type": "application/grpc", "grpc-status": "5",
                      "grpc-message": "Job not found: %C3%A9 100%25%0A"}
    assert percent_encode("plain ASCII ~") == b"plain ASCII ~"
    # a call answered while its client is still sending is told to stop, after its trailers
    c.send(c.headers(3) + frame(DATA, 0, 3, grpc_message(b"x")))
    c.frames()
    assert c.session.finish(3, 3, "x" * 5000)
    out = c.frames()
    assert kinds(out) == [(HEADERS, END_HEADERS | END_STREAM, 3), (RST_STREAM, 0, 3)]
    assert out[1][3] == struct.pack(">I", NO_ERROR)
    assert len(c.fields(out[0][3])["grpc-message"]) == 4096  # cut
    assert c.send(frame(DATA, END_STREAM, 3, grpc_message(b"in flight"))) == []  # dropped, no error


def test_a_long_non_ascii_error_still_fits_one_frame_and_is_cut_between_escapes():
    c = Client()
    c.send(c.call(1, b"req"))
    c.frames()
    assert c.session.finish(1, 7, "API key does not have permission for queue '" + "é" * 4096 + "'")
    (kind, _, _, block), = c.frames()
    assert kind == HEADERS and len(block) <= MAX_FRAME
    message = c.fields(block)["grpc-message"]
    assert len(message) <= 4096 and message.startswith("API key does not have permission for queue '%C3%A9")
    assert message.endswith("%C3%A9") or message.endswith("%C3")  # never half an escape


def test_answers_after_the_client_keeps_sending_are_reset_with_no_error_after_the_trailers():
    c = Client()
    c.send(c.headers(1) + frame(DATA, 0, 1, grpc_message(b"first")))  # a bidi call, still open
    c.frames()
    assert c.session.send_message(1, b"one") and c.session.send_message(1, b"two") and c.session.finish(1, 0)
    out = c.frames()
    assert kinds(out) == [(HEADERS, END_HEADERS, 1), (DATA, 0, 1), (DATA, 0, 1),
                          (HEADERS, END_HEADERS | END_STREAM, 1), (RST_STREAM, 0, 1)]
    assert answer_frames(c, out)[1] == grpc_message(b"one") + grpc_message(b"two")


def test_reset_and_goaway_from_the_server():
    c = Client()
    c.send(c.headers(1) + c.headers(3))
    c.session.reset(1)
    c.session.goaway(NO_ERROR, "bye")
    assert c.frames() == [(RST_STREAM, 0, 1, struct.pack(">I", 0x8)), (GOAWAY, 0, 0, struct.pack(">II", 3, 0) + b"bye")]
    assert list(c.session.streams) == [3]
    assert c.send(frame(DATA, END_STREAM, 1, grpc_message(b"late"))) == []  # a reset call's bytes are dropped


# ------------------------------------------------------------------ not HTTP/2, broken framing
@pytest.mark.parametrize("data", [b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03",
                                  b"PRI * HTTP/1.1\r\n", b"\0" * 100, PREFACE[:-1] + b"X" + frame(SETTINGS, 0, 0)])
def test_no_preface_is_a_protocol_error(data):
    with pytest.raises(ProtocolError, match="no connection preface"):
        ServerSession().receive(data)


def test_half_a_preface_waits_and_a_wrong_rest_is_an_error():
    s = ServerSession()
    assert s.receive(PREFACE[:10]) == [] and not s.preface
    with pytest.raises(ProtocolError, match="no connection preface"):
        s.receive(b"garbage that is no preface")


def test_a_frame_over_the_largest_size_is_refused_from_its_header_alone():
    c = Client()
    header = struct.pack(">I", MAX_FRAME + 1)[1:] + bytes((DATA, 0)) + struct.pack(">I", 1)
    with pytest.raises(ProtocolError, match=f"a frame of {MAX_FRAME + 1} bytes"):
        c.send(header)  # no need to wait for its 16 KiB
    c = Client()
    c.send(c.headers(1))
    assert c.send(frame(DATA, 0, 1, grpc_message(b"x" * (MAX_FRAME - 5)))) == [Message(1, b"x" * (MAX_FRAME - 5))]


def broken_cases():
    enc = hpack.Encoder()
    good = enc.encode([(":method", "POST"), (":path", PATH), ("content-type", "application/grpc")])
    return {
        "HEADERS on stream 0": frame(HEADERS, END_HEADERS, 0, good),
        "HEADERS on an even stream": frame(HEADERS, END_HEADERS, 2, good),
        "a block that does not decode": frame(HEADERS, END_HEADERS, 1, b"\xff\xff\xff\xff\xff\x0f"),
        "an index past the tables": frame(HEADERS, END_HEADERS, 1, b"\xfe"),
        "a table size over the allowed": frame(HEADERS, END_HEADERS, 1, b"\x3f\xe1\xff\x03" + good),
        "CONTINUATION without HEADERS": frame(CONTINUATION, END_HEADERS, 1, good),
        "DATA on a stream never opened": frame(DATA, 0, 5, b"x"),
        "DATA on stream 0": frame(DATA, 0, 0, b"x"),
        "RST_STREAM on a stream never opened": rst(7),
        "RST_STREAM of the wrong size": frame(RST_STREAM, 0, 1, b"\0\0\0"),
        "SETTINGS on a stream": frame(SETTINGS, 0, 1),
        "SETTINGS of the wrong size": frame(SETTINGS, 0, 0, b"\0\4\0\0\0"),
        "a SETTINGS ACK with a payload": frame(SETTINGS, ACK, 0, b"\0\4\0\0\0\0"),
        "a window past the largest": frame(SETTINGS, 0, 0, struct.pack(">HI", S_INITIAL_WINDOW, 1 << 31)),
        "a frame size out of range": frame(SETTINGS, 0, 0, struct.pack(">HI", 5, 100)),
        "a PING of the wrong size": frame(PING, 0, 0, b"1234567"),
        "a PING on a stream": frame(PING, 0, 1, b"12345678"),
        "a WINDOW_UPDATE of 0 for the connection": window(0, 0),
        "a WINDOW_UPDATE of the wrong size": frame(WINDOW_UPDATE, 0, 0, b"\0\0\1"),
        "a connection window past the largest": window(0, (1 << 31) - 1),
        "PRIORITY of the wrong size": frame(PRIORITY_FRAME, 0, 1, b"\0\0\0\0"),
        "PUSH_PROMISE": frame(PUSH_PROMISE, END_HEADERS, 1, b"\0\0\0\2" + good),
    }


@pytest.mark.parametrize("name", list(broken_cases()))
def test_broken_framing_is_a_protocol_error(name):
    c = Client()
    with pytest.raises(ProtocolError):
        c.send(broken_cases()[name])


def test_a_new_call_after_the_clients_goaway_is_an_error_but_open_calls_go_on():
    c = Client()
    c.send(c.headers(1))
    assert c.send(frame(GOAWAY, 0, 0, struct.pack(">II", 0, NO_ERROR))) == []
    assert c.send(frame(DATA, END_STREAM, 1, grpc_message(b"r"))) == [Message(1, b"r"), HalfClosed(1)]
    with pytest.raises(ProtocolError, match="after the client's GOAWAY"):
        c.send(c.headers(3))


def test_unknown_frames_priority_and_client_trailers_are_ignored():
    c = Client()
    events = c.send(frame(0x42, 0xFF, 0, b"whatever") + frame(PRIORITY_FRAME, 0, 1, b"\0\0\0\0\x10")
                    + c.headers(1) + frame(DATA, 0, 1, grpc_message(b"r"))
                    + frame(HEADERS, END_HEADERS | END_STREAM, 1, c.encoder.encode([("x-trailer", "t")])))
    assert events == [Started(1, PATH, (("x-api-key", KEY),), None), Message(1, b"r"), HalfClosed(1)]
    # HEADERS with the PRIORITY flag: its five bytes are not part of the block
    prio = frame(HEADERS, END_HEADERS | 0x20, 3, b"\0\0\0\0\x10" + c.block())
    assert c.send(prio) == [Started(3, PATH, (("x-api-key", KEY),), None)]


# ------------------------------------------------------------------ requests that are not gRPC calls
@pytest.mark.parametrize("kw, status", [({"method": "GET"}, "405"), ({"method": "PUT"}, "405"),
                                        ({"content_type": "application/json"}, "415"),
                                        ({"content_type": None}, "415"),
                                        ({"content_type": "application/grpcx"}, "415")])
def test_a_request_that_is_not_a_grpc_call_gets_an_http_status_and_no_call(kw, status):
    c = Client()
    assert c.send(c.headers(1, end=True, **kw)) == []
    (kind, flags, sid, block), = c.frames()
    assert (kind, flags, sid, c.fields(block)) == (HEADERS, END_HEADERS | END_STREAM, 1, {":status": status})
    assert c.session.streams == {}
    # one still sending is also told to stop; its body is dropped
    assert c.send(c.headers(3, **kw) + frame(DATA, END_STREAM, 3, b"body")) == []
    out = c.frames()
    assert kinds(out) == [(HEADERS, END_HEADERS | END_STREAM, 3), (RST_STREAM, 0, 3)]
    assert c.fields(out[0][3]) == {":status": status}
    assert c.send(c.call(5, b"ok")) == [Started(5, PATH, (("x-api-key", KEY),), None), Message(5, b"ok"),
                                        HalfClosed(5)]


@pytest.mark.parametrize("content_type", ["application/grpc+proto", "application/grpc; charset=utf-8"])
def test_grpc_content_type_variants_are_calls(content_type):
    c = Client()
    assert [type(e) for e in c.send(c.call(1, b"", content_type=content_type))] == [Started, Message, HalfClosed]


# ------------------------------------------------------------------ messages the session refuses
def refusal(c: Client, sid: int, out) -> dict:
    """The trailers-only answer among `out` for `sid`."""
    (block,) = [p for k, f, s, p in out if k == HEADERS and s == sid and f & END_STREAM]
    fields = c.fields(block)
    assert fields[":status"] == "200" and fields["content-type"] == "application/grpc"
    return fields


def test_a_message_over_max_message_ends_its_call_resource_exhausted():
    c = Client()
    events = c.send(c.headers(1) + frame(DATA, 0, 1, b"\0" + struct.pack(">I", MAX_MESSAGE + 1) + b"x" * 100))
    why = f"Received message larger than max ({MAX_MESSAGE + 1} vs. {MAX_MESSAGE})"
    assert events == [Started(1, PATH, (("x-api-key", KEY),), None), Cancelled(1, why)]
    out = c.frames()
    assert refusal(c, 1, out) == {":status": "200", "content-type": "application/grpc", "grpc-status": "8",
                                  "grpc-message": why.replace("%", "%25")}
    assert (RST_STREAM, 0, 1, struct.pack(">I", NO_ERROR)) in out
    assert not any(k == WINDOW_UPDATE and s == 1 for k, _, s, _ in out)  # no window back for a call refused
    assert c.session.streams == {} and c.session.buffered == 0
    # the rest of it, in flight, is dropped; the connection goes on
    assert c.send(data_frames(1, b"y" * 100_000, end=True)) == []
    assert [type(e) for e in c.send(c.call(3, b"next"))] == [Started, Message, HalfClosed]


def test_a_message_of_exactly_max_message_is_taken():
    c = Client()
    body = b"m" * MAX_MESSAGE
    events = c.send(c.headers(1) + data_frames(1, grpc_message(body), end=True))
    assert [type(e) for e in events] == [Started, Message, HalfClosed] and events[1].body == body
    assert c.session.buffered == 0


@pytest.mark.parametrize("flag, code, why", [(1, "12", "compressed messages are not accepted"),
                                             (2, "13", "a message with a bad compression flag"),
                                             (0xFF, "13", "a message with a bad compression flag")])
def test_a_compressed_or_badly_flagged_message(flag, code, why):
    c = Client()
    events = c.send(c.headers(1) + frame(DATA, END_STREAM, 1, bytes((flag,)) + struct.pack(">I", 3) + b"abc"))
    assert [type(e) for e in events] == [Started, Cancelled] and events[1].why.startswith(why)
    fields = refusal(c, 1, c.frames())
    assert fields["grpc-status"] == code and fields["grpc-message"].startswith(why)
    assert c.session.streams == {} and c.session.buffered == 0


@pytest.mark.parametrize("tail", [b"\0\0\0", grpc_message(b"whole") + b"\0\0\0\0\x09abc"])
def test_a_request_that_ends_inside_a_message_is_internal(tail):
    c = Client()
    events = c.send(c.headers(1) + frame(DATA, END_STREAM, 1, tail))
    assert events[0] == Started(1, PATH, (("x-api-key", KEY),), None)
    assert events[-1] == Cancelled(1, "the request ended inside a message")
    assert HalfClosed(1) not in events
    out = c.frames()
    fields = refusal(c, 1, out)
    assert (fields["grpc-status"], fields["grpc-message"]) == ("13", "the request ended inside a message")
    assert not any(k == RST_STREAM for k, _, _, _ in out)  # the client had ended its side
    assert c.session.streams == {} and c.session.buffered == 0


def test_trailers_from_the_client_inside_a_message_are_internal_too():
    c = Client()
    c.send(c.headers(1) + frame(DATA, 0, 1, b"\0\0\0\0\x10half"))
    events = c.send(frame(HEADERS, END_HEADERS | END_STREAM, 1, c.encoder.encode([("x-t", "1")])))
    assert events == [Cancelled(1, "the request ended inside a message")]
    assert c.session.buffered == 0


def test_data_after_the_client_ended_its_side_is_an_error():
    c = Client()
    c.send(c.call(1, b"r"))  # half-closed, not answered yet
    with pytest.raises(ProtocolError, match="after the client ended"):
        c.send(frame(DATA, 0, 1, b"more"))


# ------------------------------------------------------------------ too many calls, resets
def test_calls_past_max_streams_are_refused_and_a_finished_one_frees_its_place():
    c = Client()
    opened = b"".join(c.headers(2 * i + 1) for i in range(MAX_STREAMS))
    events = c.send(opened)
    assert [e.stream_id for e in events] == [2 * i + 1 for i in range(MAX_STREAMS)]
    extra = 2 * MAX_STREAMS + 1
    assert c.send(c.headers(extra) + frame(DATA, END_STREAM, extra, grpc_message(b"dropped"))) == []
    assert c.frames() == [(RST_STREAM, 0, extra, struct.pack(">I", REFUSED_STREAM))]
    assert len(c.session.streams) == MAX_STREAMS and extra not in c.session.streams
    c.session.finish(1, 0)
    c.frames()
    assert c.send(c.headers(extra + 2)) == [Started(extra + 2, PATH, (("x-api-key", KEY),), None)]
    assert c.frames() == []


def test_a_reset_from_the_client_cancels_its_call():
    c = Client()
    c.send(c.headers(1) + frame(DATA, 0, 1, b"\0\0\0\0\x20partial") + c.headers(3))
    assert c.session.buffered == 12
    assert c.send(rst(1)) == [Cancelled(1, "the client cancelled the call")]
    assert c.send(rst(3, 0x2)) == [Cancelled(3, "the client reset the call (HTTP/2 error 2)")]
    assert c.session.streams == {} and c.session.buffered == 0
    assert not c.session.send_message(1, b"x") and not c.session.finish(3, 0)
    assert c.send(rst(1)) == []  # again: nothing more
    c.frames()
    assert c.frames() == []


def test_a_reset_of_an_answered_call_and_of_one_refused_is_no_event():
    c = Client()
    c.send(c.call(1, b""))
    c.session.finish(1, 0)
    assert c.send(rst(1)) == []
    c.send(c.headers(3, method="GET"))
    assert c.send(rst(3)) == []


def test_rapid_reset_costs_a_call_each_and_leaves_nothing_behind():
    c = Client()
    wire = b"".join(c.headers(2 * i + 1) + rst(2 * i + 1) for i in range(5000))
    events = c.send(wire)
    assert len(events) == 10_000 and sum(isinstance(e, Cancelled) for e in events) == 5000
    assert c.session.streams == {} and c.frames() == []
    assert [type(e) for e in c.send(c.call(10_001, b"after"))] == [Started, Message, HalfClosed]


# ------------------------------------------------------------------ floods
@pytest.mark.parametrize("name, one", [("PING", frame(PING, 0, 0, b"12345678")),
                                       ("PING ACK", frame(PING, ACK, 0, b"12345678")),
                                       ("SETTINGS", frame(SETTINGS, 0, 0)),
                                       ("empty SETTINGS ACK", frame(SETTINGS, ACK, 0)),
                                       ("WINDOW_UPDATE", window(0, 1)),
                                       ("unknown frame", frame(0x77, 0, 0, b"")),
                                       ("PRIORITY", frame(PRIORITY_FRAME, 0, 1, b"\0\0\0\0\x10"))])
def test_a_flood_of_frames_that_carry_nothing_ends_the_connection(name, one):
    c = Client()
    c.send(c.headers(1))  # a call starts the count again (the client's SETTINGS counted one)
    c.send(one * FLOOD)  # up to FLOOD in a row is allowed
    with pytest.raises(ProtocolError, match="a flood"):
        c.send(one)


def test_the_flood_count_is_of_frames_in_a_row():
    c = Client()
    ping = frame(PING, 0, 0, b"12345678")
    c.send(c.headers(1))
    for i in range(3):  # a call in between starts the count again
        c.send(ping * FLOOD + c.headers(2 * i + 3))
    c.send(c.headers(9) + ping * FLOOD)
    c.send(frame(DATA, 0, 9, b"\0"))  # message bytes count too
    c.send(ping * FLOOD)
    with pytest.raises(ProtocolError, match="a flood"):
        c.send(frame(DATA, 0, 9, b""))  # an empty DATA frame carries nothing


def test_empty_continuation_frames_are_a_flood():
    c = Client()
    block = c.block()
    c.send(frame(HEADERS, 0, 1, block[:3]))
    with pytest.raises(ProtocolError, match="a flood"):
        c.send(frame(CONTINUATION, 0, 1, b"") * (FLOOD + 1))


def test_headers_that_start_no_call_are_a_flood():
    c = Client()
    c.send(c.call(1, b""))
    c.session.finish(1, 0)
    # trailers on a call long over, again and again
    trailers = frame(HEADERS, END_HEADERS | END_STREAM, 1, c.encoder.encode([("x-t", "1")]))
    with pytest.raises(ProtocolError, match="a flood"):
        c.send(trailers * (FLOOD + 1))


def test_refused_calls_past_max_streams_are_a_flood():
    c = Client()
    c.send(b"".join(c.headers(2 * i + 1) for i in range(MAX_STREAMS)))
    first = 2 * MAX_STREAMS + 1
    with pytest.raises(ProtocolError, match="a flood"):
        c.send(b"".join(c.headers(first + 2 * i) for i in range(FLOOD + 1)))


def test_a_ping_is_answered_with_its_ack_and_an_ack_is_not():
    c = Client()
    assert c.send(frame(PING, 0, 0, b"abcdefgh") + frame(PING, ACK, 0, b"zzzzzzzz")) == []
    assert c.frames() == [(PING, ACK, 0, b"abcdefgh")]


# ------------------------------------------------------------------ header blocks
def test_a_header_block_split_over_continuation_frames():
    c = Client()
    block = c.block(extra=(("x-long", "v" * 3000),))
    pieces = [block[:5], block[5:1000], block[1000:]]
    wire = (frame(HEADERS, 0, 1, pieces[0]) + frame(CONTINUATION, 0, 1, pieces[1])
            + frame(CONTINUATION, END_HEADERS, 1, pieces[2]) + frame(DATA, END_STREAM, 1, grpc_message(b"q")))
    events = c.send(wire[:20])  # cut inside the second frame
    assert events == []
    events = c.send(wire[20:])
    assert events == [Started(1, PATH, (("x-api-key", KEY), ("x-long", "v" * 3000)), None), Message(1, b"q"),
                      HalfClosed(1)]
    # with END_STREAM on the HEADERS frame that starts the block
    block = c.block()
    events = c.send(frame(HEADERS, END_STREAM, 3, block[:4]) + frame(CONTINUATION, END_HEADERS, 3, block[4:]))
    assert events == [Started(3, PATH, (("x-api-key", KEY),), None), HalfClosed(3)]


@pytest.mark.parametrize("between", [frame(PING, 0, 0, b"12345678"), frame(DATA, 0, 1, b"x"),
                                     frame(HEADERS, END_HEADERS, 3, b"\x82"), frame(CONTINUATION, END_HEADERS, 3, b"")])
def test_an_interrupted_header_block_is_an_error(between):
    c = Client()
    block = c.block()
    with pytest.raises(ProtocolError, match="interrupted|without its HEADERS"):
        c.send(frame(HEADERS, 0, 1, block[:4]) + between + frame(CONTINUATION, END_HEADERS, 1, block[4:]))


def test_a_header_block_over_max_header_list_is_an_error():
    c = Client()
    block = c.block(extra=(("x-big", "v" * 20_000),))
    assert len(block) > MAX_FRAME
    wire = frame(HEADERS, 0, 1, block[:MAX_FRAME]) + frame(CONTINUATION, END_HEADERS, 1, block[MAX_FRAME:])
    with pytest.raises(ProtocolError, match="header block over"):
        c.send(wire)
    # decoded past the limit though its bytes are under it (Huffman): hpack's own cap
    c = Client()
    block = c.block(extra=tuple((f"x-{i}", "a" * 200) for i in range(90)))
    assert len(block) < MAX_FRAME
    with pytest.raises(ProtocolError, match="does not decode: OversizedHeaderListError"):
        c.send(frame(HEADERS, END_HEADERS, 1, block))


# ------------------------------------------------------------------ flow control, both ways
def test_an_answer_waits_for_the_clients_small_window_and_its_trailers_after_it():
    c = Client(struct.pack(">HI", S_INITIAL_WINDOW, 10))
    c.send(c.call(1, b"r"))
    c.frames()
    body = bytes(range(100))
    wire = grpc_message(body)
    assert c.session.send_message(1, body) and c.session.finish(1, 0)
    out = c.frames()
    assert kinds(out) == [(HEADERS, END_HEADERS, 1), (DATA, 0, 1)] and out[1][3] == wire[:10]
    assert c.session.send_message(1, b"more") is False  # finished: nothing more is taken
    assert c.send(window(1, 50)) == []
    assert c.frames() == [(DATA, 0, 1, wire[10:60])]
    assert c.send(window(1, 40)) == []
    assert c.frames() == [(DATA, 0, 1, wire[60:100])]
    assert c.send(window(1, 1000)) == []
    out = c.frames()
    assert kinds(out) == [(DATA, 0, 1), (HEADERS, END_HEADERS | END_STREAM, 1)] and out[0][3] == wire[100:]
    assert c.fields(out[1][3]) == {"grpc-status": "0"} and c.session.streams == {}


def test_the_connection_window_holds_every_call_and_settings_widen_a_call():
    c = Client(struct.pack(">HI", S_INITIAL_WINDOW, 1 << 20))
    c.send(c.call(1, b"") + c.call(3, b""))
    c.frames()
    big = b"b" * 70_000
    c.session.send_message(1, big)
    c.session.finish(1, 0)
    c.session.send_message(3, b"small")
    c.session.finish(3, 0)
    out = c.frames()
    sent = [p for k, _, s, p in out if k == DATA]
    assert sum(map(len, sent)) == 65535 and max(map(len, sent)) <= MAX_FRAME  # the connection's 64 KiB
    assert not any(k == HEADERS and f & END_STREAM for k, f, _, _ in out)
    assert c.send(window(0, 100_000)) == []
    rest = c.frames()
    blocks, data = answer_frames(c, out + rest)
    assert data == grpc_message(big) + grpc_message(b"small")
    sids = [s for k, _, s, _ in out + rest if k == HEADERS]
    assert [(sid, b.get("grpc-status")) for sid, b in zip(sids, blocks, strict=True)] == \
        [(1, None), (3, None), (1, "0"), (3, "0")]
    # a window made smaller by SETTINGS goes below zero, then opens again
    c = Client(struct.pack(">HI", S_INITIAL_WINDOW, 100))
    c.send(c.call(1, b""))
    c.frames()
    c.session.send_message(1, b"z" * 200)
    assert sum(len(p) for k, _, _, p in c.frames() if k == DATA) == 100
    c.send(frame(SETTINGS, 0, 0, struct.pack(">HI", S_INITIAL_WINDOW, 50)))  # now -50
    assert c.frames() == [(SETTINGS, ACK, 0, b"")]
    c.send(window(1, 40))
    assert c.frames() == []
    c.send(frame(SETTINGS, 0, 0, struct.pack(">HI", S_INITIAL_WINDOW, 300)))  # +250: 240
    out = c.frames()
    assert [(k, len(p)) for k, _, _, p in out] == [(SETTINGS, 0), (DATA, 105)]


def test_a_bad_window_update_for_a_call_resets_it():
    c = Client()
    c.send(c.headers(1) + c.headers(3))
    assert c.send(window(1, 0)) == [Cancelled(1, "a bad WINDOW_UPDATE for the call")]
    assert c.send(window(3, (1 << 31) - 1)) == [Cancelled(3, "a bad WINDOW_UPDATE for the call")]
    assert c.frames() == [(RST_STREAM, 0, 1, struct.pack(">I", FLOW_CONTROL_ERROR)),
                          (RST_STREAM, 0, 3, struct.pack(">I", FLOW_CONTROL_ERROR))]
    assert c.send(window(5, 10)) == []  # a call we do not know: ignored


def test_data_past_the_connection_window_is_an_error():
    c = Client()
    c.send(c.call(1, b""))
    c.session.finish(1, 0)  # the call is over: what the client sends on it counts, and is dropped
    c.frames()
    eight = data_frames(1, b"d" * (h2server.CONNECTION_WINDOW // 2))
    assert c.send(eight) == []
    grant, = [p for k, _, s, p in c.frames() if k == WINDOW_UPDATE and s == 0]  # half used: given back
    assert int.from_bytes(grant, "big") == h2server.CONNECTION_WINDOW // 2 + len(grpc_message(b""))
    assert c.send(eight + eight) == []  # all of the window in one go
    assert [int.from_bytes(p, "big") for k, _, s, p in c.frames() if k == WINDOW_UPDATE and s == 0] == \
        [h2server.CONNECTION_WINDOW]
    with pytest.raises(ProtocolError, match="past the connection's window"):
        c.send(eight + eight + frame(DATA, 0, 1, b"d"))  # a byte more than it before we could give it back


def test_data_past_a_calls_window_resets_the_call():
    c = Client(struct.pack(">HI", S_INITIAL_WINDOW, 0))  # our answer waits: the call stays, finished
    c.send(c.headers(1) + frame(DATA, 0, 1, grpc_message(b"r")))
    c.session.send_message(1, b"answer")
    c.session.finish(1, 0)
    c.frames()
    assert 1 in c.session.streams
    assert c.send(data_frames(1, b"x" * (STREAM_WINDOW - 10))) == []  # no window back: the call is over
    assert c.frames() == []
    assert c.send(frame(DATA, 0, 1, b"x" * 11)) == [Cancelled(1, "DATA past the call's window")]
    assert c.frames() == [(RST_STREAM, 0, 1, struct.pack(">I", FLOW_CONTROL_ERROR))]
    assert c.session.streams == {}


def test_max_buffered_bounds_unfinished_messages_over_all_calls():
    c = Client()
    each = MAX_MESSAGE - 200_000  # under MAX_MESSAGE: each call alone is fine
    prefix = b"\0" + struct.pack(">I", MAX_MESSAGE)
    calls = MAX_BUFFERED // each + 1
    for i in range(calls - 1):
        sid = 2 * i + 1
        assert [type(e) for e in c.send(c.headers(sid) + data_frames(sid, prefix + b"p" * (each - 5)))] == [Started]
        c.frames()  # window updates come back: the client is not over any window
    assert c.session.buffered == (calls - 1) * each
    sid = 2 * calls - 1
    with pytest.raises(ProtocolError, match=f"over {MAX_BUFFERED} bytes of unfinished messages"):
        c.send(c.headers(sid) + data_frames(sid, prefix + b"p" * (each - 5)))


def test_buffered_bytes_are_given_back_by_every_way_a_call_ends():
    c = Client()
    half = b"\0\0\0\1\0" + b"h" * 100
    c.send(c.headers(1) + frame(DATA, 0, 1, half) + c.headers(3) + frame(DATA, 0, 3, half)
           + c.headers(5) + frame(DATA, 0, 5, half) + c.headers(7) + frame(DATA, 0, 7, half))
    assert c.session.buffered == 4 * 105
    c.send(rst(1))  # the client resets
    c.session.reset(3)  # we reset
    c.session.finish(5, 13, "stop")  # we answer while it sends
    assert c.session.buffered == 105
    c.send(frame(DATA, END_STREAM, 7, b"h" * (256 - 100)))  # the rest
    assert c.session.buffered == 0 and c.session.streams == {7: c.session.streams[7]}


def test_answer_bytes_waiting_for_windows_are_held_until_sent_or_dropped():
    c = Client(struct.pack(">HI", S_INITIAL_WINDOW, 10))
    c.send(c.call(1, b"") + c.call(3, b"") + c.call(5, b""))
    assert c.session.send_message(1, b"a" * 100) and c.session.held(1) == 95  # 105 bytes, 10 of them sent
    assert c.session.send_message(1, b"a" * 10) and c.session.held(1) == 95 + 15
    assert c.session.send_message(3, b"b" * 50) and c.session.held(3) == 45
    assert c.session.send_message(5, b"c" * 20) and c.session.held(5) == 15
    c.send(window(1, 50))
    assert (c.session.held(1), c.session.held(3)) == (60, 45)
    c.session.reset(3)  # we abandon it
    c.send(rst(1))  # the client does
    assert c.session.held(1) == c.session.held(3) == 0 and c.session.held(99) == 0
    c.session.finish(5, 0)
    assert c.session.held(5) == 15
    c.send(window(5, 100))
    assert c.session.held(5) == 0 and c.session.streams == {}
    kinds_5 = [(k, f) for k, f, s, _ in c.frames() if s == 5]
    assert kinds_5[-2:] == [(DATA, 0), (HEADERS, END_HEADERS | END_STREAM)]
