"""API calls driven by the parent's loop on non-blocking sockets: no thread hand-offs, no waits.

The loop registers nothing itself: `LoopHTTP` registers each connection's socket in the loop's
selector with data `("http", conn)`; the loop passes those events to `on_ready`, calls
`expire(now)` each turn, and collects finished calls from `done()` as `(tag, result, error)`
triples, where `error` is an `ApiError` (network trouble is `Unavailable`). Every call has a
deadline of the API timeout, connecting and TLS included. Host names other than IP literals
and localhost are resolved on a helper thread, so DNS never blocks the loop either.

Answers are framed incrementally by each connection's `ResponseReader` (llhttp, see httpconn): a
body is never re-parsed, an answer may arrive a byte at a time, interim 1xx answers are skipped.
A malformed answer closes its connection and fails the call as `Unavailable` (code BAD_FRAMING),
which the parent retries like any network error; the next call opens a fresh connection.
"""

from __future__ import annotations

import collections
import errno
import ipaddress
import os
import selectors
import socket
import ssl
import threading
import time
from typing import Any

from supervisor.backoff import backoff
from supervisor.client.calls import ApiError, Call, Endpoint, Unavailable, decode, network_error
from supervisor.client.httpconn import FramingError, Response, ResponseReader, build_request, header_block

_READ = 65536
READ_BUDGET = 256 * 1024  # bytes read from one connection per turn of the loop at most: a huge or endless
# answer is read over several turns, so no API peer holds the loop
_R, _W = selectors.EVENT_READ, selectors.EVENT_WRITE


def tls_pending(sock: object) -> bool:
    """Decrypted bytes wait inside a TLS socket (at most a record): the selector will not report them, so
    a reader that stops at its budget reads those first."""
    return isinstance(sock, ssl.SSLSocket) and sock.pending() > 0


class _Conn:
    __slots__ = ("sock", "state", "tag", "call", "out", "reader", "started", "deadline", "reused", "resent", "events")

    def __init__(self) -> None:
        # The socket (an ssl.SSLSocket after the handshake) and the call it carries are there whenever the
        # state says so: every method below runs only in a state that has them.
        self.sock: Any = None
        self.state = "closed"  # connecting -> handshake -> sending -> receiving -> idle
        self.tag: Any = None
        self.call: Any = None
        self.out = memoryview(b"")
        self.reader = ResponseReader()
        self.started = self.deadline = 0.0
        self.reused = self.resent = False
        self.events = 0


