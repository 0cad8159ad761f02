"""The API's server-sent events stream (`GET /api/v1/events`) on a non-blocking socket in the parent's loop.

`EventsConnection` opens one kept-alive GET, registers its socket in the loop's selector with data
`("events", connection)`, and turns what arrives into notes for the caller (supervisor.parent.wake):

    ("open",)                 the server answered 200 text/event-stream: the stream is live
    ("event", name, data)     one server-sent event: its name and its `data` text
    ("refused", status, msg)  the server answered something else (404 on servers without the route)
    ("lost", reason)          the connection failed, ended, or the answer was malformed

It never blocks: connecting, TLS and reading all happen as the selector reports the socket ready.
After "refused" or "lost" the connection is closed; `open` starts a fresh one.

`SseParser` frames the event stream as the HTML standard defines it: lines end in CRLF, LF or CR; a
blank line dispatches the event; `:` starts a comment; `data` lines join with LF; an event with no
`data` is not dispatched; the name defaults to `message`.
"""

from __future__ import annotations

import errno
import os
import selectors
import socket
import ssl
import threading
import time
from typing import Any
from urllib.parse import urlencode

import httptools

from supervisor.backoff import backoff
from supervisor.client.httpconn import build_request, header_block
from supervisor.client.loophttp import _is_local, tls_pending
from supervisor.client.rest import SpooledAPI

_READ = 65536
READ_BUDGET = 65536  # bytes read from the stream per turn of the loop at most: a flooding peer cannot hold it
MAX_HEAD = 64 * 1024
MAX_ERROR_BODY = 64 * 1024
MAX_EVENT = 1024 * 1024  # bytes of one event's lines at most: a bigger one is malformed
_R, _W = selectors.EVENT_READ, selectors.EVENT_WRITE


class SseParser:
    """Incremental server-sent events framing: `feed(bytes)` returns the events completed, as (name, data)."""

    def __init__(self) -> None:
        self._buf = b""
        self._name = ""
        self._data: list[str] = []
        self._size = 0
        self._after_cr = False
        self.comments = 0  # comment lines seen (read and reset by the caller)

    def feed(self, chunk: bytes) -> list[tuple[str, str]]:
        if self._after_cr and chunk.startswith(b"\n"):
            chunk = chunk[1:]  # the LF of a CRLF cut between two chunks
        self._after_cr = False
        buf = self._buf + chunk
        out: list[tuple[str, str]] = []
        start = 0
        while True:
            cr, lf = buf.find(b"\r", start), buf.find(b"\n", start)
            if cr < 0 and lf < 0:
                break
            end = lf if cr < 0 or (0 <= lf < cr) else cr
            line = buf[start:end]
            if buf[end:end + 1] == b"\r":
                if end + 1 == len(buf):
                    self._after_cr = True
                    start = end + 1
                else:
                    start = end + 2 if buf[end + 1:end + 2] == b"\n" else end + 1
            else:
                start = end + 1
            self._line(line.decode("utf-8", "replace"), out)
        self._buf = buf[start:]
        if len(self._buf) + self._size > MAX_EVENT:
            raise ValueError(f"a server-sent event over {MAX_EVENT} bytes")
        return out

    def _line(self, line: str, out: list[tuple[str, str]]) -> None:
        if not line:
            if self._data:
                out.append((self._name or "message", "\n".join(self._data)))
            self._name, self._data, self._size = "", [], 0
            return
        if line.startswith(":"):
            self.comments += 1
            return
        field, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        self._size += len(line)
        if field == "event":
            self._name = value
        elif field == "data":
            self._data.append(value)


