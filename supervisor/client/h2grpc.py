"""Unary gRPC over one HTTP/2 connection, driven by the parent's select loop (no thread, no grpcio).

grpcio costs the parent 150-400 us of CPU per unary call (its completion-queue thread, the future and its
callback, the GIL passed back and forth); this client writes the frames itself on a non-blocking socket the
loop watches, as `loophttp` does for REST, and costs about a tenth of that. It speaks only what a unary call
needs:

- `H2Session` is sans-I/O: `start(path, message)` queues one call's HEADERS + DATA and returns its stream
  id; `receive(data)` takes bytes from the socket and returns the calls it finished as `Answer`s;
  `data_to_send()` is what to write next. It answers SETTINGS and PING, honours the peer's flow-control
  windows, frame size and concurrent-stream limit (calls beyond it wait), replenishes its own receive
  window, and on GOAWAY finishes the calls the server will not process as UNAVAILABLE ("not processed":
  safe to send again) while the others complete.
- Request headers are encoded without the dynamic table (so every call's block is the same bytes, built
  once per method); the API key is a never-indexed literal. Answers are decoded by `supervisor.proto.h2`'s
  BlockDecoder (hpack, with a cap on a header list's size).
- Anything the peer does wrong (garbage, an oversized frame or header list, a header block that does not
  decode or is interrupted, a pushed stream we refused, bad SETTINGS or window sizes, a flood of frames that
  finish no call, more unread output than MAX_UNSENT because it stopped reading) raises `ProtocolError`:
  the connection is dropped and every call on it answers UNAVAILABLE. A message over MAX_MESSAGE, a
  compressed or malformed message, or an answer without a grpc-status ends its call with INTERNAL; an
  HTTP error status with UNAVAILABLE (502-504) or UNKNOWN.
- A connection that was told GOAWAY, or has used up its stream ids, takes no new call: `H2Client.spent()`
  tells its owner to open another one while the calls still out on it finish.
"""

from __future__ import annotations

import collections
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

