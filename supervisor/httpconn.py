"""A lean HTTP/1.1 keep-alive connection: one `sendall` per request, minimal response parsing.

`http.client` spends most of its time in the `email` header parser; for a JSON API on a
kept-alive connection this reads the status line, the few headers that matter and a body
framed by Content-Length or chunked encoding (or the connection's end).
"""

from __future__ import annotations

import socket
import ssl

_READ = 65536


class StaleConnection(ConnectionError):
    """The peer closed a kept-alive connection before answering: safe to resend once."""


class Connection:
    def __init__(self, host: str, port: int, timeout: float, ssl_context: ssl.SSLContext | None = None):
        self.host, self.port, self.timeout, self.ssl_context = host, port, timeout, ssl_context
        self.sock: socket.socket | None = None
        self._buf = bytearray()
        self.host_header = host if port in (80, 443) else f"{host}:{port}"

    @property
    def is_open(self) -> bool:
        return self.sock is not None

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

    def request(self, method: str, path: str, headers: dict[str, str], body: bytes) -> tuple[int, dict[str, str], bytes]:
        """Send one request, return (status, lower-cased headers, body). Raises OSError on transport failure,
        StaleConnection if a reused connection was closed by the peer before any answer byte."""
        reused = self.sock is not None
        if not reused:
            self._connect()
        head = [f"{method} {path} HTTP/1.1\r\nHost: {self.host_header}\r\nContent-Length: {len(body)}\r\n"]
        head += [f"{k}: {v}\r\n" for k, v in headers.items()]
        head.append("\r\n")
        try:
            self.sock.sendall("".join(head).encode("latin-1") + body)
            return self._read_response(method, reused)
        except BaseException:
            self.close()
            raise

    def _fill(self, stale_ok: bool) -> None:
        chunk = self.sock.recv(_READ)
        if not chunk:
            if stale_ok:
                raise StaleConnection("connection closed before the answer")
            raise ConnectionResetError("connection closed in the middle of the answer")
        self._buf += chunk

    def _read_response(self, method: str, reused: bool) -> tuple[int, dict[str, str], bytes]:
        buf = self._buf
        while True:
            end = buf.find(b"\r\n\r\n")
            if end >= 0:
                break
            self._fill(stale_ok=reused and not buf)
        lines = bytes(buf[:end]).decode("latin-1").split("\r\n")
        del buf[:end + 4]
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/"):
            raise ConnectionError(f"not an HTTP answer: {lines[0][:80]!r}")
        status = int(parts[1])
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        if 100 <= status < 200:  # an interim answer: the real one follows
            return self._read_response(method, False)
        if method == "HEAD" or status in (204, 304):
            body = b""
        elif "content-length" in headers:
            size = int(headers["content-length"])
            while len(buf) < size:
                self._fill(stale_ok=False)
            body = bytes(buf[:size])
            del buf[:size]
        elif headers.get("transfer-encoding", "").lower().endswith("chunked"):
            body = self._read_chunked()
        else:  # framed by the end of the connection
            try:
                while True:
                    chunk = self.sock.recv(_READ)
                    if not chunk:
                        break
                    buf += chunk
            finally:
                body = bytes(buf)
                self.close()
            return status, headers, body
        if headers.get("connection", "").lower() == "close":
            self.close()
        return status, headers, body

    def _read_chunked(self) -> bytes:
        buf, out = self._buf, bytearray()
        while True:
            while (eol := buf.find(b"\r\n")) < 0:
                self._fill(stale_ok=False)
            size = int(bytes(buf[:eol]).split(b";", 1)[0], 16)
            del buf[:eol + 2]
            if size == 0:
                while (eol := buf.find(b"\r\n")) != 0:  # trailers end with an empty line
                    if eol < 0:
                        self._fill(stale_ok=False)
                    else:
                        del buf[:eol + 2]
                del buf[:2]
                return bytes(out)
            while len(buf) < size + 2:
                self._fill(stale_ok=False)
            out += buf[:size]
            del buf[:size + 2]
