"""The server's side of one HTTP/2 connection carrying gRPC calls, sans-I/O.

Contract:
- `receive(data)` takes bytes from the client and returns what they mean for calls, in order: `Started`
  (a call's headers: its path and metadata), `Message` (one whole request message), `HalfClosed` (the
  client sent all it will), `Cancelled` (the client reset the call). `data_to_send()` is what to write.
- Answers: `send_message(sid, body)` (the response headers go first, once), `finish(sid, code, details)`
  (trailers, or a trailers-only answer when nothing was sent), `reset(sid)`. A finished call whose client
  has not half-closed is reset with NO_ERROR after its trailers, as gRPC servers do.
- Flow control both ways: answers wait for the client's windows (`held(sid)`: a call's bytes waiting, for
  the owner to bound); the client gets its windows back as it sends, up to MAX_MESSAGE per message in
  progress.
- What the client does wrong costs it a call or the connection, never more than the bounds here: a
  request that is not gRPC (method, content type) is answered with an HTTP status; a message over
  MAX_MESSAGE ends its call RESOURCE_EXHAUSTED; a compressed one UNIMPLEMENTED; a call past
  MAX_STREAMS open ones is refused (REFUSED_STREAM, safe to send again). Broken framing, a header block
  that does not decode or is over MAX_HEADER_LIST, more than MAX_BUFFERED bytes of unfinished messages,
  a flood of frames that start and carry nothing (FLOOD in a row): `ProtocolError`, and the owner ends
  the connection with `goaway(...)`.
"""

from __future__ import annotations

import base64
import collections
import struct
from dataclasses import dataclass

from supervisor.proto.h2 import (
    ACK,
    CONTINUATION,
    DATA,
    END_HEADERS,
    END_STREAM,
    FLOW_CONTROL_ERROR,
    GOAWAY,
    HEADERS,
    MAX_FRAME,
    MAX_WINDOW,
    NO_ERROR,
    PING,
    PREFACE,
    PRIORITY,
    PRIORITY_FRAME,
    PUSH_PROMISE,
    REFUSED_STREAM,
    RST_STREAM,
    S_INITIAL_WINDOW,
    S_MAX_CONCURRENT,
    S_MAX_FRAME,
    S_MAX_HEADER_LIST,
    SETTINGS,
    WINDOW_UPDATE,
    BlockDecoder,
    ProtocolError,
    frame,
    grpc_message,
    literal,
    settings,
    split,
    unpad,
)

MAX_STREAMS = 200  # open calls per connection (SETTINGS_MAX_CONCURRENT_STREAMS)
MAX_MESSAGE = 4 * 1024 * 1024  # one request message
MAX_HEADER_LIST = 16 * 1024  # a call's headers, decoded
MAX_DETAILS = 4096  # bytes of a percent-encoded grpc-message: the trailers fit one frame
MAX_BUFFERED = 32 * 1024 * 1024  # bytes of unfinished request messages held for one connection
STREAM_WINDOW = 1024 * 1024  # what a client may send on a call before we widen its window
CONNECTION_WINDOW = 16 * 1024 * 1024
FLOOD = 10_000  # frames in a row that start no call and carry no message bytes
OK, UNKNOWN, RESOURCE_EXHAUSTED, UNIMPLEMENTED, INTERNAL = 0, 2, 8, 12, 13

_RESPONSE_HEAD = b"\x88" + literal(31, b"application/grpc")  # :status 200 (static index 8), content-type
_OK_TRAILERS = literal(b"grpc-status", b"0")
_SAFE = frozenset(range(0x20, 0x7F)) - {ord("%")}


@dataclass
class Started:
    stream_id: int
    path: str
    metadata: tuple[tuple[str, str | bytes], ...]  # (lower-case name, value); `-bin` values as bytes
    timeout: float | None  # seconds from grpc-timeout, None without one


@dataclass
class Message:
    stream_id: int
    body: bytes  # one serialized request (the 5-byte prefix taken off)