from supervisor.proto.h2 import (  # noqa: F401  (re-exported: the tests and the scripted peers build frames with them)
    ACK,
    CONTINUATION,
    DATA,
    END_HEADERS,
    END_STREAM,
    GOAWAY,
    HEAD,
    HEADERS,
    LAST_STREAM_ID,
    MAX_FRAME,
    MAX_WINDOW,
    PADDED,
    PING,
    PREFACE,
    PRIORITY,
    PUSH_PROMISE,
    RST_STREAM,
    S_HEADER_TABLE_SIZE,
    S_INITIAL_WINDOW,
    S_MAX_CONCURRENT,
    S_MAX_FRAME,
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

OUR_WINDOW = 16 * 1024 * 1024  # per stream and for the connection: more than any answer we accept
MAX_MESSAGE = 4 * 1024 * 1024
MAX_HEADER_LIST = 64 * 1024
MAX_UNSENT = 16 * 1024 * 1024  # bytes held for a peer that stopped reading before we give up
FLOOD = 1_000  # frames in a row that finish no call (pings, settings, empty data...) before we give up: a
# read of 256 KiB can hold 15,000 tiny frames, and handling 10,000 of them held a busy loop for a second
READ_BUDGET = 256 * 1024  # bytes read per readiness event, so one connection never holds the loop
UNAVAILABLE, CANCELLED, RESOURCE_EXHAUSTED, INTERNAL, UNKNOWN = 14, 1, 8, 13, 2
# RST_STREAM error codes -> gRPC status (REFUSED_STREAM: not processed, safe to send again)
_RST_STATUS = {0x7: UNAVAILABLE, 0x8: CANCELLED, 0xB: RESOURCE_EXHAUSTED}


@dataclass
class Answer:
    """One finished call: `status` is the gRPC status code (0 = OK, `message` the response bytes)."""

    stream_id: int
    status: int
    details: str = ""
    message: bytes | None = None
    unprocessed: bool = False  # the server says it never acted on the call (REFUSED_STREAM, GOAWAY): send it again


@dataclass
class _Call:
    path: str
    body: bytes  # the length-prefixed gRPC message
    sent: int = 0  # bytes of body already in DATA frames
    window: int = 65535  # the peer's window for this stream
    started: bool = False
    headers_seen: bool = False
    data: bytearray = field(default_factory=bytearray)
    status: int | None = None
    details: str = ""


class H2Session:
    """One client HTTP/2 connection carrying unary gRPC calls (see the module docstring)."""

    def __init__(self, authority: str, tls: bool, metadata: tuple[tuple[str, str], ...], user_agent: str):
        self.out = bytearray(PREFACE)
        # our settings: no server push, our stream window, and a header table the peer may use
        self.out += frame(SETTINGS, 0, 0, struct.pack(">HIHIHI", 2, 0, S_INITIAL_WINDOW, OUR_WINDOW,
                                                      S_HEADER_TABLE_SIZE, 4096))
        self.out += frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", OUR_WINDOW - 65535))
        fixed = b"\x83" + (b"\x87" if tls else b"\x86") + literal(1, authority.encode())
        fixed += literal(31, b"application/grpc") + literal(b"te", b"trailers")
        fixed += literal(58, user_agent.encode())
        for name, value in metadata:  # the API key: never indexed, by us or any intermediary
            fixed += literal(name.encode(), value.encode(), never_indexed=True)
        self._fixed = fixed
        self._blocks: dict[str, bytes] = {}
        self.decoder = BlockDecoder(MAX_HEADER_LIST, _what_headers_say)
        self.calls: dict[int, _Call] = {}
        self.waiting: collections.deque[int] = collections.deque()  # started, not yet sent (stream limit)
        self.blocked: collections.deque[int] = collections.deque()  # sent HEADERS, DATA waiting for window
        self.next_id = 1
        self.send_window = 65535  # the connection's, as the peer grants it
        self.initial_window = 65535  # the peer's window for new streams
        self.max_frame = MAX_FRAME
        self.max_streams = 100  # until the peer's SETTINGS say otherwise
        self.open = 0
        self.unacked = 0  # bytes received since we last widened the connection's receive window
        self.goaway = False  # the peer is going away: nothing new on this connection
        self.buf = bytearray()
        self.idle_frames = 0  # frames since the last finished call (see FLOOD)
        self._headers: tuple[int, int, bytearray] | None = None  # (stream, flags, block) awaiting CONTINUATION

    def spent(self) -> bool:
        """No new call may go on this connection (GOAWAY, or its stream ids are used up)."""
        return self.goaway or self.next_id > LAST_STREAM_ID

    # ------------------------------------------------------------------ sending
    def start(self, path: str, body: bytes) -> int:
        """Queue a call of `path` with `body` (a serialized request); returns its stream id."""
        sid = self.next_id
        self.next_id += 2
        message = grpc_message(body)
        call = self.calls[sid] = _Call(path, message, window=self.initial_window)
        n = len(message)
        if (not self.waiting and not self.blocked and self.open < self.max_streams - self.max_streams // 10
                and not self.goaway and n <= self.send_window and n <= call.window and n <= self.max_frame):
            block = self._block(path)  # the common case: nothing queued, and it fits: HEADERS + DATA at once
            if len(block) <= self.max_frame:
                call.started, call.sent = True, n
                self.open += 1
                self.send_window -= n
                call.window -= n
                self.out += frame(HEADERS, END_HEADERS, sid, block) + frame(DATA, END_STREAM, sid, message)
                return sid
        self.waiting.append(sid)
        self._send_ready()
        return sid

    def cancel(self, sid: int) -> None:
        """Give the call up (its deadline passed): the server is told, its answer will be ignored."""
        call = self.calls.pop(sid, None)
        if call is None:
            return
        if call.started:
            self.open -= 1
            self.out += frame(RST_STREAM, 0, sid, struct.pack(">I", 0x8))
            if sid in self.blocked:
                self.blocked.remove(sid)
        elif sid in self.waiting:
            self.waiting.remove(sid)
        self._send_ready()

    def data_to_send(self) -> bytes:
        out, self.out = bytes(self.out), bytearray()
        return out

    def _block(self, path: str) -> bytes:
        block = self._blocks.get(path)
        if block is None:
            block = self._blocks[path] = self._fixed[:2] + literal(4, path.encode()) + self._fixed[2:]
        return block

    def _send_ready(self) -> None:
        # a tenth of the peer's stream limit is left free: a server counts a stream open a little longer
        # than its client does (until its own side is torn down) and refuses streams past its limit
        limit = self.max_streams - self.max_streams // 10
        while self.waiting and self.open < limit and not self.goaway:
            sid = self.waiting.popleft()
            call = self.calls[sid]
            call.started = True
            self.open += 1
            block = self._block(call.path)
            if len(block) > self.max_frame:  # (only with an enormous key): split into CONTINUATION frames
                self.out += frame(HEADERS, 0, sid, block[:self.max_frame])
                rest = block[self.max_frame:]
                while rest:
                    piece, rest = rest[:self.max_frame], rest[self.max_frame:]
                    self.out += frame(CONTINUATION, 0 if rest else END_HEADERS, sid, piece)
            else:
                self.out += frame(HEADERS, END_HEADERS, sid, block)
            self.blocked.append(sid)
        self._send_data()

    def _send_data(self) -> None:
        """Send request bodies as far as the windows allow, in order."""
        while self.blocked:
            sid = self.blocked[0]
            call = self.calls.get(sid)
            if call is None:
                self.blocked.popleft()
                continue
            while call.sent < len(call.body):
                room = min(self.send_window, call.window, self.max_frame, len(call.body) - call.sent)
                if room <= 0:
                    return
                piece = call.body[call.sent:call.sent + room]
                call.sent += room
                self.send_window -= room
                call.window -= room
                self.out += frame(DATA, END_STREAM if call.sent == len(call.body) else 0, sid, piece)
            self.blocked.popleft()

    # ---------------------------------------------------------------- receiving
    def receive(self, data: bytes) -> list[Answer]:
        """Bytes from the peer -> the calls they finished. Raises ProtocolError."""
        if self.buf:
            self.buf += data
            buf = bytes(self.buf)
        else:
            buf = data
        done: list[Answer] = []
        frames, pos = split(buf)
        handlers = self._handlers
        for kind, flags, sid, payload in frames:
            if self._headers is not None and kind != CONTINUATION:
                raise ProtocolError("a header block was interrupted")
            handler = handlers.get(kind)
            # (PRIORITY, PUSH_PROMISE (refused by our settings), unknown kinds: ignored); a handler returns
            # True when the frame finished a call
            if handler is not None and handler(self, flags, sid, payload, done):
                self.idle_frames = 0
            else:
                self.idle_frames += 1
                if self.idle_frames > FLOOD:
                    raise ProtocolError(f"over {FLOOD} frames in a row that finish no call (a flood)")
        self.buf = bytearray(buf[pos:]) if pos < len(buf) else bytearray()
        if self.unacked >= OUR_WINDOW // 2:
            self.out += frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", self.unacked))
            self.unacked = 0
        if len(self.out) > MAX_UNSENT:
            raise ProtocolError(f"over {MAX_UNSENT} bytes unsent: the server does not read what we send")
        return done

    def _on_headers(self, flags: int, sid: int, payload: bytes, done: list[Answer]) -> bool:
        if not sid:
            raise ProtocolError("HEADERS on stream 0")
        if flags & PADDED:
            payload = unpad(flags, payload)
        if flags & PRIORITY:
            payload = payload[5:]
        if flags & END_HEADERS:
            return self._header_block(sid, flags, payload, done)
        self._headers = (sid, flags, bytearray(payload))
        return False

    def _on_continuation(self, flags: int, sid: int, payload: bytes, done: list[Answer]) -> bool:
        if self._headers is None or self._headers[0] != sid:
            raise ProtocolError("CONTINUATION without its HEADERS")
        block = self._headers[2]
        block += payload
        if len(block) > MAX_HEADER_LIST:
            raise ProtocolError("a header block over 64 KiB")
        if flags & END_HEADERS:
            hsid, hflags, _ = self._headers
            self._headers = None
            return self._header_block(hsid, hflags, bytes(block), done)
        return False

    def _on_settings(self, flags: int, sid: int, payload: bytes, done: list[Answer]) -> None:
        if not flags & ACK:
            self._settings(payload)
            self.out += frame(SETTINGS, ACK, 0)

    def _on_ping(self, flags: int, sid: int, payload: bytes, done: list[Answer]) -> None:
        if len(payload) != 8 or sid:
            raise ProtocolError("a PING of the wrong size or on a stream")
        if not flags & ACK:
            self.out += frame(PING, ACK, 0, payload[:8])

    def _on_window(self, flags: int, sid: int, payload: bytes, done: list[Answer]) -> None:
        if len(payload) != 4:
            raise ProtocolError("a WINDOW_UPDATE of the wrong size")
        grant = int.from_bytes(payload, "big") & 0x7FFFFFFF
        if sid == 0:
            self.send_window += grant
            if self.send_window > MAX_WINDOW:
                raise ProtocolError("a WINDOW_UPDATE past the largest window")
        elif sid in self.calls:
            call = self.calls[sid]
            call.window += grant
            if call.window > MAX_WINDOW:
                raise ProtocolError("a WINDOW_UPDATE past the largest window")
        self._send_data()

    def _on_push(self, flags: int, sid: int, payload: bytes, done: list[Answer]) -> None:
        raise ProtocolError("a pushed stream (our SETTINGS refuse push)")

    def _on_reset(self, flags: int, sid: int, payload: bytes, done: list[Answer]) -> bool:
        call = self.calls.pop(sid, None)
        if call is None:
            return False
        code = int.from_bytes(payload[:4], "big") if len(payload) >= 4 else 0
        self._closed(sid, call)
        done.append(Answer(sid, call.status if call.status is not None else _RST_STATUS.get(code, INTERNAL),
                           call.details or f"the server reset the call (HTTP/2 error {code})",
                           unprocessed=code == 0x7 and not call.headers_seen))
        return True

    def _on_goaway(self, flags: int, sid: int, payload: bytes, done: list[Answer]) -> bool:
        last = int.from_bytes(payload[:4], "big") & 0x7FFFFFFF if len(payload) >= 4 else 0
        self.goaway = True
        unprocessed = [s for s in self.calls if s > last]
        for other in unprocessed:
            self._closed(other, self.calls.pop(other))
            done.append(Answer(other, UNAVAILABLE, "the server is going away (not processed)", unprocessed=True))
        return bool(unprocessed)

    def _settings(self, payload: bytes) -> None:
        for key, value in settings(payload):
            if key == S_INITIAL_WINDOW:
                delta, self.initial_window = value - self.initial_window, value
                for call in self.calls.values():
                    call.window += delta
            elif key == S_MAX_FRAME:
                self.max_frame = value
            elif key == S_MAX_CONCURRENT:
                self.max_streams = value
        self._send_ready()

    def _data(self, flags: int, sid: int, payload: bytes, done: list[Answer]) -> bool:
        self.unacked += len(payload)
        call = self.calls.get(sid)
        if call is None:
            return False  # a call we gave up
        call.data += unpad(flags, payload) if flags & PADDED else payload
        if len(call.data) > MAX_MESSAGE + 5:
            self.calls.pop(sid)
            self._closed(sid, call)
            self.out += frame(RST_STREAM, 0, sid, struct.pack(">I", 0x8))
            done.append(Answer(sid, INTERNAL, f"an answer over {MAX_MESSAGE} bytes"))  # not a rate limit: a bad answer
            return True
        if not flags & END_STREAM:
            return False
        self.calls.pop(sid)  # no trailers: not a gRPC answer
        self._closed(sid, call)
        done.append(Answer(sid, call.status, call.details) if call.status is not None else
                    Answer(sid, INTERNAL, "the server ended the call without a gRPC status"))
        return True

    def _header_block(self, sid: int, flags: int, block: bytes, done: list[Answer]) -> bool:
        # (decoded even for a call we gave up: the table must stay in step)
        status, details, http = self.decoder.decode(block)
        call = self.calls.get(sid)
        if call is None:
            return False
        if http is not None and call.status is None:
            call.status, call.details = http
        if not flags & END_STREAM:
            if call.headers_seen:
                raise ProtocolError("trailers without END_STREAM")
            call.headers_seen = True
            return False
        self.calls.pop(sid)
        self._closed(sid, call)
        done.append(self._outcome(sid, call, status, details))
        return True

    @staticmethod
    def _outcome(sid: int, call: _Call, status: bytes | None, details: bytes | None) -> Answer:
        if call.status is not None:
            return Answer(sid, call.status, call.details)
        if status is None:
            return Answer(sid, INTERNAL, "the server ended the call without a gRPC status")
        code = int(status) if status.isdigit() and len(status) <= 3 else UNKNOWN
        text = unquote(details.decode("utf-8", "replace"), errors="replace") if details else ""
        if code != 0:
            return Answer(sid, code, text)
        body = call.data
        if len(body) < 5 or body[0] > 1 or int.from_bytes(body[1:5], "big") != len(body) - 5:
            return Answer(sid, INTERNAL, "the answer is not one gRPC message")
        if body[0] == 1:
            return Answer(sid, INTERNAL, "a compressed answer (we asked for none)")
        return Answer(sid, 0, "", bytes(body[5:]))

    _handlers: dict = {}

    def _closed(self, sid: int, call: _Call) -> None:
        if call.started:
            self.open -= 1
        elif sid in self.waiting:
            self.waiting.remove(sid)
        if sid in self.blocked:
            self.blocked.remove(sid)
        if self.waiting or self.blocked:  # a place for a call held back by the stream limit, or bodies that
            self._send_ready()  # waited behind this one's

    def fail_all(self, details: str) -> list[Answer]:
        """Every call still open, answered UNAVAILABLE (the connection is gone)."""
        out = [Answer(sid, UNAVAILABLE, details) for sid in self.calls]
        self.calls.clear()
        self.waiting.clear()
        self.blocked.clear()
        self.open = 0
        return out


def _what_headers_say(headers: list) -> tuple[bytes | None, bytes | None, tuple[int, str] | None]:
    """A header block's grpc-status and grpc-message, and the (status, details) a non-200 :status makes."""
    status = details = http = None
    for name, value in headers:
        if name == b"grpc-status":
            status = value
        elif name == b"grpc-message":
            details = value
        elif name == b":status" and value != b"200" and http is None:
            http = (UNAVAILABLE if value in (b"502", b"503", b"504") else UNKNOWN,
                    f"HTTP status {value.decode('latin-1')} instead of a gRPC answer")
    return status, details, http


H2Session._handlers = {DATA: H2Session._data, HEADERS: H2Session._on_headers, CONTINUATION: H2Session._on_continuation,
                       SETTINGS: H2Session._on_settings, PUSH_PROMISE: H2Session._on_push, PING: H2Session._on_ping,
                       WINDOW_UPDATE: H2Session._on_window, RST_STREAM: H2Session._on_reset,
                       GOAWAY: H2Session._on_goaway}


# ---------------------------------------------------------------------- the loop's socket
class H2Client:
    """The socket side of `H2Session` for the parent's selector: connects (TLS with ALPN h2 when asked),
    writes what the session has to send, feeds it what arrives. Registered with data ("http", self), so
    the loop hands its events to the owner, who calls `on_ready`. `answers` collects (context, Answer)
    for the owner to take; a broken connection answers all its calls UNAVAILABLE and the next call opens
    a new one (with `metadata()` as it is then). Loop thread only; addresses come from `addresses()` (None
    until known: no call waits on a lookup on the loop)."""

    def __init__(self, sel: Any, addresses: Callable[[], list | None], authority: str, host: str, ssl_context: Any,
                 metadata: Callable[[], tuple], user_agent: str):
        self.sel, self.addresses, self.authority, self.host = sel, addresses, authority, host
        self.ssl_context = ssl_context
        self.metadata, self.user_agent = metadata, user_agent
        self.sock: Any = None
        self.session: H2Session | None = None
        self.state = "closed"  # closed, connecting, handshake, ready
        self.contexts: dict[int, object] = {}  # stream id -> the owner's context for that call
        self.answers: list[tuple[object, Answer]] = []
        self.events = 0
        self.answered_at = 0.0  # monotonic time the peer last finished a call on this connection
        self.connections = 0
        self.last_error = ""
        self._next_addr = 0
        self.lazy = False  # answers need not wake the loop: the owner reads at its own pace (`poll`)
        self.backlog = False  # the last read stopped at its budget with more to come

    def spent(self) -> bool:
        """The connection takes no new call (GOAWAY, or its stream ids are used up): the owner opens another
        client for new calls while this one finishes the calls still out on it (`contexts`)."""
        return self.session is not None and self.session.spent()

    def call(self, path: str, body: bytes, context: object) -> tuple[H2Session, int] | None:
        """Start a call; None when no connection could be started (why: `last_error`)."""
        if self.session is None or self.session.spent():
            if not self._connect():
                return None
        assert self.session is not None
        sid = self.session.start(path, body)
        self.contexts[sid] = context
        self._flush()
        return self.session, sid

    def cancel(self, handle: tuple[H2Session, int]) -> None:
        """Give a call up; its answer, if one still comes, is dropped."""
        session, sid = handle
        if session is self.session:
            self.contexts.pop(sid, None)
            session.cancel(sid)
            self._flush()

    def silent_since(self, t: float) -> bool:
        """The server finished no call on this connection since monotonic time `t`: with a call started
        then and timed out, the link is presumed dead (pings or a trickle of bytes do not keep it)."""
        return self.session is not None and self.answered_at < t

    def _connect(self) -> bool:
        import errno
        import os
        import socket

        if self.session is not None:  # spent: its calls still open end UNAVAILABLE (sent again safely)
            self.drop("the server went away")
        addrs = self.addresses()
        if not addrs:
            self.last_error = "the host's address is not known yet"
            return False
        family, type_, proto, _, addr = addrs[self._next_addr % len(addrs)]
        try:
            sock = socket.socket(family, type_, proto)
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            err = sock.connect_ex(addr)
        except OSError as exc:
            self._next_addr += 1
            self.last_error = f"cannot connect: {exc}"
            return False
        if err not in (0, errno.EINPROGRESS, errno.EAGAIN):
            sock.close()
            self._next_addr += 1
            self.last_error = f"cannot connect: {os.strerror(err)}"
            return False
        self.sock, self.state = sock, "connecting"
        self.session = H2Session(self.authority, self.ssl_context is not None, self.metadata(), self.user_agent)
        self.connections += 1
        self._watch(_W)
        return True

    def set_lazy(self, lazy: bool) -> None:
        """Whether the socket's readiness should wake the loop: when lazy, the owner calls `poll` each turn
        instead (nothing it waits for is urgent). Bodies held back by a window are urgent (the server's
        WINDOW_UPDATE would otherwise sit unread), and so is the rest of what a read left at its budget."""
        if lazy != self.lazy:
            self.lazy = lazy
            if self.state == "ready":
                self._watch(self._interest())

    def poll(self, now: float) -> None:
        """Read what has arrived, without waiting (a lazy connection's turn)."""
        if self.state == "ready":
            self.on_ready(_R, now)

    def _interest(self) -> int:
        session = self.session
        if session is None:
            return 0
        write = _W if session.out else 0
        if self.lazy and not (self.backlog or session.waiting or session.blocked):
            return write
        return _R | write

    def _watch(self, events: int) -> None:
        if events == self.events or self.sock is None:
            return
        if not events:
            try:
                self.sel.unregister(self.sock)
            except (KeyError, ValueError):
                pass
            self.events = 0
            return
        try:
            if self.events:
                self.sel.modify(self.sock, events, ("http", self))
            else:
                self.sel.register(self.sock, events, ("http", self))
        except (KeyError, ValueError):
            self.sel.register(self.sock, events, ("http", self))
        self.events = events

    def on_ready(self, mask: int, now: float) -> None:
        import socket
        import ssl

        if self.sock is None:
            return
        try:
            if self.state == "connecting":
                err = self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if err:
                    self._next_addr += 1
                    raise ConnectionRefusedError(err, "connection refused")
                if self.ssl_context is not None:
                    self.sel.unregister(self.sock)
                    self.events = 0
                    self.sock = self.ssl_context.wrap_socket(self.sock, server_hostname=self.host,
                                                             do_handshake_on_connect=False)
                    self.state = "handshake"
                else:
                    self.state = "ready"
            if self.state == "handshake":
                self.sock.do_handshake()
                if self.sock.selected_alpn_protocol() != "h2":
                    raise ProtocolError("the server did not agree to HTTP/2 (ALPN)")
                self.state = "ready"
            if mask & _R or self.state == "ready":
                self._read(now)
            self._flush()
        except (ssl.SSLWantReadError, ssl.SSLWantWriteError) as want:
            self._watch(_R if isinstance(want, ssl.SSLWantReadError) else _W)
        except (OSError, ValueError, ProtocolError) as exc:
            self.drop(f"{type(exc).__name__}: {exc}")
        except Exception as exc:  # whatever a peer provokes ends its connection, never the loop
            self.drop(f"the HTTP/2 client failed on what the server sent: {type(exc).__name__}")

    def _read(self, now: float) -> None:
        import ssl

        assert self.sock is not None and self.session is not None
        budget = READ_BUDGET  # a peer that sends without pause gets the loop back after this much
        self.backlog = True  # until a read comes up short: more is waiting, and it wakes the loop even when lazy
        while budget > 0:
            try:
                data = self.sock.recv(min(budget, 65536))
            except (BlockingIOError, ssl.SSLWantReadError):
                self.backlog = False
                return
            if not data:
                raise ConnectionResetError("the server closed the connection mid-answer" if self.contexts else
                                           "the server closed the connection")
            budget -= len(data)
            self._take(data, now)
            pending = self.sock.pending() if isinstance(self.sock, ssl.SSLSocket) else 0
            if len(data) < 65536 and not pending:
                self.backlog = False
                return
        pending = self.sock.pending() if isinstance(self.sock, ssl.SSLSocket) else 0
        if pending:  # bytes already decrypted raise no readiness event: take them now (one record at most)
            self._take(self.sock.recv(pending), now)

    def _take(self, data: bytes, now: float) -> None:
        assert self.session is not None
        answers = self.session.receive(data)
        if answers:
            self.answered_at = now
        for answer in answers:
            self._answer(answer)

    def _answer(self, answer: Answer) -> None:
        context = self.contexts.pop(answer.stream_id, None)
        if context is not None:
            self.answers.append((context, answer))

    def _flush(self) -> None:
        import ssl

        if self.sock is None or self.session is None or self.state != "ready":
            return
        out = self.session.out  # written from the session's own buffer: what is not written stays first in line
        if out:
            try:
                sent = self.sock.send(out)
            except (BlockingIOError, ssl.SSLWantWriteError, ssl.SSLWantReadError):
                sent = 0
            except OSError as exc:  # reset or broken pipe: every call on it ends UNAVAILABLE, never raised
                return self.drop(f"{type(exc).__name__}: {exc}")
            del out[:sent]
        self._watch(self._interest())

    def _fail_calls(self, why: str) -> None:
        for sid in list(self.contexts):
            self._answer(Answer(sid, UNAVAILABLE, why))

    def drop(self, why: str) -> None:
        """Close the connection; every call on it is answered UNAVAILABLE with `why`."""
        session, sock = self.session, self.sock
        self.session, self.sock, self.state = None, None, "closed"
        if sock is not None:
            try:
                if self.events:
                    self.sel.unregister(sock)
            except (KeyError, ValueError):
                pass
            self.events = 0
            try:
                sock.close()
            except OSError:
                pass
        if session is not None:
            for answer in session.fail_all(why):
                self._answer(answer)
        self._fail_calls(why)

    def close(self) -> None:
        self.drop("closed")
        self.answers.clear()


_R, _W = 1, 2  # selectors.EVENT_READ, selectors.EVENT_WRITE