class LoopHTTP:
    def __init__(self, api: Endpoint, sel: selectors.BaseSelector, wake_fd: int, max_connections: int = 4):
        self.api = api
        self.sel = sel
        self.wake_fd = wake_fd
        self.max_connections = max_connections
        self.queue: collections.deque = collections.deque()  # (tag, call, deadline) waiting for a connection
        self._queue_bound = float("inf")  # no queued call's deadline is earlier (exact after each expiry scan)
        self.conns: list[_Conn] = []
        self.results: list[tuple] = []
        self.fixed_headers = header_block(api.host if api.port in (80, 443) else f"{api.host}:{api.port}", api.headers)
        self.addrs: list | None = None
        self.resolve_error: Exception | None = None
        self._resolving = False
        self._resolve_failures = 0
        self._resolve_after = 0.0
        self._next_addr = 0
        if _is_local(api.host):
            self._resolve()

    # ------------------------------------------------------------- interface
    def submit(self, tag: Any, call: Call, first: bool = False) -> None:
        """Queue a call (`first` puts it ahead of the others) and send it now if a connection is free."""
        now = time.monotonic()
        item = (tag, call, now + self.api.timeout)
        self._queue_bound = min(self._queue_bound, item[2])
        if first:
            self.queue.appendleft(item)
        else:
            self.queue.append(item)
        self.pump(now)

    def has_answers(self) -> bool:
        return bool(self.results)

    def done(self) -> list[tuple]:
        out, self.results = self.results, []
        return out

    def next_deadline(self) -> float | None:
        times = [c.deadline for c in self.conns if c.call is not None]
        if self.queue:
            times.append(self._queue_bound)  # never later than the first queued call's deadline
        return min(times) if times else None

    def expire(self, now: float) -> None:
        """Fail every call whose deadline has passed, then send what waits."""
        for conn in list(self.conns):
            if conn.call is not None and now >= conn.deadline:
                self._fail(conn, Unavailable(0, "TIMEOUT",
                                             f"no answer from {self.api.base_url} within {self.api.timeout:g} s"))
        if now >= self._queue_bound:  # else no queued call can be due: skip the scan of the queue
            for item in [i for i in self.queue if now >= i[2]]:
                self.queue.remove(item)
                reason = (f"cannot resolve {self.api.host}: {self.resolve_error}" if self.resolve_error
                          else "no free connection")
                self._result(item[0], item[1], now - self.api.timeout, error=Unavailable(0, "TIMEOUT", reason))
            self._queue_bound = min((i[2] for i in self.queue), default=float("inf"))
        self.pump(now)

    def close(self) -> None:
        for conn in list(self.conns):
            self._close(conn)

    # ------------------------------------------------------------ scheduling
    def pump(self, now: float) -> None:
        """Send queued calls on idle connections, opening new ones up to the limit."""
        if not self.queue:  # the common case: called every loop turn with nothing waiting
            return
        for conn in list(self.conns):
            if not self.queue:
                return
            if conn.state == "idle":
                tag, call, deadline = self.queue.popleft()
                self._start(conn, tag, call, now, deadline)
        while self.queue and len(self.conns) < self.max_connections:
            if self.addrs is None:  # (again) after every address failed: resolve before connecting
                self._start_resolving(now)
                return
            tag, call, deadline = self.queue.popleft()
            conn = _Conn()
            self.conns.append(conn)
            conn.tag, conn.call, conn.started, conn.deadline = tag, call, now, deadline
            self._connect(conn)

    def _start(self, conn: _Conn, tag: Any, call: Call, now: float, deadline: float) -> None:
        conn.tag, conn.call, conn.started, conn.deadline = tag, call, now, deadline
        conn.reused, conn.resent = True, False
        self._send_request(conn)

    def _send_request(self, conn: _Conn) -> None:
        call = conn.call
        conn.out = memoryview(build_request(call.method, call.path, self.fixed_headers, call.body))
        conn.reader.expect()
        conn.state = "sending"
        self._on_writable(conn)

    # ------------------------------------------------------------ resolving
    def _resolve(self) -> None:
        try:
            self.addrs = socket.getaddrinfo(self.api.host, self.api.port, type=socket.SOCK_STREAM)
            self.resolve_error, self._resolve_failures = None, 0
        except OSError as exc:
            self.resolve_error = exc
            self._resolve_failures += 1
            self._resolve_after = time.monotonic() + backoff(self._resolve_failures, 0.5, 30.0)

    def _start_resolving(self, now: float) -> None:
        """Look the host name up on a helper thread (never twice at once, with back-off after a failure)."""
        if self._resolving or now < self._resolve_after:
            return
        self._resolving = True

        def work() -> None:
            self._resolve()
            self._resolving = False
            try:
                os.write(self.wake_fd, b"\0")
            except OSError:
                pass

        threading.Thread(target=work, name="resolve", daemon=True).start()

    # ------------------------------------------------------------ connection
    def _connect(self, conn: _Conn) -> None:
        assert self.addrs, "pump resolves before connecting"
        family, type_, proto, _, addr = self.addrs[self._next_addr % len(self.addrs)]
        try:
            sock = socket.socket(family, type_, proto)
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError as exc:
            return self._fail(conn, network_error(exc, self.api.base_url))
        conn.sock, conn.state, conn.reused = sock, "connecting", False
        conn.reader = ResponseReader()
        err = sock.connect_ex(addr)
        if err not in (0, errno.EINPROGRESS, errno.EAGAIN):
            self._connect_failed()
            return self._fail(conn, network_error(ConnectionRefusedError(err, os.strerror(err)), self.api.base_url))
        self.sel.register(sock, _W, ("http", conn))
        conn.events = _W

    def _watch(self, conn: _Conn, events: int) -> None:
        if events == conn.events:
            return
        conn.events = events
        try:
            self.sel.modify(conn.sock, events, ("http", conn))
        except (KeyError, ValueError):
            self.sel.register(conn.sock, events, ("http", conn))

    def on_ready(self, conn: _Conn, mask: int, now: float) -> None:
        if conn.sock is None:
            return
        try:
            if conn.state == "connecting":
                err = conn.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if err:
                    self._connect_failed()
                    raise ConnectionRefusedError(err, os.strerror(err))
                if self.api.ssl_context is not None:
                    self.sel.unregister(conn.sock)
                    conn.sock = self.api.ssl_context.wrap_socket(conn.sock, server_hostname=self.api.host,
                                                                 do_handshake_on_connect=False)
                    self.sel.register(conn.sock, _W, ("http", conn))
                    conn.events = _W
                    conn.state = "handshake"
                else:
                    self._send_request(conn)
                    return
            if conn.state == "handshake":
                conn.sock.do_handshake()
                self._send_request(conn)
            elif conn.state == "sending":
                self._on_writable(conn)
            elif conn.state in ("receiving", "idle"):
                self._on_readable(conn)
        except (ssl.SSLWantReadError, ssl.SSLWantWriteError) as want:
            self._watch(conn, _R if isinstance(want, ssl.SSLWantReadError) else _W)
        except FramingError as exc:
            self._fail(conn, Unavailable(0, "BAD_FRAMING", f"{exc} (from {self.api.base_url})"))
        except (OSError, ValueError) as exc:
            self._fail(conn, network_error(exc, self.api.base_url))

    def _on_writable(self, conn: _Conn) -> None:
        try:
            while conn.out:
                sent = conn.sock.send(conn.out)
                conn.out = conn.out[sent:]
        except (BlockingIOError, ssl.SSLWantWriteError):
            return self._watch(conn, _W)
        except ssl.SSLWantReadError:
            return self._watch(conn, _R)
        except (OSError, ValueError) as exc:
            if conn.reused and not conn.resent and conn.call.resend_on_stale:
                return self._resend(conn)
            return self._fail(conn, network_error(exc, self.api.base_url))
        conn.state = "receiving"
        self._watch(conn, _R)

    def _on_readable(self, conn: _Conn) -> None:
        if conn.state == "idle":
            return self._on_idle_readable(conn)
        reader, response, eof, budget = conn.reader, None, False, READ_BUDGET
        while response is None and (budget > 0 or tls_pending(conn.sock)):
            try:
                chunk = conn.sock.recv(_READ)
            except (BlockingIOError, ssl.SSLWantReadError):
                break
            if not chunk:
                eof = True
                break
            budget -= len(chunk)
            response = reader.feed(chunk)
        if response is None and eof:
            if not reader.started and conn.reused:
                if not conn.resent and conn.call.resend_on_stale:
                    return self._resend(conn)
                return self._fail(conn, Unavailable(0, "CONNECTION_RESET",
                                                    f"connection to {self.api.base_url} closed before the answer"))
            response = reader.feed_eof()
            if response is None:
                raise ConnectionResetError("connection closed before the answer")
        if response is None:
            return self._watch(conn, _R)  # after a TLS want-write, go back to waiting for the answer
        self._answered(conn, response, eof)

    @staticmethod
    def _more_after_answer(conn: _Conn) -> bool:
        """Bytes (or the end) already behind a whole answer: never take them for the next call's answer."""
        try:
            conn.sock.recv(1)  # a byte, or b"" for the end: either way the connection is done
        except (BlockingIOError, ssl.SSLWantReadError):
            return False
        except OSError:
            pass
        return True

    def _on_idle_readable(self, conn: _Conn) -> None:
        """Bytes or the end on a kept-alive connection between calls: the server closed it (or sent garbage)."""
        try:
            chunk = conn.sock.recv(_READ)
        except (BlockingIOError, ssl.SSLWantReadError):  # a TLS record with no data (a ticket, a key update)
            return self._watch(conn, _R)
        del chunk
        self._close(conn)

    def _answered(self, conn: _Conn, response: Response, eof: bool) -> None:
        tag, call, started = conn.tag, conn.call, conn.started
        conn.tag = conn.call = None
        if response.close or eof or self._more_after_answer(conn):
            self._close(conn)
        else:
            conn.state = "idle"
        try:
            result, error = decode(call, response), None
        except ApiError as exc:
            result, error = None, exc
        except Exception as exc:  # a 2xx the client cannot read (e.g. not the JSON shape expected)
            result, error = None, Unavailable(response.status, "BAD_ANSWER", f"unreadable answer from "
                                              f"{self.api.base_url}: {type(exc).__name__}: {exc}")
        self._result(tag, call, started, result, error, response.status)
        self.pump(time.monotonic())

    def _resend(self, conn: _Conn) -> None:
        tag, call, started, deadline = conn.tag, conn.call, conn.started, conn.deadline
        if self.addrs is None:
            return self._fail(conn, Unavailable(0, "CONNECTION_RESET", f"connection to {self.api.base_url} closed"))
        self._drop_socket(conn)
        conn.tag, conn.call, conn.started, conn.deadline, conn.resent = tag, call, started, deadline, True
        self._connect(conn)
        conn.resent = True

    def _connect_failed(self) -> None:
        """Try the next address next time; resolve the name again once all have failed."""
        self._next_addr += 1
        if self.addrs and self._next_addr % len(self.addrs) == 0 and not _is_local(self.api.host):
            self.addrs = None

    # --------------------------------------------------------------- endings
    def _result(self, tag: Any, call: Call, started: float, result: Any = None, error: ApiError | None = None,
                status: int = 0) -> None:
        self.results.append((tag, result, error))
        if self.api.on_request is not None:
            self.api.on_request(call.route, status, time.monotonic() - started)

    def _fail(self, conn: _Conn, error: ApiError) -> None:
        tag, call, started = conn.tag, conn.call, conn.started
        self._close(conn)
        if call is not None:
            self._result(tag, call, started, error=error)

    def _drop_socket(self, conn: _Conn) -> None:
        if conn.sock is not None:
            try:
                self.sel.unregister(conn.sock)
            except (KeyError, ValueError):
                pass
            try:
                conn.sock.close()
            except OSError:
                pass
        conn.sock, conn.state, conn.events = None, "closed", 0

    def _close(self, conn: _Conn) -> None:
        self._drop_socket(conn)
        conn.tag = conn.call = None
        if conn in self.conns:
            self.conns.remove(conn)


def _is_local(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return False