@dataclass
class HalfClosed:
    stream_id: int


@dataclass
class Cancelled:
    stream_id: int
    why: str


Event = Started | Message | HalfClosed | Cancelled


class _Stream:
    __slots__ = ("sid", "buf", "recv_window", "send_window", "out", "trailers", "headers_sent", "remote_closed",
                 "finished", "grpc")

    def __init__(self, sid: int, send_window: int, grpc: bool):
        self.sid = sid
        self.buf = bytearray()  # request bytes not yet a whole message
        self.recv_window = STREAM_WINDOW
        self.send_window = send_window
        self.out = bytearray()  # answer DATA waiting for window
        self.trailers: bytes | None = None  # to send once `out` is gone
        self.headers_sent = False
        self.remote_closed = False
        self.finished = False  # we queued the trailers: nothing more from us
        self.grpc = grpc  # False: answered with an HTTP status, the rest of it is ignored


def percent_encode(text: str) -> bytes:
    """grpc-message: UTF-8, every byte outside printable ASCII (and '%') as %XX."""
    return b"".join(bytes((b,)) if b in _SAFE else b"%%%02X" % b for b in text.encode("utf-8", "replace"))


def cut_encoded(text: bytes, limit: int) -> bytes:
    """A percent-encoded text cut to at most `limit` bytes, never inside a %XX escape."""
    if len(text) <= limit:
        return text
    cut = text[:limit]
    tail = cut.rfind(b"%", max(0, limit - 2))
    return cut[:tail] if tail != -1 else cut


def parse_timeout(value: bytes) -> float | None:
    """grpc-timeout (1-8 digits and a unit) in seconds; None when absent or malformed."""
    if not 2 <= len(value) <= 9 or not value[:-1].isdigit():
        return None
    scale = {b"H": 3600.0, b"M": 60.0, b"S": 1.0, b"m": 1e-3, b"u": 1e-6, b"n": 1e-9}.get(value[-1:])
    return None if scale is None else int(value[:-1]) * scale


def _binary(value: bytes) -> bytes:
    """A `-bin` header's value: base64, padded or not (as gRPC sends it); undecodable bytes are kept as they came."""
    try:
        return base64.b64decode(value + b"=" * (-len(value) % 4), validate=True)
    except ValueError:
        return value


def call_headers(headers: list) -> tuple[bytes | None, str, bytes | None, float | None, tuple]:
    """A call's decoded headers -> (:method, :path ('' when absent), content-type, timeout, metadata)."""
    method = path = content_type = None
    timeout = None
    metadata = []
    for name, value in headers:
        if name.startswith(b":"):
            if name == b":method":
                method = value
            elif name == b":path":
                path = value
        elif name == b"content-type":
            content_type = value
        elif name == b"grpc-timeout":
            timeout = parse_timeout(value)
        elif name not in (b"te", b"grpc-encoding", b"grpc-accept-encoding"):
            key = name.decode("latin-1").lower()
            metadata.append((key, _binary(value) if key.endswith("-bin") else value.decode("utf-8", "replace")))
    return method, (path or b"").decode("latin-1"), content_type, timeout, tuple(metadata)


