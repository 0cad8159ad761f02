"""Lean HTTP/1.1 over kept-alive connections: a request is one write, the answer a small parse.

`http.client` spends most of its time in the `email` header parser; a JSON API needs the
status line, a few headers and a body framed by Content-Length, chunked encoding or the
connection's end. `parse_response` works on whatever bytes have arrived so far, so the
blocking `Connection` here and the parent loop's non-blocking client share it.
"""

from __future__ import annotations

import socket
import ssl

_READ = 65536


class StaleConnection(ConnectionError):
    """The peer closed a kept-alive connection before answering: safe to resend once."""


class Response:
    __slots__ = ("status", "headers", "body", "close")

    def __init__(self, status: int, headers: dict[str, str], body: bytes, close: bool):
        self.status, self.headers, self.body, self.close = status, headers, body, close


def header_block(host_header: str, headers: dict[str, str]) -> bytes:
    """The headers every request repeats, encoded once; ends with the blank line."""
    return "".join([f"Host: {host_header}\r\n", *(f"{k}: {v}\r\n" for k, v in headers.items()), "\r\n"]).encode("latin-1")


def build_request(method: str, path: str, fixed_headers: bytes, body: bytes) -> bytes:
    """One request's bytes: `fixed_headers` comes from `header_block`."""
    return f"{method} {path} HTTP/1.1\r\nContent-Length: {len(body)}\r\n".encode("latin-1") + fixed_headers + body


def _chunked_body(buf: bytearray, start: int) -> tuple[bytes, int] | None:
    out, pos = bytearray(), start
    while True:
        eol = buf.find(b"\r\n", pos)
        if eol < 0:
            return None
        size = int(bytes(buf[pos:eol]).split(b";", 1)[0], 16)
        pos = eol + 2
        if size == 0:
            while True:  # trailers, up to an empty line
                eol = buf.find(b"\r\n", pos)
                if eol < 0:
                    return None
                if eol == pos:
                    return bytes(out), eol + 2
                pos = eol + 2
        if len(buf) < pos + size + 2:
            return None
        out += buf[pos:pos + size]
        pos += size + 2


def parse_response(buf: bytearray, method: str, eof: bool = False) -> tuple[Response, int] | None:
    """One answer from the start of `buf` and the bytes it used, or None while incomplete.
    With `eof`, a body framed by the connection's end is complete. Raises ValueError on garbage."""
    end = buf.find(b"\r\n\r\n")
    if end < 0:
        if eof and buf:
            raise ValueError("connection closed inside the answer's headers")
        return None
    lines = bytes(buf[:end]).decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/"):
        raise ValueError(f"not an HTTP answer: {lines[0][:80]!r}")
    status = int(parts[1])
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    start = end + 4
    if 100 <= status < 200:  # an interim answer: the real one follows
        rest = parse_response(bytearray(buf[start:]), method, eof)
        return None if rest is None else (rest[0], start + rest[1])
    close = headers.get("connection", "").lower() == "close"
    if method == "HEAD" or status in (204, 304):
        return Response(status, headers, b"", close), start
    if "content-length" in headers:
        size = int(headers["content-length"])
        if len(buf) - start < size:
            if eof:
                raise ValueError("connection closed in the middle of the answer")
            return None
        return Response(status, headers, bytes(buf[start:start + size]), close), start + size
    if headers.get("transfer-encoding", "").lower().endswith("chunked"):
        got = _chunked_body(buf, start)
        if got is None:
            if eof:
                raise ValueError("connection closed in the middle of the answer")
            return None
        return Response(status, headers, got[0], close), got[1]
    if not eof:  # framed by the end of the connection
        return None
    return Response(status, headers, bytes(buf[start:]), True), len(buf)


class Connection:
    """A blocking kept-alive connection (used off the parent's loop: commands, deregister)."""

    def __init__(self, host: str, port: int, timeout: float, ssl_context: ssl.SSLContext | None = None):
        self.host, self.port, self.timeout, self.ssl_context = host, port, timeout, ssl_context
        self.sock: socket.socket | None = None
        self._buf = bytearray()
        self.host_header = host if port in (80, 443) else f"{host}:{port}"
        self._fixed: tuple[dict, bytes] | None = None

    def close(self) -> None:
        if self.sock is not None:
            try:
                self.sock.close()
            except OSError:
                pass
        self.sock = None
        self._buf.clear()

    def _connect(self) -> None:
        sock = socket.create_connection((self.host, self.port), timeout=self.timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.ssl_context is not None:
            sock = self.ssl_context.wrap_socket(sock, server_hostname=self.host)
        self.sock = sock
        self._buf.clear()

    def request(self, method: str, path: str, headers: dict[str, str], body: bytes) -> Response:
        """Send one request and read its answer. Raises OSError/ValueError on transport failure, and
        StaleConnection if a reused connection was closed by the peer before any answer byte."""
        reused = self.sock is not None
        if not reused:
            self._connect()
        try:
            if self._fixed is None or self._fixed[0] is not headers:
                self._fixed = (headers, header_block(self.host_header, headers))
            self.sock.sendall(build_request(method, path, self._fixed[1], body))
            while True:
                got = parse_response(self._buf, method)
                if got is not None:
                    break
                chunk = self.sock.recv(_READ)
                if not chunk:
                    if reused and not self._buf:
                        raise StaleConnection("connection closed before the answer")
                    got = parse_response(self._buf, method, eof=True)
                    if got is None:
                        raise ConnectionResetError("connection closed before the answer")
                    break
                self._buf += chunk
        except BaseException:
            self.close()
            raise
        response, used = got
        del self._buf[:used]
        if response.close:
            self.close()
        return response
