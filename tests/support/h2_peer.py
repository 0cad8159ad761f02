"""Scripted servers on loopback for the gRPC wire client's hostile tests.

`H2Peer` speaks just enough HTTP/2 to read the client's calls (its preface, SETTINGS, HEADERS with
CONTINUATION, DATA) and hands each finished request to a script, `answer(conn, sid, fields, body)`, which
writes whatever bytes the test wants (a proper answer, a reset, GOAWAY, garbage, half a frame) or nothing,
and may close the connection. SETTINGS and PING are acknowledged as a server does, unless the script set
`conn.quiet`. `CuttingProxy` forwards bytes to a real server and cuts connections mid-stream."""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Callable

import hpack

from supervisor.client.h2grpc import (
    CONTINUATION,
    DATA,
    END_HEADERS,
    END_STREAM,
    GOAWAY,
    HEADERS,
    PING,
    PREFACE,
    RST_STREAM,
    SETTINGS,
    frame,
    grpc_message,
)


class Conn:
    """One accepted connection: what the client sent, and helpers to answer it."""

    def __init__(self, sock: socket.socket, index: int):
        self.sock, self.index = sock, index
        self.encoder, self.decoder = hpack.Encoder(), hpack.Decoder()
        self.requests: list[tuple[int, dict, bytes]] = []
        self.frames: list[tuple[int, int, int, bytes]] = []  # every frame the client sent (kind, flags, sid, payload)
        self.quiet = False
        self.closed = False
        self.lock = threading.Lock()

    def send(self, data: bytes) -> None:
        with self.lock:
            if not self.closed:
                try:
                    self.sock.sendall(data)
                except OSError:
                    self.closed = True

    def close(self) -> None:
        with self.lock:
            self.closed = True
            try:
                self.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self.sock.close()

    def block(self, fields: list) -> bytes:
        return self.encoder.encode(fields)

    def headers(self, sid: int, fields: list, end: bool = False) -> bytes:
        """A HEADERS frame, followed by CONTINUATION frames when the block is over one frame's 16 KiB."""
        block, last = self.block(fields), END_STREAM if end else 0
        if len(block) <= 16384:
            return frame(HEADERS, END_HEADERS | last, sid, block)
        out = frame(HEADERS, last, sid, block[:16384])
        for at in range(16384, len(block), 16384):
            out += frame(CONTINUATION, END_HEADERS if at + 16384 >= len(block) else 0, sid, block[at:at + 16384])
        return out

    def ok(self, sid: int, body: bytes = b"") -> bytes:
        """A whole unary answer: response headers, one message, trailers with grpc-status 0."""
        return (self.headers(sid, [(":status", "200"), ("content-type", "application/grpc")])
                + frame(DATA, 0, sid, grpc_message(body)) + self.headers(sid, [("grpc-status", "0")], end=True))

    def status(self, sid: int, code: int, message: str = "") -> bytes:
        """A trailers-only answer: one HEADERS frame with END_STREAM and the status."""
        fields = [(":status", "200"), ("content-type", "application/grpc"), ("grpc-status", str(code))]
        if message:
            fields.append(("grpc-message", message))
        return self.headers(sid, fields, end=True)

    @staticmethod
    def reset(sid: int, code: int) -> bytes:
        return frame(RST_STREAM, 0, sid, struct.pack(">I", code))

    @staticmethod
    def goaway(last: int, code: int = 0) -> bytes:
        return frame(GOAWAY, 0, 0, struct.pack(">II", last, code))


class H2Peer:
    """A listener on 127.0.0.1; every connection is served on its own thread, its requests handed to `answer`."""

    def __init__(self, answer: Callable[[Conn, int, dict, bytes], None], settings: bytes = b""):
        self.answer, self.settings = answer, settings
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.conns: list[Conn] = []
        self.errors: list[str] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def requests(self) -> list[tuple[int, int, dict, bytes]]:
        """(connection index, stream id, headers, body) of every request so far."""
        return [(c.index, sid, f, b) for c in list(self.conns) for sid, f, b in list(c.requests)]

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            conn = Conn(sock, len(self.conns))
            self.conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: Conn) -> None:
        try:
            conn.send(frame(SETTINGS, 0, 0, self.settings))
            buf = b""
            while len(buf) < len(PREFACE):
                buf += self._recv(conn)
            assert buf.startswith(PREFACE), buf[:24]
            buf = buf[len(PREFACE):]
            state: dict = {"pending": {}, "block": None}
            while True:
                while len(buf) >= 9 and len(buf) >= 9 + int.from_bytes(buf[:3], "big"):
                    length = int.from_bytes(buf[:3], "big")
                    kind, flags, sid = buf[3], buf[4], int.from_bytes(buf[5:9], "big") & 0x7FFFFFFF
                    payload, buf = buf[9:9 + length], buf[9 + length:]
                    self._frame(conn, state, kind, flags, sid, payload)
                buf += self._recv(conn)
        except (OSError, EOFError):
            pass
        except Exception as exc:  # a test reads these: a peer that broke is not a client that passed
            self.errors.append(f"{type(exc).__name__}: {exc}")

    def _frame(self, conn: Conn, state: dict, kind: int, flags: int, sid: int, payload: bytes) -> None:
        conn.frames.append((kind, flags, sid, payload))
        pending = state["pending"]
        if kind in (SETTINGS, PING) and not flags & 1 and not conn.quiet:
            conn.send(frame(kind, 1, 0, payload if kind == PING else b""))
        elif kind in (HEADERS, CONTINUATION):
            block = state["block"]
            state["block"] = block = (sid, (block[1] if block else bytearray()) + payload)
            if flags & END_HEADERS:
                pending[sid] = (dict(conn.decoder.decode(bytes(block[1]))), bytearray())
                state["block"] = None
                if flags & END_STREAM:
                    self._finish(conn, sid, pending.pop(sid))
        elif kind == DATA and sid in pending:
            pending[sid][1].extend(payload)
            if flags & END_STREAM:
                self._finish(conn, sid, pending.pop(sid))

    def _finish(self, conn: Conn, sid: int, request: tuple[dict, bytearray]) -> None:
        fields, body = request
        message = bytes(body[5:]) if len(body) >= 5 else b""
        conn.requests.append((sid, fields, message))
        self.answer(conn, sid, fields, message)

    @staticmethod
    def _recv(conn: Conn) -> bytes:
        data = conn.sock.recv(65536)
        if not data:
            raise EOFError
        return data

    def close(self) -> None:
        self.listener.close()
        for conn in self.conns:
            conn.close()


class CuttingProxy:
    """Forwards loopback connections to `upstream` (host:port); each connection is cut, both ways at once,
    after a number of bytes from the server drawn from `cut_after()` (None: never)."""

    def __init__(self, upstream: str, cut_after: Callable[[], int | None]):
        host, _, port = upstream.rpartition(":")
        self.upstream = (host.strip("[]"), int(port))
        self.cut_after = cut_after
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.connections = 0
        self.cuts = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            try:
                server = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            both = (client, server)
            threading.Thread(target=self._pipe, args=(client, server, None, both), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client, self.cut_after(), both), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, budget: int | None, both) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if budget is not None and len(data) >= budget:
                    dst.sendall(data[:budget])  # the cut falls inside whatever frame these bytes carry
                    self.cuts += 1
                    time.sleep(0.01)
                    break
                if budget is not None:
                    budget -= len(data)
                dst.sendall(data)
        except OSError:
            pass
        for sock in both:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def close(self) -> None:
        self.listener.close()