class ServerSession:
    """One server HTTP/2 connection carrying gRPC calls (see the module docstring)."""

    def __init__(self) -> None:
        self.out = bytearray(frame(SETTINGS, 0, 0, struct.pack(">HIHIHI", S_MAX_CONCURRENT, MAX_STREAMS,
                                                                S_INITIAL_WINDOW, STREAM_WINDOW,
                                                                S_MAX_HEADER_LIST, MAX_HEADER_LIST)))
        self.out += frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", CONNECTION_WINDOW - 65535))
        self.decoder = BlockDecoder(MAX_HEADER_LIST, call_headers)
        self.streams: dict[int, _Stream] = {}
        self.waiting: collections.deque[int] = collections.deque()  # streams with answer bytes held by a window
        self.preface = False
        self.buf = bytearray()
        self.last_id = 0  # the highest stream id the client opened
        self.send_window = 65535
        self.initial_window = 65535  # the client's window for each stream
        self.max_frame = MAX_FRAME
        self.recv_window = CONNECTION_WINDOW
        self.unacked = 0
        self.buffered = 0  # bytes of unfinished messages over all streams
        self.idle_frames = 0
        self.client_goaway = False
        self._headers: tuple[int, int, bytearray] | None = None

    # ---------------------------------------------------------------- receiving
    def receive(self, data: bytes) -> list[Event]:
        """Bytes from the client -> events. Raises ProtocolError."""
        buf = bytes(self.buf) + data if self.buf else data
        pos = 0
        if not self.preface:
            if len(buf) < len(PREFACE):
                if not PREFACE.startswith(buf):
                    raise ProtocolError("not an HTTP/2 client (no connection preface)")
                self.buf = bytearray(buf)
                return []
            if not buf.startswith(PREFACE):
                raise ProtocolError("not an HTTP/2 client (no connection preface)")
            self.preface, pos = True, len(PREFACE)
        events: list[Event] = []
        frames, pos = split(buf, pos)
        for kind, flags, sid, payload in frames:
            if self._headers is not None and kind != CONTINUATION:
                raise ProtocolError("a header block was interrupted")
            before = len(events)
            handler = _HANDLERS.get(kind)
            useful = handler(self, flags, sid, payload, events) if handler is not None else False
            if useful or len(events) > before:
                self.idle_frames = 0
            else:
                self.idle_frames += 1
                if self.idle_frames > FLOOD:
                    raise ProtocolError(f"over {FLOOD} frames in a row that carry no call (a flood)")
        self.buf = bytearray(buf[pos:]) if pos < len(buf) else bytearray()
        if self.unacked >= CONNECTION_WINDOW // 2:
            self.out += frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", self.unacked))
            self.recv_window += self.unacked
            self.unacked = 0
        return events

    def _on_headers(self, flags: int, sid: int, payload: bytes, events: list) -> bool:
        if not sid or not sid & 1:
            raise ProtocolError("HEADERS on stream 0 or an even stream")
        payload = unpad(flags, payload)
        if flags & PRIORITY:
            payload = payload[5:]
        if flags & END_HEADERS:
            self._header_block(sid, flags, payload, events)
        else:
            self._headers = (sid, flags, bytearray(payload))
        return False  # a block counts by its events: one that starts no call (refused, trailers) carries nothing

    def _on_continuation(self, flags: int, sid: int, payload: bytes, events: list) -> bool:
        if self._headers is None or self._headers[0] != sid:
            raise ProtocolError("CONTINUATION without its HEADERS")
        block = self._headers[2]
        block += payload
        if len(block) > MAX_HEADER_LIST:
            raise ProtocolError(f"a header block over {MAX_HEADER_LIST} bytes")
        if flags & END_HEADERS:
            hsid, hflags, _ = self._headers
            self._headers = None
            self._header_block(hsid, hflags, bytes(block), events)
        return False  # as HEADERS: empty CONTINUATION frames are a flood

    def _header_block(self, sid: int, flags: int, block: bytes, events: list) -> None:
        # always decoded (the table must stay in step with the client's); a block that repeats (a client's
        # calls of one method do, byte for byte) is read once
        method, path, content_type, timeout, metadata = self.decoder.decode(block)
        stream = self.streams.get(sid)
        if stream is not None or sid <= self.last_id:  # trailers from the client (gRPC clients send none)
            if stream is not None and flags & END_STREAM:
                self._remote_end(stream, events)
            return
        self.last_id = sid
        if self.client_goaway:
            raise ProtocolError("a new stream after the client's GOAWAY")
        if len(self.streams) >= MAX_STREAMS:
            self.out += frame(RST_STREAM, 0, sid, struct.pack(">I", REFUSED_STREAM))
            return
        stream = self.streams[sid] = _Stream(sid, self.initial_window, grpc=True)
        if flags & END_STREAM:
            stream.remote_closed = True
        if method != b"POST":
            self._http_answer(stream, b"405")
            return
        if content_type is None or not (content_type == b"application/grpc"
                                        or content_type.startswith((b"application/grpc+", b"application/grpc;"))):
            self._http_answer(stream, b"415")
            return
        events.append(Started(sid, path, metadata, timeout))
        if stream.remote_closed:
            events.append(HalfClosed(sid))

    def _http_answer(self, stream: _Stream, status: bytes) -> None:
        """Not a gRPC call: an HTTP status, nothing else."""
        stream.grpc = False
        self.out += frame(HEADERS, END_HEADERS | END_STREAM, stream.sid, literal(8, status))
        stream.finished = stream.headers_sent = True
        self._closed_locally(stream)

    def _on_data(self, flags: int, sid: int, payload: bytes, events: list) -> bool:
        size = len(payload)
        self.recv_window -= size
        if self.recv_window < 0:
            raise ProtocolError("DATA past the connection's window")
        self.unacked += size
        stream = self.streams.get(sid)
        if stream is None:
            if sid > self.last_id or not sid:
                raise ProtocolError("DATA on a stream that was never opened")
            return size > 0  # a call already over: its bytes are dropped (the window counted them)
        if stream.remote_closed:
            raise ProtocolError("DATA after the client ended its side of the call")
        stream.recv_window -= size
        if stream.recv_window < 0:
            self._stream_error(stream, FLOW_CONTROL_ERROR, events, "DATA past the call's window")
            return True
        body = unpad(flags, payload)
        if stream.grpc and not stream.finished:
            stream.buf += body
            self.buffered += len(body)
            if self.buffered > MAX_BUFFERED:
                raise ProtocolError(f"over {MAX_BUFFERED} bytes of unfinished messages")
            self._messages(stream, events)
        if size and not stream.finished and not flags & END_STREAM:  # the window back at once: a message may be
            # up to MAX_MESSAGE (not after the client's last DATA: nothing more will come)
            self.out += frame(WINDOW_UPDATE, 0, sid, struct.pack(">I", size))
            stream.recv_window += size
        if flags & END_STREAM:
            self._remote_end(stream, events)
        return size > 0

    def _messages(self, stream: _Stream, events: list) -> None:
        buf = stream.buf
        while len(buf) >= 5 and not stream.finished:
            length = int.from_bytes(buf[1:5], "big")
            if buf[0] not in (0, 1):
                self.buffered -= len(buf)
                buf.clear()
                self._refuse(stream, INTERNAL, "a message with a bad compression flag", events)
                return
            if length > MAX_MESSAGE:
                self.buffered -= len(buf)
                buf.clear()
                self._refuse(stream, RESOURCE_EXHAUSTED,
                             f"Received message larger than max ({length} vs. {MAX_MESSAGE})", events)
                return
            if len(buf) < 5 + length:
                return
            if buf[0] == 1:
                self.buffered -= len(buf)
                buf.clear()
                self._refuse(stream, UNIMPLEMENTED, "compressed messages are not accepted (send grpc-encoding "
                             "identity)", events)
                return
            events.append(Message(stream.sid, bytes(buf[5:5 + length])))
            del buf[:5 + length]
            self.buffered -= 5 + length

    def _refuse(self, stream: _Stream, code: int, why: str, events: list) -> None:
        """End a call over what its client sent; the owner hears it as Cancelled."""
        self.finish(stream.sid, code, why)
        events.append(Cancelled(stream.sid, why))

    def _remote_end(self, stream: _Stream, events: list) -> None:
        stream.remote_closed = True
        if stream.buf and not stream.finished:
            self.buffered -= len(stream.buf)
            stream.buf.clear()
            self._refuse(stream, INTERNAL, "the request ended inside a message", events)
        elif stream.grpc and not stream.finished:
            events.append(HalfClosed(stream.sid))
        self._forget_if_done(stream)

    def _stream_error(self, stream: _Stream, code: int, events: list, why: str) -> None:
        self.out += frame(RST_STREAM, 0, stream.sid, struct.pack(">I", code))
        self._drop(stream)
        events.append(Cancelled(stream.sid, why))

    def _on_reset(self, flags: int, sid: int, payload: bytes, events: list) -> bool:
        if len(payload) != 4 or not sid:
            raise ProtocolError("a RST_STREAM of the wrong size or on stream 0")
        if sid > self.last_id:
            raise ProtocolError("RST_STREAM on a stream that was never opened")
        stream = self.streams.get(sid)
        if stream is not None:
            self._drop(stream)
            if stream.grpc and not stream.finished:
                code = int.from_bytes(payload, "big")
                events.append(Cancelled(sid, "the client cancelled the call" if code == 0x8 else
                                        f"the client reset the call (HTTP/2 error {code})"))
        return False

    def _on_settings(self, flags: int, sid: int, payload: bytes, events: list) -> bool:
        if sid:
            raise ProtocolError("SETTINGS on a stream")
        if flags & ACK:
            if payload:
                raise ProtocolError("a SETTINGS ACK with a payload")
            return False
        for key, value in settings(payload):
            if key == S_INITIAL_WINDOW:
                delta, self.initial_window = value - self.initial_window, value
                for stream in self.streams.values():
                    stream.send_window += delta
            elif key == S_MAX_FRAME:
                self.max_frame = value
        self.out += frame(SETTINGS, ACK, 0)
        self._send_data()
        return False

    def _on_ping(self, flags: int, sid: int, payload: bytes, events: list) -> bool:
        if len(payload) != 8 or sid:
            raise ProtocolError("a PING of the wrong size or on a stream")
        if not flags & ACK:
            self.out += frame(PING, ACK, 0, payload)
        return False

    def _on_window(self, flags: int, sid: int, payload: bytes, events: list) -> bool:
        if len(payload) != 4:
            raise ProtocolError("a WINDOW_UPDATE of the wrong size")
        grant = int.from_bytes(payload, "big") & 0x7FFFFFFF
        if sid == 0:
            if not grant:
                raise ProtocolError("a WINDOW_UPDATE of 0 for the connection")
            self.send_window += grant
            if self.send_window > MAX_WINDOW:
                raise ProtocolError("a WINDOW_UPDATE past the largest window")
        else:
            stream = self.streams.get(sid)
            if stream is not None:
                stream.send_window += grant
                if not grant or stream.send_window > MAX_WINDOW:
                    self._stream_error(stream, FLOW_CONTROL_ERROR, events, "a bad WINDOW_UPDATE for the call")
                    return False
        self._send_data()
        return False

    def _on_priority(self, flags: int, sid: int, payload: bytes, events: list) -> bool:
        if len(payload) != 5 or not sid:
            raise ProtocolError("a PRIORITY frame of the wrong size or on stream 0")
        return False

    def _on_push(self, flags: int, sid: int, payload: bytes, events: list) -> bool:
        raise ProtocolError("a client may not push")

    def _on_goaway(self, flags: int, sid: int, payload: bytes, events: list) -> bool:
        self.client_goaway = True  # its open calls go on; it starts no new one
        return False

    # ------------------------------------------------------------------ sending
    def send_message(self, sid: int, body: bytes) -> bool:
        """Queue one answer message; False when the call is gone (reset, finished)."""
        stream = self.streams.get(sid)
        if stream is None or stream.finished:
            return False
        if not stream.headers_sent:
            stream.headers_sent = True
            self.out += frame(HEADERS, END_HEADERS, sid, _RESPONSE_HEAD)
        self.idle_frames = 0  # a connection being answered is no flood (keepalive pings around a stream)
        stream.out += grpc_message(body)
        self._queue(stream)
        return True

    def finish(self, sid: int, code: int, details: str = "") -> bool:
        """End the call with this status (trailers after the messages queued); False when it is gone."""
        stream = self.streams.get(sid)
        if stream is None or stream.finished:
            return False
        stream.finished = True
        block = literal(b"grpc-status", str(code).encode()) if code else _OK_TRAILERS
        if details:
            block += literal(b"grpc-message", cut_encoded(percent_encode(details), MAX_DETAILS))
        if not stream.headers_sent:  # trailers-only
            stream.headers_sent = True
            self.out += frame(HEADERS, END_HEADERS | END_STREAM, sid, _RESPONSE_HEAD + block)
            self._closed_locally(stream)
            return True
        stream.trailers = block
        self._queue(stream)
        return True

    def reset(self, sid: int, code: int = 0x8) -> None:
        """Abandon the call (CANCEL unless told): the client is told, nothing more is sent on it."""
        stream = self.streams.get(sid)
        if stream is not None:
            self.out += frame(RST_STREAM, 0, sid, struct.pack(">I", code))
            self._drop(stream)

    def goaway(self, code: int = NO_ERROR, text: str = "") -> None:
        """Tell the client no new call will be taken (the calls it opened so far still run)."""
        self.out += frame(GOAWAY, 0, 0, struct.pack(">II", self.last_id, code) + text.encode()[:256])

    def held(self, sid: int) -> int:
        """Answer bytes of the call waiting for the client's windows (0 once it is gone)."""
        stream = self.streams.get(sid)
        return 0 if stream is None else len(stream.out)

    def data_to_send(self) -> bytes:
        out, self.out = bytes(self.out), bytearray()
        return out

    def _queue(self, stream: _Stream) -> None:
        if stream.sid not in self.waiting:
            self.waiting.append(stream.sid)
        self._send_data()

    def _send_data(self) -> None:
        """Answer bytes as far as the windows allow, each call's in order, calls in turn."""
        for _ in range(len(self.waiting)):
            sid = self.waiting.popleft()
            stream = self.streams.get(sid)
            if stream is None:
                continue
            while stream.out:
                room = min(self.send_window, stream.send_window, self.max_frame, len(stream.out))
                if room <= 0:
                    break
                self.out += frame(DATA, 0, sid, bytes(stream.out[:room]))
                del stream.out[:room]
                self.send_window -= room
                stream.send_window -= room
            if stream.out:
                self.waiting.append(sid)
                continue
            if stream.trailers is not None:
                self.out += frame(HEADERS, END_HEADERS | END_STREAM, sid, stream.trailers)
                stream.trailers = None
                self._closed_locally(stream)

    def _closed_locally(self, stream: _Stream) -> None:
        if not stream.remote_closed:  # the client is still sending: it is told to stop
            self.out += frame(RST_STREAM, 0, stream.sid, struct.pack(">I", NO_ERROR))
        self._drop(stream)

    def _forget_if_done(self, stream: _Stream) -> None:
        if stream.finished and stream.trailers is None and not stream.out:
            self._drop(stream)

    def _drop(self, stream: _Stream) -> None:
        if self.streams.pop(stream.sid, None) is not None and stream.buf:
            self.buffered -= len(stream.buf)
            stream.buf.clear()


_HANDLERS = {DATA: ServerSession._on_data, HEADERS: ServerSession._on_headers,
             CONTINUATION: ServerSession._on_continuation, SETTINGS: ServerSession._on_settings,
             PING: ServerSession._on_ping, WINDOW_UPDATE: ServerSession._on_window, RST_STREAM: ServerSession._on_reset,
             PRIORITY_FRAME: ServerSession._on_priority, PUSH_PROMISE: ServerSession._on_push,
             GOAWAY: ServerSession._on_goaway}
