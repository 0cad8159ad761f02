"""The dev server's HTTP/1.1 transport: requests framed by httptools (llhttp), one I/O thread, a handler pool.

Contract:
- One selector thread accepts, reads and frames every connection. A stalled or slow client costs a
  socket and a parser, never a thread, so /health keeps answering while hundreds of clients stall.
- A request reaches the app only once llhttp has framed it completely and every check passed. The
  first violation is answered once, in order behind the connection's earlier requests, and the
  connection is closed; nothing after the offending bytes is parsed:
    400 BAD_REQUEST      malformed framing: request line, header syntax (whitespace before a colon,
                         obs-fold, bare LF), Content-Length not plain digits or repeated, chunk size
                         not hex, chunk CRLF missing, Content-Length together with Transfer-Encoding
    501                  a transfer coding other than `chunked`
    505                  an HTTP version other than 1.0 / 1.1
    414 / 431            request line / header section over `max_header_bytes`
    400 INVALID_JSON     body over `max_body_bytes` (a chunked body is cut off as it streams)
    408 REQUEST_TIMEOUT  a request not complete `request_timeout` s after its first byte
- Beyond `max_connections` open connections a new one is answered 503 SERVICE_UNAVAILABLE with
  `Retry-After: 1` and closed (not held in the accept queue, so a client learns at once).
- A keep-alive connection idle for `idle_timeout` s is closed without an answer.
- Complete requests run on a pool of threads, grown on demand up to `max_connections` and retired
  when idle; one connection's requests run one at a time and are answered in order. The thread
  that answered keeps the socket for KEEP_SOCKET s and reads the next request itself, so a busy
  keep-alive client costs no hand-off per request; then the socket goes back to the selector, so a
  slow or stalled client holds a thread for KEEP_SOCKET s after an answer at most.
- Closing after an answer: shut the write side, then drain and discard what the client still sends
  for up to LINGER s, so it reads the answer rather than a reset.
"""

from __future__ import annotations

import queue
import re
import resource
import select
import selectors
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import parse_qs

import httptools

from supervisor import exactjson

from .errors import HttpError, body_too_large, http_error

RECV_SIZE = 65536
SWEEP_EVERY = 0.25  # seconds between timeout sweeps: the precision of every timeout
LINGER = 2.0  # seconds a closing connection is drained before it is closed
WRITE_TIMEOUT = 30.0  # seconds an answer may take to leave (a client that does not read)
KEEP_SOCKET = 0.1  # seconds a pool thread that has answered waits on the socket for the next request: a
# worker's connection that asks again within it (a complete per job of tens of ms) skips the selector round
# (two thread wake-ups and a pipe write): 25-40% of the server's CPU per request at 100 requests/s
REFUSED_MAX = 64  # refused (503) connections lingering at once; beyond, they are closed at once
FD_RESERVE = 64  # file descriptors kept for the database, logs and the listener
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
REASONS = {200: "OK", 201: "Created", 204: "No Content", 400: "Bad Request", 401: "Unauthorized",
           403: "Forbidden", 404: "Not Found", 405: "Method Not Allowed", 408: "Request Timeout",
           409: "Conflict", 413: "Payload Too Large", 414: "URI Too Long", 422: "Unprocessable Entity",
           429: "Too Many Requests", 431: "Request Header Fields Too Large", 500: "Internal Server Error",
           501: "Not Implemented", 503: "Service Unavailable", 505: "HTTP Version Not Supported"}
_TE_LINE = re.compile(rb"(?im)^transfer-encoding[ \t]*:([^\r\n]*)")
_WAKE = object()


@dataclass
class Limits:
    max_connections: int = 1024
    request_timeout: float = 5.0
    idle_timeout: float = 30.0
    max_header_bytes: int = 16384
    max_body_bytes: int = 2 * 1024 * 1024