class _Answer:
    """httptools callbacks for the stream's one answer."""

    def __init__(self, parser: SseParser):
        self.parser = httptools.HttpResponseParser(self)
        self.status = 0
        self.content_type = ""
        self.head_done = self.ended = False
        self.error_body = bytearray()
        self.events: list[tuple[str, str]] = []
        self.sse = parser

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"content-type":
            self.content_type = value.decode("latin-1").lower()

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        self.head_done = self.status >= 200  # an interim answer (1xx) is skipped

    def on_body(self, body: bytes) -> None:
        if self.streaming:
            self.events += self.sse.feed(body)
        elif len(self.error_body) < MAX_ERROR_BODY:
            self.error_body += body[:MAX_ERROR_BODY - len(self.error_body)]

    def on_message_complete(self) -> None:
        self.ended = True

    @property
    def streaming(self) -> bool:
        return self.status == 200 and self.content_type.startswith("text/event-stream")


def events_path(api: SpooledAPI, queues: list[str], names: str = "job.created") -> str:
    """The stream's path: one queue filtered by the server; several are filtered by the caller."""
    query = {"queue": queues[0], "events": names} if len(queues) == 1 else {"events": names}
    return f"{api.prefix}/api/v1/events?{urlencode(query)}"


class EventsConnection:
    """One events stream at a time (see the module docstring). `last_read_at` is when bytes last came."""

    def __init__(self, api: SpooledAPI, sel: selectors.BaseSelector, path: str):
        self.api, self.sel, self.path = api, sel, path
        host = api.host if api.port in (80, 443) else f"{api.host}:{api.port}"
        headers = dict(api.headers, Accept="text/event-stream")
        headers.pop("Content-Type", None)
        self._request = build_request("GET", path, header_block(host, headers), b"")
        self.sock: Any = None
        self.state = "closed"  # connecting -> handshake -> sending -> head -> streaming
        self.out = memoryview(b"")
        self.answer: _Answer | None = None
        self.opened_at = self.last_read_at = 0.0
        self.head_bytes = 0
        self.events = 0
        self.bytes_read = 0  # since the last take_traffic

    def take_traffic(self) -> tuple[int, int]:
        """Bytes read and comment lines parsed since the last call (for the flood check)."""
        nbytes, self.bytes_read = self.bytes_read, 0
        comments = 0
        if self.answer is not None:
            comments, self.answer.sse.comments = self.answer.sse.comments, 0
        return nbytes, comments

    @property
    def open(self) -> bool:
        return self.state != "closed"

    def connect(self, addr: tuple, now: float) -> list[tuple]:
        """Start connecting to `addr` (a getaddrinfo entry); notes if it failed at once."""
        self.close()
        family, type_, proto, _, sockaddr = addr
        self.opened_at = self.last_read_at = now
        self.answer = _Answer(SseParser())
        self.head_bytes = 0
        try:
            sock = socket.socket(family, type_, proto)
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError as exc:
            return self._lost(f"cannot open a socket: {exc}")
        self.sock, self.state = sock, "connecting"
        err = sock.connect_ex(sockaddr)
        if err not in (0, errno.EINPROGRESS, errno.EAGAIN):
            return self._lost(f"cannot connect to {self.api.base_url}: {os.strerror(err)}")
        self._watch(_W)
        return []

    def close(self) -> None:
        if self.sock is not None:
            try:
                self.sel.unregister(self.sock)
            except (KeyError, ValueError):
                pass
            try:
                self.sock.close()
            except OSError:
                pass
        self.sock, self.state, self.events = None, "closed", 0

    def _watch(self, events: int) -> None:
        if events == self.events:
            return
        self.events = events
        try:
            self.sel.modify(self.sock, events, ("events", self))
        except (KeyError, ValueError):
            self.sel.register(self.sock, events, ("events", self))

    def _lost(self, reason: str) -> list[tuple]:
        self.close()
        return [("lost", reason)]

    # ------------------------------------------------------------ readiness
    def on_ready(self, mask: int, now: float) -> list[tuple]:
        if self.sock is None:
            return []
        try:
            if self.state == "connecting":
                err = self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if err:
                    return self._lost(f"cannot connect to {self.api.base_url}: {os.strerror(err)}")
                if self.api.ssl_context is not None:
                    self.sel.unregister(self.sock)
                    self.events = 0
                    self.sock = self.api.ssl_context.wrap_socket(self.sock, server_hostname=self.api.host,
                                                                 do_handshake_on_connect=False)
                    self.state = "handshake"
                else:
                    self.state, self.out = "sending", memoryview(self._request)
            if self.state == "handshake":
                self.sock.do_handshake()
                self.state, self.out = "sending", memoryview(self._request)
            if self.state == "sending":
                while self.out:
                    self.out = self.out[self.sock.send(self.out):]
                self.state = "head"
                self._watch(_R)
                return []
            return self._read(now)
        except ssl.SSLWantReadError:
            self._watch(_R)
        except (ssl.SSLWantWriteError, BlockingIOError):
            self._watch(_W)
        except httptools.HttpParserError as exc:
            return self._lost(f"malformed answer from {self.api.base_url}: {exc}")
        except (OSError, ValueError) as exc:
            return self._lost(f"{type(exc).__name__}: {exc}")
        return []

    def _read(self, now: float) -> list[tuple]:
        answer = self.answer
        assert answer is not None
        notes: list[tuple] = []
        budget = READ_BUDGET
        while budget > 0 or tls_pending(self.sock):
            try:
                chunk = self.sock.recv(min(_READ, budget) if budget > 0 else _READ)
            except (BlockingIOError, ssl.SSLWantReadError):
                break
            self.last_read_at = now
            self.bytes_read += len(chunk)
            if not chunk:
                notes += self._progress()
                if self.sock is not None:
                    notes += self._lost("the server closed the events stream")
                return notes
            if not answer.head_done:
                self.head_bytes += len(chunk)
                if self.head_bytes > MAX_HEAD:
                    return self._lost(f"the events answer's headers are over {MAX_HEAD} bytes")
            budget -= len(chunk)
            answer.parser.feed_data(chunk)
            notes += self._progress()
            if self.sock is None:
                return notes
        self._watch(_R)  # more may be waiting: the selector says so again at the next turn
        return notes

    def _progress(self) -> list[tuple]:
        """Notes for what the parser completed since the last call."""
        answer = self.answer
        assert answer is not None
        notes: list[tuple] = []
        if answer.head_done and self.state == "head":
            if answer.streaming:
                self.state = "streaming"
                notes.append(("open",))
                if self.api.on_request is not None:
                    self.api.on_request("events", 200, self.last_read_at - self.opened_at)
            elif not answer.ended:
                return notes  # read the error body to its end first
        if answer.events:
            notes += [("event", name, data) for name, data in answer.events]
            answer.events = []
        if answer.ended:
            if self.state == "streaming":
                return notes + self._lost("the server ended the events stream")
            if self.api.on_request is not None:
                self.api.on_request("events", answer.status, self.last_read_at - self.opened_at)
            message = bytes(answer.error_body[:300]).decode("utf-8", "replace")
            self.close()
            notes.append(("refused", answer.status, message))
        return notes


class Resolver:
    """The API host's addresses for a stream whose loop has no REST client to share them: looked up on a
    helper thread (never on the loop), with back-off after a failure; calling it answers None until known."""

    def __init__(self, host: str, port: int, wake_fd: int):
        self.host, self.port, self.wake_fd = host, port, wake_fd
        self.addrs: list | None = None
        self._busy = False
        self._failures = 0
        self._after = 0.0
        if _is_local(host):
            self._lookup()

    def __call__(self) -> list | None:
        if self.addrs is None and not self._busy and time.monotonic() >= self._after:
            self._busy = True
            threading.Thread(target=self._work, name="resolve-events", daemon=True).start()
        return self.addrs

    def _lookup(self) -> None:
        try:
            self.addrs = socket.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM)
        except OSError:
            self._failures += 1
            self._after = time.monotonic() + backoff(self._failures, 0.5, 30.0)

    def _work(self) -> None:
        self._lookup()
        self._busy = False
        try:
            os.write(self.wake_fd, b"\0")
        except OSError:
            pass
