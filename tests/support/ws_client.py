"""A raw WebSocket client for hostile tests: any handshake, any frame, read what the server sends."""

from __future__ import annotations

import base64
import os
import socket
import struct
import time


def handshake(port: int, path: str, headers: dict | None = None, rcvbuf: int | None = None,
              timeout: float = 10.0) -> tuple[socket.socket, int, dict, bytes]:
    """Send an upgrade request (the default headers unless overridden; a None value leaves one out);
    (socket, status, response headers, bytes read past the head)."""
    sock = socket.socket()
    if rcvbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(timeout)
    sock.connect(("127.0.0.1", port))
    hdrs = {"Host": f"127.0.0.1:{port}", "Upgrade": "websocket", "Connection": "Upgrade",
            "Sec-WebSocket-Key": base64.b64encode(os.urandom(16)).decode(), "Sec-WebSocket-Version": "13"}
    hdrs.update(headers or {})
    lines = [f"GET {path} HTTP/1.1", *(f"{k}: {v}" for k, v in hdrs.items() if v is not None)]
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
    data = b""
    while b"\r\n\r\n" not in data:
        more = sock.recv(65536)
        if not more:
            break
        data += more
    head, _, rest = data.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    status = int(status_line.split()[1])
    got = {}
    for line in header_lines:
        k, _, v = line.partition(":")
        got[k.strip().lower()] = v.strip()
    return sock, status, got, rest


def client_frame(opcode: int, payload: bytes, fin: bool = True, mask: bool = True, rsv: int = 0,
                 length: int | None = None) -> bytes:
    """One client frame; `length` overrides the declared payload length."""
    n = len(payload) if length is None else length
    b0 = (0x80 if fin else 0) | rsv | opcode
    m = 0x80 if mask else 0
    if n < 126:
        head = struct.pack("!BB", b0, m | n)
    elif n < 65536:
        head = struct.pack("!BBH", b0, m | 126, n)
    else:
        head = struct.pack("!BBQ", b0, m | 127, n)
    if not mask:
        return head + payload
    key = os.urandom(4)
    return head + key + bytes(b ^ key[i % 4] for i, b in enumerate(payload))


class FrameStream:
    """Reads server frames (unmasked) from a socket."""

    def __init__(self, sock: socket.socket, rest: bytes = b""):
        self.sock, self.buf = sock, bytearray(rest)

    def _need(self, n: int, deadline: float) -> bool:
        while len(self.buf) < n:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                more = self.sock.recv(65536)
            except TimeoutError:
                return False
            if not more:
                return False
            self.buf += more
        return True

    def next(self, timeout: float = 10.0) -> tuple[int, bytes] | None:
        """(opcode, payload) of the next frame, or None at the end of the stream or on timeout."""
        deadline = time.monotonic() + timeout
        if not self._need(2, deadline):
            return None
        n, at = self.buf[1] & 0x7F, 2
        if n == 126:
            if not self._need(4, deadline):
                return None
            n, at = struct.unpack_from("!H", self.buf, 2)[0], 4
        elif n == 127:
            if not self._need(10, deadline):
                return None
            n, at = struct.unpack_from("!Q", self.buf, 2)[0], 10
        if not self._need(at + n, deadline):
            return None
        opcode, payload = self.buf[0] & 0x0F, bytes(self.buf[at:at + n])
        del self.buf[:at + n]
        return opcode, payload

    def until_close(self, timeout: float = 10.0) -> int | None:
        """Skip frames until a close frame; its code (None if the stream ended without one)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = self.next(deadline - time.monotonic())
            if got is None:
                return None
            if got[0] == 0x8:
                return struct.unpack("!H", got[1][:2])[0] if len(got[1]) >= 2 else 1005
        return None