class Request:
    """One framed request: method, path, query (dict of lists), headers (lower-case names, first wins),
    body (bytes); `org` and `params` are the app's."""

    __slots__ = ("method", "path", "query", "headers", "body", "org", "params", "key")
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: bytes
    org: str | None
    params: dict[str, str]
    key: object  # the app's record of who is calling (an API key or a JWT), or None


Serve = Callable[[Request], tuple[int, object, dict, bool]]  # -> (status, JSON-able body or None, headers, cut?)


class _Reject(Exception):
    """Raised from a parser callback: answer `error`, then close."""

    def __init__(self, error: HttpError):
        super().__init__(error.body["message"])
        self.error = error


class Raw:
    """An answer body sent as these bytes with this Content-Type (a page or an asset), not as JSON."""

    __slots__ = ("data", "content_type")

    def __init__(self, data: bytes, content_type: str):
        self.data, self.content_type = data, content_type


def render(status: int, body, headers: dict, close: bool, head_only: bool = False) -> tuple[bytes, bytes]:
    """(status line + headers, body bytes) of an answer; JSON body (or a Raw one), exact Content-Length."""
    raw = isinstance(body, Raw)
    payload = b"" if body is None or status == 204 else body.data if raw else exactjson.dumps(body)
    lines = [f"HTTP/1.1 {status} {REASONS.get(status, 'Unknown')}"]
    if status != 204:
        if body is not None:
            lines.append(f"Content-Type: {body.content_type}" if raw else "Content-Type: application/json")
        lines.append(f"Content-Length: {len(payload)}")
    for k, v in headers.items():
        lines.append(f"{k}: {v}")
    if close:
        lines.append("Connection: close")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head, (b"" if head_only else payload)


class Streamed:
    """A handler's answer body written over time by `pump(send, gone)` on the answering thread: `send(bytes)`
    writes one chunk's bytes (False once the client is gone or too slow), `gone()` says the client left or
    the server stops. The answer is chunked and its connection closes when `pump` returns."""

    def pump(self, send: Callable[[bytes], bool], gone: Callable[[], bool]) -> None:
        raise NotImplementedError


class Upgrade:
    """A handler's answer that switches protocols (a WebSocket): `head(headers)` is written as is, then
    `run(sock, gone)` owns the raw non-blocking socket on the answering thread (the I/O thread no longer
    reads it) until it returns; then the connection closes. `gone()` says the server stops."""

    def head(self, headers: dict) -> bytes:
        raise NotImplementedError

    def run(self, sock: socket.socket, gone: Callable[[], bool]) -> None:
        raise NotImplementedError

    def abandon(self) -> None:
        """Called instead of `run` when the head could not be written: release what the answer holds."""


