"""`GET /api/v1/ws`: the realtime events over a WebSocket (RFC 6455), as the real server serves them.

Contract:
- The handshake is checked after auth (the header, or `?token=` / `?api_key=`: a browser's WebSocket
  cannot set a header): `Upgrade: websocket`, `Connection: upgrade`, `Sec-WebSocket-Version: 13` and a
  `Sec-WebSocket-Key` of 16 base64 bytes, else 400 (with `Sec-WebSocket-Version: 13` for another
  version, as the real server's framework answers); then the same `queue`,
  `events` and `job_id` filters as the events stream (realtime.py); beyond MAX_PER_ORG open sockets
  per organization, 429.
- The server sends each event as one text message, the `{"type": "<Variant>", "data": {...}}` envelope
  (no event name), and a `Ping` event at once and every PING_EVERY seconds.
- The client may send `{"cmd": "Subscribe" | "Unsubscribe", "queue"?, "job_id"?}` (narrow or widen the
  filter) and `{"cmd": "Ping"}` (answered with a `Ping` event); the command name is matched without case,
  as SDKs send it lower-case. Other text is ignored. A WebSocket ping is answered with a pong.
- Bounded per connection: a client message (all its fragments) over MAX_MESSAGE bytes is closed with
  1009 before its payload is read; a frame that breaks RFC 6455 (not masked, reserved bits, unknown
  opcode, a fragmented or long control frame, a stray continuation) with 1002; text that is not UTF-8
  with 1007. A client that stops reading falls behind by at most realtime.BUFFER events (newer ones are
  dropped), and one whose socket takes no bytes for WRITE_TIMEOUT seconds is disconnected.
- The socket closes (1001) when the server stops or the dev route drops every stream; a client's close
  is answered with the same code.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import queue
import select
import socket
import struct
import time
from collections.abc import Callable

from supervisor import exactjson

from .errors import HttpError
from .realtime import _END, Broadcaster, Subscriber
from .store import ts
from .transport import Upgrade, send_all

GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
MAX_MESSAGE = 64 * 1024  # bytes of one client message (its commands are under 200)
MAX_PER_ORG = 100  # open WebSockets per organization, as the real server caps them
PING_EVERY = 30.0  # seconds between the server's Ping events
WRITE_TIMEOUT = 10.0  # seconds a write may wait on a client that does not read
TICK = 1.0  # seconds between checks that the server still runs
CONT, TEXT, BINARY, CLOSE, PING, PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA

# close codes
NORMAL, GOING_AWAY, PROTOCOL_ERROR, NOT_UTF8, POLICY_VIOLATION, TOO_BIG = 1000, 1001, 1002, 1007, 1008, 1009


class ProtocolError(Exception):
    """The client broke RFC 6455 or a limit: close with `code`."""

    def __init__(self, code: int, reason: str):
        super().__init__(reason)
        self.code, self.reason = code, reason


def accept_key(key: str) -> str:
    return base64.b64encode(hashlib.sha1(key.encode("latin-1") + GUID).digest()).decode()


def check_handshake(headers: dict) -> str:
    """The `Sec-WebSocket-Accept` value for a valid upgrade request; HttpError 400 otherwise."""
    tokens = {t.strip().lower() for t in headers.get("connection", "").split(",")}
    if headers.get("upgrade", "").strip().lower() != "websocket":
        raise HttpError(400, "BAD_REQUEST", "`Upgrade` header did not include 'websocket'")
    if "upgrade" not in tokens:
        raise HttpError(400, "BAD_REQUEST", "`Connection` header did not include 'upgrade'")
    if headers.get("sec-websocket-version", "").strip() != "13":
        raise HttpError(400, "BAD_REQUEST", "`Sec-WebSocket-Version` header did not include '13'",
                        headers={"Sec-WebSocket-Version": "13"})
    key = headers.get("sec-websocket-key", "").strip()
    try:
        raw = base64.b64decode(key, validate=True)
    except (binascii.Error, ValueError):
        raw = b""
    if len(raw) != 16:
        raise HttpError(400, "BAD_REQUEST", "`Sec-WebSocket-Key` header missing or not 16 base64-encoded bytes")
    return accept_key(key)


def frame(opcode: int, payload: bytes) -> bytes:
    """One unmasked, final server frame."""
    n = len(payload)
    if n < 126:
        head = struct.pack("!BB", 0x80 | opcode, n)
    elif n < 65536:
        head = struct.pack("!BBH", 0x80 | opcode, 126, n)
    else:
        head = struct.pack("!BBQ", 0x80 | opcode, 127, n)
    return head + payload


def close_frame(code: int, reason: str = "") -> bytes:
    return frame(CLOSE, struct.pack("!H", code) + reason.encode()[:120])


def _valid_close_code(code: int) -> bool:
    return 1000 <= code <= 1014 and code not in (1004, 1005, 1006) or 3000 <= code <= 4999


class FrameReader:
    """Sans-I/O: bytes from the client in, whole messages out as (opcode, payload); control frames come
    out between the fragments of a message. Buffers at most one frame header plus MAX_MESSAGE bytes."""

    def __init__(self, max_message: int = MAX_MESSAGE):
        self.max_message = max_message
        self.buf = bytearray()
        self.parts: list[bytes] = []
        self.part_op: int | None = None
        self.part_len = 0

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        self.buf += data
        out: list[tuple[int, bytes]] = []
        while True:
            got = self._one()
            if got is None:
                return out
            out.extend(got)

    def _header(self) -> tuple[bool, int, int, int] | None:
        """(final?, opcode, payload length, payload offset after the mask) of the buffered frame, once its
        header is in; raises ProtocolError for a header RFC 6455 or the size limit refuses."""
        buf = self.buf
        if len(buf) < 2:
            return None
        b0, b1 = buf[0], buf[1]
        fin, opcode, n = bool(b0 & 0x80), b0 & 0x0F, b1 & 0x7F
        if b0 & 0x70:
            raise ProtocolError(PROTOCOL_ERROR, "reserved bits set")
        if opcode not in (CONT, TEXT, BINARY, CLOSE, PING, PONG):
            raise ProtocolError(PROTOCOL_ERROR, "unknown opcode")
        if not b1 & 0x80:
            raise ProtocolError(PROTOCOL_ERROR, "client frames must be masked")
        if opcode >= CLOSE and (not fin or n > 125):
            raise ProtocolError(PROTOCOL_ERROR, "control frames must be final and at most 125 bytes")
        at = 2
        if n >= 126:
            size = 2 if n == 126 else 8
            if len(buf) < 2 + size:
                return None
            n = int.from_bytes(buf[2:2 + size], "big")
            if n >> 63:
                raise ProtocolError(PROTOCOL_ERROR, "frame length out of range")
            at += size
        if opcode < CLOSE:
            if (opcode == CONT) != (self.part_op is not None):
                raise ProtocolError(PROTOCOL_ERROR, "continuation without a message, or a new message inside one")
            if self.part_len + n > self.max_message:
                raise ProtocolError(TOO_BIG, f"message over {self.max_message} bytes")
        return fin, opcode, n, at + 4

    def _one(self) -> list[tuple[int, bytes]] | None:
        head = self._header()
        if head is None or len(self.buf) < head[3] + head[2]:
            return None
        fin, opcode, n, at = head
        payload = _unmask(bytes(self.buf[at:at + n]), bytes(self.buf[at - 4:at]))
        del self.buf[:at + n]
        if opcode >= CLOSE:
            return [(opcode, payload)]
        if opcode != CONT:
            self.part_op = opcode
        self.parts.append(payload)
        self.part_len += n
        if not fin:
            return []
        op, message = self.part_op, b"".join(self.parts)
        self.parts, self.part_op, self.part_len = [], None, 0
        if op == TEXT:
            try:
                message.decode("utf-8")
            except UnicodeDecodeError:
                raise ProtocolError(NOT_UTF8, "text message is not UTF-8") from None
        return [(op or TEXT, message)]


def _unmask(data: bytes, mask: bytes) -> bytes:
    if not data:
        return data
    key = int.from_bytes((mask * (len(data) // 4 + 1))[:len(data)], "little")
    return (int.from_bytes(data, "little") ^ key).to_bytes(len(data), "little")


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass


def _event(variant: str, data: dict) -> bytes:
    return frame(TEXT, exactjson.dumps({"type": variant, "data": data}))


def _ping_event() -> bytes:
    return _event("Ping", {"timestamp": ts(time.time())})


class Session(Upgrade):
    """One WebSocket: the events its filter keeps out, the client's commands in (on the answering thread).
    `sub` is already subscribed (`Broadcaster.subscribe_capped`); the session unsubscribes it when it ends."""

    def __init__(self, broadcaster: Broadcaster, accept: str, sub: Subscriber, ping_every: float = PING_EVERY):
        self.broadcaster, self.accept, self.ping_every = broadcaster, accept, ping_every
        self.sub = sub

    def abandon(self) -> None:
        self.broadcaster.unsubscribe(self.sub)

    def head(self, headers: dict) -> bytes:
        lines = ["HTTP/1.1 101 Switching Protocols", "Upgrade: websocket", "Connection: Upgrade",
                 f"Sec-WebSocket-Accept: {self.accept}", *(f"{k}: {v}" for k, v in headers.items())]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    def run(self, sock: socket.socket, gone: Callable[[], bool]) -> None:
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_r, False)
        os.set_blocking(wake_w, False)

        def wake() -> None:
            try:
                os.write(wake_w, b"\0")
            except OSError:
                pass  # a wake-up is already pending

        def send(data: bytes) -> bool:
            return send_all(sock, data, time.monotonic() + WRITE_TIMEOUT)

        self.sub.wake = wake
        poller = select.poll()
        poller.register(sock.fileno(), select.POLLIN)
        poller.register(wake_r, select.POLLIN)
        reader = FrameReader()
        try:
            next_ping = time.monotonic()
            while not gone():
                now = time.monotonic()
                if now >= next_ping:
                    next_ping = now + self.ping_every
                    if not send(_ping_event()):
                        return
                for fd, _ in poller.poll(max(0.0, min(TICK, next_ping - now)) * 1000):
                    if fd == wake_r:
                        _drain(wake_r)
                    elif not self._read(sock, reader, send):
                        return
                if not self._flush(send):
                    return
                if not self.sub.buffer.empty():
                    wake()
            send(close_frame(GOING_AWAY, "server stopping"))
        finally:
            self.broadcaster.unsubscribe(self.sub)
            os.close(wake_r)
            os.close(wake_w)

    def _read(self, sock: socket.socket, reader: FrameReader, send: Callable[[bytes], bool]) -> bool:
        """Read what the client sent and act on it; False when the session ends."""
        try:
            data = sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return True
        except OSError:
            return False
        if not data:
            return False
        try:
            messages = reader.feed(data)
        except ProtocolError as e:
            send(close_frame(e.code, e.reason))
            return False
        return all(self._on_message(opcode, payload, send) for opcode, payload in messages)

    def _flush(self, send: Callable[[bytes], bool]) -> bool:
        """Write the buffered events (up to 256 in one write); False when the session ends (also when its key
        has expired: closed with 1008)."""
        if self.sub.expired(time.time()):
            send(close_frame(POLICY_VIOLATION, "API key has expired"))
            return False
        out: list[bytes] = []
        while len(out) < 256:
            try:
                item = self.sub.buffer.get_nowait()
            except queue.Empty:
                break
            if item is _END:
                send(b"".join(out) + close_frame(GOING_AWAY, "stream dropped"))
                return False
            out.append(_event(item[1], item[2]))
        return not out or send(b"".join(out))

    def _on_message(self, opcode: int, payload: bytes, send: Callable[[bytes], bool]) -> bool:
        """Act on one client message; False when the session ends."""
        if opcode == CLOSE:
            code = NORMAL
            if len(payload) == 1:
                code = PROTOCOL_ERROR
            elif len(payload) >= 2:
                (code,) = struct.unpack("!H", payload[:2])
                if not _valid_close_code(code):
                    code = PROTOCOL_ERROR
            send(close_frame(code))
            return False
        if opcode == PING:
            return send(frame(PONG, payload))
        if opcode == TEXT:
            return self._command(payload, send)
        return True  # pong, binary: nothing to do

    def _command(self, text: bytes, send: Callable[[bytes], bool]) -> bool:
        try:
            cmd = exactjson.loads(text)
        except ValueError:
            return True
        if not isinstance(cmd, dict) or not isinstance(cmd.get("cmd"), str):
            return True
        name = cmd["cmd"].lower()
        queue_name, job_id = cmd.get("queue"), cmd.get("job_id")
        queue_name = queue_name if isinstance(queue_name, str) and queue_name else None
        job_id = job_id if isinstance(job_id, str) and job_id else None
        sub = self.sub
        if name == "subscribe":
            if queue_name is not None and (sub.scope is None or queue_name in sub.scope):
                sub.queue_name = queue_name  # another queue than a scoped key's is ignored: nothing widens
            if job_id is not None:
                sub.job_id = job_id
        elif name == "unsubscribe":
            if queue_name is None or sub.queue_name == queue_name:
                sub.queue_name = None
            if job_id is None or sub.job_id == job_id:
                sub.job_id = None
        elif name == "ping":
            return send(_ping_event())
        return True


def connect(app, req):
    """GET /api/v1/ws: upgrade to a WebSocket carrying the organization's realtime events (the module's contract)."""
    from .handlers import event_filter, open_subscriber

    accept = check_handshake(req.headers)
    queue_name, names, job_id = event_filter(app, req)
    sub = open_subscriber(app, req, queue_name, names, job_id, raw=True, cap=MAX_PER_ORG)
    if sub is None:
        raise HttpError(429, "RATE_LIMIT_EXCEEDED", "Too many WebSocket connections")
    return 101, Session(app.events, accept, sub), None