def stream_head(status: int, headers: dict) -> bytes:
    lines = [f"HTTP/1.1 {status} {REASONS.get(status, 'Unknown')}", "Content-Type: text/event-stream",
             "Cache-Control: no-cache", "Transfer-Encoding: chunked", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def error_bytes(e: HttpError) -> bytes:
    head, payload = render(e.status, e.body, e.headers, close=True)
    return head + payload


def _check_codings(values: list[str]) -> None:
    codings = [c.strip().lower() for v in values for c in v.split(",")]
    unknown = [c for c in codings if c != "chunked"]
    if unknown:
        raise _Reject(http_error(501, f"Transfer-Encoding {unknown[0]!r} is not implemented; only chunked is"))


def classify(exc: Exception, data: bytes) -> HttpError:
    """The answer to an llhttp error (`data`: the bytes being parsed when it struck)."""
    msg = str(exc)
    if isinstance(exc, httptools.HttpParserInvalidMethodError):
        return http_error(400, "Malformed HTTP request line: unknown method")
    if "HTTP version" in msg or "PRI/Upgrade" in msg:
        return http_error(505, "Only HTTP/1.0 and HTTP/1.1 are served")
    if "Transfer-Encoding" in msg and "Content-Length" not in msg:
        try:
            _check_codings([m.decode("latin-1") for m in _TE_LINE.findall(data)])
        except _Reject as r:
            return r.error
    return http_error(400, f"Malformed HTTP request: {msg}")


class _Framer:
    """httptools callbacks for one connection: builds each Request, checks every cap, queues it on the conn."""

    __slots__ = ("conn", "limits", "parser", "url", "headers", "te", "body", "body_bytes", "head_bytes",
                 "raw_head", "in_head")
    url: bytes
    headers: dict[str, str]
    te: list[str]  # every Transfer-Encoding value
    body: list[bytes]

    def __init__(self, conn: _Conn, limits: Limits):
        self.conn, self.limits = conn, limits
        self.parser = httptools.HttpRequestParser(self)
        self.in_head = False

    def on_message_begin(self) -> None:
        self.url, self.headers, self.te, self.body = b"", {}, [], []
        self.body_bytes = self.head_bytes = self.raw_head = 0
        self.in_head = True
        self.conn.msg_started = time.monotonic()

    def on_url(self, url: bytes) -> None:
        self.url += url
        self.head_bytes += len(url)
        if self.head_bytes > self.limits.max_header_bytes:
            raise _Reject(http_error(414, f"Request line longer than {self.limits.max_header_bytes} bytes"))

    def on_header(self, name: bytes, value: bytes) -> None:
        self.head_bytes += len(name) + len(value) + 4
        if self.head_bytes > self.limits.max_header_bytes:
            raise _Reject(http_error(431, f"Request headers larger than {self.limits.max_header_bytes} bytes"))
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1").strip(" \t")
        if key == "transfer-encoding":
            self.te.append(text)
        self.headers.setdefault(key, text)

    def on_headers_complete(self) -> None:
        self.in_head = False
        if self.parser.get_http_version() not in ("1.1", "1.0"):
            raise _Reject(http_error(505, "Only HTTP/1.0 and HTTP/1.1 are served"))
        if self.te:
            _check_codings(self.te)
        length = int(self.headers.get("content-length") or 0)  # llhttp let through digits only
        if length > self.limits.max_body_bytes:
            raise _Reject(body_too_large(self.limits.max_body_bytes))
        if ((length or self.te) and self.headers.get("expect", "").lower() == "100-continue"
                and self.parser.get_http_version() == "1.1"):
            self.conn.queue(None, CONTINUE, False)

    def on_body(self, chunk: bytes) -> None:
        self.body_bytes += len(chunk)
        if self.body_bytes > self.limits.max_body_bytes:
            raise _Reject(body_too_large(self.limits.max_body_bytes))
        self.body.append(chunk)

    def on_message_complete(self) -> None:
        self.conn.msg_started = None
        p = self.parser
        req = Request()
        path, _, qs = self.url.decode("latin-1").partition("?")
        if path.startswith("//"):
            path = "/" + path.lstrip("/")
        req.method, req.path, req.query = p.get_method().decode("ascii"), path, parse_qs(qs) if qs else {}
        req.headers, req.body, req.org, req.params, req.key = self.headers, b"".join(self.body), None, {}, None
        self.conn.queue(req, None, not p.should_keep_alive() or p.should_upgrade())


class _Conn:
    """One client connection: the loop thread reads and frames it; one pool thread at a time answers it.

    `busy` (under `lock`) is set only by the loop thread when it hands the connection to the pool and
    cleared by the pool thread when its queue is empty, so the loop never closes a socket being written.
    `owned` (under `lock`, only while busy): the pool thread reads and parses the socket, and the loop
    has taken it out of the selector; exactly one thread uses the parser at any time.
    """

    __slots__ = ("server", "sock", "fd", "framer", "lock", "pending", "busy", "owned", "closing", "discarding",
                 "peer_closed", "registered", "counted", "msg_started", "last_done", "close_at", "upgraded")

    def __init__(self, server: Server, sock: socket.socket, now: float, counted: bool = True):
        self.server, self.sock, self.fd, self.counted = server, sock, sock.fileno(), counted
        self.framer = _Framer(self, server.limits)
        self.lock = threading.Lock()
        self.pending: deque = deque()
        self.busy = self.owned = self.closing = self.discarding = self.peer_closed = self.registered = False
        self.upgraded = False  # a pool thread speaks another protocol on the socket: the loop must not read it
        self.msg_started: float | None = None
        self.last_done = now
        self.close_at: float | None = None

    def queue(self, req: Request | None, data: bytes | None, close: bool) -> None:
        """Queue a request (or raw bytes) to answer; hand the connection to the pool if it is not busy."""
        with self.lock:
            if self.closing:
                return
            self.pending.append((req, data, close))
            start, self.busy = not self.busy, True
        if start:
            self.server.pool.submit(self)

    def reject(self, error: HttpError) -> None:
        """Stop parsing; answer `error` after the queued answers, then close."""
        self.msg_started = None
        self.discarding = True
        self.queue(None, error_bytes(error), True)

    def feed(self, data: bytes) -> None:
        """Parse what arrived (the loop thread, or the pool thread that owns the socket)."""
        framer = self.framer
        try:
            framer.parser.feed_data(data)
        except httptools.HttpParserUpgrade:  # the request before it is queued with close=True
            self.discarding = True
        except httptools.HttpParserCallbackError as e:
            cause = e.__context__
            if isinstance(cause, _Reject):
                self.reject(cause.error)
            else:
                print(f"warning: HTTP framing error: {cause!r}", file=sys.stderr, flush=True)
                self.reject(http_error(500, "An internal error occurred"))
        except httptools.HttpParserError as e:
            self.reject(classify(e, data))
        else:
            if framer.in_head:  # llhttp buffers a header name or value until its end: cap that too
                framer.raw_head += len(data)
                if framer.raw_head > framer.limits.max_header_bytes + RECV_SIZE:
                    self.reject(http_error(431, f"Request headers larger than {framer.limits.max_header_bytes} "
                                           "bytes"))


class _Pool:
    """Threads that answer connections' queued requests: grown on demand up to `limit`, retired when idle."""

    def __init__(self, run: Callable[[_Conn], None], limit: int, idle_exit: float = 30.0):
        self._run, self._limit, self._idle_exit = run, limit, idle_exit
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._idle = threading.Semaphore(0)  # one token per thread waiting for work
        self._lock = threading.Lock()
        self.threads = 0

    def submit(self, conn: _Conn) -> None:
        self._queue.put(conn)
        if self._idle.acquire(blocking=False):
            return
        with self._lock:
            if self.threads >= self._limit:
                return
            self.threads += 1
        threading.Thread(target=self._work, name="devserver-handler", daemon=True).start()

    def _work(self) -> None:
        while True:
            try:
                conn = self._queue.get(timeout=self._idle_exit)
            except queue.Empty:
                if self._idle.acquire(blocking=False):  # no submitter counted on this thread: retire
                    with self._lock:
                        self.threads -= 1
                    return
                continue
            try:
                self._run(conn)
            except Exception as e:  # never lose a pool thread
                print(f"warning: connection handler failed: {e!r}", file=sys.stderr, flush=True)
            self._idle.release()


def send_all(sock: socket.socket, data: bytes, deadline: float) -> bool:
    """Write all of `data` to a non-blocking socket by `deadline`; False if the client is gone or too slow."""
    view = memoryview(data)
    poller = None
    while view:
        try:
            view = view[sock.send(view):]
        except (BlockingIOError, InterruptedError):
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if poller is None:
                poller = select.poll()
                poller.register(sock, select.POLLOUT)
            poller.poll(left * 1000)
        except OSError:
            return False
    return True


def fit_fd_limit(max_connections: int) -> int:
    """Raise the soft open-file limit to fit `max_connections` if the hard limit allows; the cap that fits."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = max_connections + REFUSED_MAX + FD_RESERVE
    if soft != resource.RLIM_INFINITY and soft < need:
        target = need if hard == resource.RLIM_INFINITY else min(need, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    if soft == resource.RLIM_INFINITY:
        return max_connections
    return max(1, min(max_connections, soft - REFUSED_MAX - FD_RESERVE))


class Server:
    """The listening socket and the I/O loop: `serve_forever` runs it, `shutdown` (another thread) stops it."""

    def __init__(self, serve: Serve, host: str, port: int, limits: Limits):
        self.serve, self.limits = serve, limits
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.listener.bind((host, port))
            self.listener.listen(min(max(limits.max_connections, 128), 4096))
        except OSError:
            self.listener.close()
            raise
        self.listener.setblocking(False)
        self.server_address = self.listener.getsockname()
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.listener, selectors.EVENT_READ, None)
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self.sel.register(self._wake_r, selectors.EVENT_READ, _WAKE)
        self._resume: queue.SimpleQueue = queue.SimpleQueue()
        self.conns: dict[int, _Conn] = {}
        self.active = 0  # open connections that count against max_connections
        self.pool = _Pool(self._answer, limits.max_connections)
        self._stop = threading.Event()
        self._stopped = threading.Event()
        self._stopped.set()
        self._accept_paused_until = 0.0

    # ---------- the loop thread ----------
    def serve_forever(self, poll_interval: float = SWEEP_EVERY) -> None:
        self._stopped.clear()
        try:
            next_sweep = 0.0
            while not self._stop.is_set():
                for key, _ in self.sel.select(min(poll_interval, SWEEP_EVERY)):
                    if key.data is None:
                        self._accept()
                    elif key.data is _WAKE:
                        self._on_wake()
                    else:
                        self._on_readable(key.data)
                now = time.monotonic()
                if now >= next_sweep:
                    self._sweep(now)
                    next_sweep = now + SWEEP_EVERY
        finally:
            self._stopped.set()

    def _accept(self) -> None:
        now = time.monotonic()
        for _ in range(64):
            try:
                sock, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:  # out of file descriptors: stop accepting until the next sweep
                print(f"warning: accept failed: {e}", file=sys.stderr, flush=True)
                self.sel.unregister(self.listener)
                self._accept_paused_until = now + SWEEP_EVERY
                return
            sock.setblocking(False)
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
            if self.active >= self.limits.max_connections:
                self._refuse(sock, now)
                continue
            conn = _Conn(self, sock, now)
            self.conns[conn.fd] = conn
            self.active += 1
            self.register(conn)

    def _refuse(self, sock: socket.socket, now: float) -> None:
        """503 and close, draining briefly so the client reads it; beyond REFUSED_MAX just close."""
        if len(self.conns) - self.active >= REFUSED_MAX:
            sock.close()
            return
        error = http_error(503, f"Too many connections (the cap is {self.limits.max_connections}); retry later",
                           headers={"Retry-After": "1"})
        try:
            sock.send(error_bytes(error))
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            sock.close()
            return
        conn = _Conn(self, sock, now, counted=False)
        conn.closing = conn.discarding = True
        conn.close_at = now + 1.0
        self.conns[conn.fd] = conn
        self.register(conn)

    def _on_readable(self, conn: _Conn) -> None:
        if conn.upgraded:
            self.unregister(conn)
            return
        try:
            data = conn.sock.recv(RECV_SIZE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            conn.peer_closed = True
            self.unregister(conn)
            if not conn.busy:
                self._close(conn)
            return  # else the sweep closes it once its answers are written
        if conn.discarding or conn.closing:
            return
        conn.feed(data)
        with conn.lock:  # the pool thread answering it reads the next requests itself
            hand = conn.busy and not conn.owned and not conn.discarding
            conn.owned = conn.owned or hand
        if hand:
            self.unregister(conn)

    def _on_wake(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except (BlockingIOError, InterruptedError):
            pass
        while True:
            try:
                conn = self._resume.get_nowait()
            except queue.Empty:
                return
            with conn.lock:
                back = not (conn.owned or conn.peer_closed) and self.conns.get(conn.fd) is conn
            if back:
                self.register(conn)

    def _sweep(self, now: float) -> None:
        """Timeouts: 408 for a request too slow to arrive, close idle and finished connections."""
        if self._accept_paused_until and now >= self._accept_paused_until:
            self._accept_paused_until = 0.0
            self.sel.register(self.listener, selectors.EVENT_READ, None)
        lim = self.limits
        for conn in list(self.conns.values()):
            started = conn.msg_started
            if started is not None and now - started > lim.request_timeout and not conn.discarding:
                conn.reject(http_error(408, f"Request not complete within {lim.request_timeout:g} s"))
            if conn.busy:
                continue
            if conn.peer_closed or (conn.close_at is not None and now >= conn.close_at):
                self._close(conn)
            elif (not conn.closing and not conn.discarding and started is None and not conn.pending
                  and now - conn.last_done > lim.idle_timeout):
                self._close(conn)

    def register(self, conn: _Conn) -> None:
        if not conn.registered:
            self.sel.register(conn.sock, selectors.EVENT_READ, conn)
            conn.registered = True

    def unregister(self, conn: _Conn) -> None:
        if conn.registered:
            self.sel.unregister(conn.sock)
            conn.registered = False

    def _close(self, conn: _Conn) -> None:
        self.unregister(conn)
        if self.conns.get(conn.fd) is conn:
            del self.conns[conn.fd]
            if conn.counted:
                self.active -= 1
        conn.closing = True
        conn.framer = None  # type: ignore[assignment]  # breaks the parser <-> framer cycle
        try:
            conn.sock.close()
        except OSError:
            pass

    # ---------- pool threads ----------
    def _answer(self, conn: _Conn) -> None:
        try:
            self._answer_queue(conn)
        except Exception as e:  # a bug must not leave the connection busy (its client waiting) forever
            print(f"warning: connection handler failed: {e!r}", file=sys.stderr, flush=True)
            self._finish(conn, socket.SHUT_RDWR)

    def _answer_queue(self, conn: _Conn) -> None:
        """Answer the connection's queued requests in order, reading the next ones while this thread owns the
        socket, until there is nothing to answer or the connection must close."""
        poller = select.poll()
        poller.register(conn.fd, select.POLLIN)
        keep_until = 0.0  # this thread reads the socket until KEEP_SOCKET s after its last answer
        while True:
            with conn.lock:
                item = conn.pending.popleft() if conn.pending and not conn.closing else None
            if item is None:
                if self._read_next(conn, poller, keep_until) or not self._release(conn):
                    continue
                return
            req, data, close = item
            cut = False
            if req is not None:
                data, close, cut, stream = self._respond(req, close)
                if isinstance(stream, Upgrade):
                    self._upgrade(conn, data, stream)
                    return
                if stream is not None:
                    self._stream(conn, data, stream)
                    return
            ok = send_all(conn.sock, data, time.monotonic() + WRITE_TIMEOUT)
            conn.last_done = time.monotonic()
            keep_until = conn.last_done + KEEP_SOCKET
            if close or not ok:
                self._finish(conn, socket.SHUT_RDWR if cut or not ok else socket.SHUT_WR)
                return

    def _read_next(self, conn: _Conn, poller: select.poll, until: float) -> bool:
        """If this thread owns the socket: wait until `until` for bytes and parse them; True if some came."""
        left = until - time.monotonic()
        if left <= 0 or not conn.owned or conn.discarding or conn.closing or conn.peer_closed:
            return False
        if not poller.poll(left * 1000):
            return False
        try:
            data = conn.sock.recv(RECV_SIZE)
        except (BlockingIOError, InterruptedError):
            return True
        except OSError:
            data = b""
        if not data:
            conn.peer_closed = True  # the sweep closes it
            return False
        conn.feed(data)
        return True

    def _release(self, conn: _Conn) -> bool:
        """Done with the connection unless requests came meanwhile (then False); the socket goes back to the loop."""
        with conn.lock:
            if conn.pending and not conn.closing:
                return False
            conn.busy = False
            give_back, conn.owned = conn.owned, False
        if give_back:
            self._give_back(conn)
        return True

    def _give_back(self, conn: _Conn) -> None:
        self._resume.put(conn)
        try:
            self._wake_w.send(b"\0")
        except OSError:
            pass

    def _respond(self, req: Request, close: bool) -> tuple[bytes, bool, bool, Streamed | Upgrade | None]:
        """(answer bytes, close after?, cut?, None) for one request; for a streamed or upgraded answer (head
        bytes, True, False, its body)."""
        try:
            status, body, headers, cut = self.serve(req)
            if isinstance(body, Upgrade):
                return body.head(headers), True, False, body
            if isinstance(body, Streamed):
                return stream_head(status, headers), True, False, body
            head, payload = render(status, body, headers, close or cut, req.method == "HEAD")
        except Exception as e:  # never leak a stack trace to the client
            print(f"warning: internal error on {req.method} {req.path}: {e!r}", file=sys.stderr, flush=True)
            return error_bytes(http_error(500, "An internal error occurred")), True, False, None
        if cut:  # injected fault: the headers and half the body, then the socket closes
            return head + payload[: len(payload) // 2], True, True, None
        return head + payload, close, False, None

    def _stream(self, conn: _Conn, head: bytes, body: Streamed) -> None:
        """Write a streamed answer (chunked) on this thread until it ends or the client goes; then close."""
        poller = select.poll()
        poller.register(conn.fd, select.POLLIN)

        def send(data: bytes) -> bool:
            return send_all(conn.sock, data, time.monotonic() + WRITE_TIMEOUT)

        def gone() -> bool:
            if conn.peer_closed or conn.closing or self._stop.is_set():
                return True
            if conn.owned and poller.poll(0):  # this thread reads the socket: bytes or the end
                try:
                    return not conn.sock.recv(RECV_SIZE)
                except (BlockingIOError, InterruptedError):
                    return False
                except OSError:
                    return True
            return False

        if send(head):
            body.pump(send, gone)
            send(b"0\r\n\r\n")
        else:
            body.pump(send, lambda: True)  # ends at once, releasing what the body holds
        conn.last_done = time.monotonic()
        self._finish(conn, socket.SHUT_WR)

    def _upgrade(self, conn: _Conn, head: bytes, body: Upgrade) -> None:
        """Write the 101 head, then hand the raw socket to `body.run` on this thread; close when it returns."""
        with conn.lock:
            conn.upgraded = True  # from now on the loop takes the socket out of its selector instead of reading
        try:
            if send_all(conn.sock, head, time.monotonic() + WRITE_TIMEOUT):
                body.run(conn.sock, self._stop.is_set)
            else:
                body.abandon()
        finally:
            with conn.lock:
                conn.upgraded = False
            conn.last_done = time.monotonic()
            self._finish(conn, socket.SHUT_WR)

    def _finish(self, conn: _Conn, how: int) -> None:
        """Stop answering; shut the socket (`how`); the loop drains it and closes it (sweep or EOF)."""
        with conn.lock:
            conn.closing = True
            conn.pending.clear()
        try:
            conn.sock.shutdown(how)
        except OSError:
            pass
        conn.close_at = time.monotonic() + (0.0 if how == socket.SHUT_RDWR else LINGER)
        with conn.lock:
            conn.busy = False
            give_back, conn.owned = conn.owned, False
        if give_back:  # the loop drains it until the client closes or LINGER passes
            self._give_back(conn)

    # ---------- any thread ----------
    def shutdown(self) -> None:
        """Stop serve_forever and wait for it to return."""
        self._stop.set()
        try:
            self._wake_w.send(b"\0")
        except OSError:
            pass
        self._stopped.wait()

    def server_close(self) -> None:
        for conn in list(self.conns.values()):
            try:
                conn.sock.close()
            except OSError:
                pass
        self.conns.clear()
        for s in (self.listener, self._wake_r, self._wake_w):
            s.close()
        self.sel.close()
