"""The health/metrics HTTP endpoint (`--health-port`): /healthz, /readyz, /metrics, /status.

/healthz (liveness) fails only when the main loop stops turning; /readyz (readiness) fails while the
daemon is not registered, is draining, or has not heard from the API lately. An API outage therefore
shows in /readyz, /status and /metrics, never in /healthz.

POST /drain (from loopback only: the port is often bound to every address in a pod) asks the daemon
to drain and hand its reserve back; `python -m supervisor drain` sends it.

One daemon thread serves every connection without blocking (a selector): it holds at most
`MAX_CONNECTIONS` (a new one closes the oldest), gives each request `REQUEST_TIMEOUT` seconds to arrive
whole (head and body, also between kept-alive requests) and its answer as long to leave, then closes the
connection. Idle or half-sent connections therefore cost a descriptor each, never a thread, and cannot
keep answers from others. Every request calls `snapshot()` (or renders the metrics) on that thread.
The daemon's loop publishes a frozen `Published` snapshot (at most every
100 ms, and at once when its phase changes); `snapshot()` reads the last one and computes its ages at
read time from the monotonic stamps it carries, so a stuck loop shows ever older ages and nothing here
touches the loop's parts or waits on a lock the loop may hold: /healthz exists to notice a stuck loop.
A failing snapshot gives a 500 JSON answer; the server keeps running.
"""

from __future__ import annotations

import io
import ipaddress
import json
import logging
import selectors
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler

from supervisor.ops import statuspage
from supervisor.ops.metrics import CONTENT_TYPE, DaemonMetrics

log = logging.getLogger(__name__)

Snapshot = Callable[[], dict]  # /status's document, as `Published.status` makes it

MAX_CONNECTIONS = 64  # client connections held at once; a new one closes the oldest
REQUEST_TIMEOUT = 5.0  # seconds for a request's head and body to arrive whole, and for its answer to leave
MAX_HEAD_BYTES = 16384
MAX_BODY_BYTES = 65536  # a POST's body is read and ignored
READ_CHUNK = 65536
ACCEPT_BATCH = 64
SERVE_TICK = 0.1  # how often the serving thread looks at its stop flag


@dataclass(frozen=True)
class Published:
    """What the daemon's loop published for /status, /healthz and the gauges: plain data built by the loop
    (never changed after), and the monotonic stamps the ages are computed from at read time.

    `fields` holds /status's keys in order (the ages as placeholders); `children` each child's row (its
    `job_runtime_secs` a placeholder) with when its job started (None: no job running)."""

    fields: Mapping[str, object]
    children: tuple[tuple[Mapping[str, object], float | None], ...]
    loop_at: float  # when the loop last turned
    started_at: float  # when the daemon started
    api_ok_at: float | None  # when the API last answered (None: never yet)
    children_up_at: float  # when a child was last up (idle or busy)

    def status(self, now: float) -> dict:
        """/status's document at `now` (time.monotonic()): the published data with its ages."""
        out = dict(self.fields)
        api_ok_at = self.api_ok_at
        out["loop_age_secs"] = round(now - self.loop_at, 3)
        out["api_age_secs"] = None if api_ok_at is None else round(now - api_ok_at, 3)
        out["api_silence_secs"] = round(now - (self.started_at if api_ok_at is None else api_ok_at), 3)
        out["children_down_secs"] = round(now - self.children_up_at, 3)
        rows = []
        for row, job_started_at in self.children:
            rows.append({**row, "job_runtime_secs": None if job_started_at is None else round(now - job_started_at, 3)})
        out["children"] = rows
        if "failing" in out:  # slots whose child keeps failing to start: when each tries again, as an age
            out["failing"] = [{k: v for k, v in {**row, "retry_in_secs": None if row.get("retry_at") is None else
                                                 round(max(0.0, float(row["retry_at"]) - now), 3)}.items()
                               if k != "retry_at"} for row in out["failing"]]  # type: ignore[attr-defined]
        return out
ROUTES = ["/healthz", "/readyz", "/metrics", "/status", "POST /drain"]


def is_loopback_client(address: str) -> bool:
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return (mapped or ip).is_loopback


def liveness(snap: dict, max_loop_age: float, max_children_down: float) -> str | None:
    """None when live; else why not. Live means the main loop turns (it reaps, replaces and feeds the
    children) and, unless draining, some child has been up within `max_children_down` seconds (the pool
    can start them). Nothing about the API: a restart cannot mend an outage."""
    loop_age = snap.get("loop_age_secs")
    if loop_age is None or loop_age >= max_loop_age:
        return f"main loop has not turned for {loop_age}s (limit {max_loop_age}s)"
    down = snap.get("children_down_secs")
    if not snap.get("draining") and down is not None and down >= max_children_down:
        return f"no child process has been up for {down}s (limit {max_children_down}s): children cannot start"
    return None


def readiness(snap: dict, max_api_silence: float) -> str | None:
    """None when ready (registered, not draining, the API answered within `max_api_silence` seconds);
    else why not."""
    if snap.get("draining"):
        return "draining"
    if not snap.get("registered"):
        return "not registered"
    api_age = snap.get("api_age_secs")
    if api_age is None or api_age >= max_api_silence:
        return f"the Spooled API last answered {api_age}s ago (limit {max_api_silence}s)"
    return None


class _Handler(BaseHTTPRequestHandler):
    """Answers one request already read whole (head and body) into memory; the answer goes to a buffer
    the serving thread sends without blocking. Never touches a socket."""

    server_version = "spooled-supervisor"
    protocol_version = "HTTP/1.1"

    def __init__(self, request: bytes, client_address: tuple, health: HealthServer):  # noqa: D107
        self.health = health
        self.client_address = client_address
        self.rfile = io.BytesIO(request)
        self._answer = io.BytesIO()
        self.wfile = self._answer
        self.close_connection = True
        self.handle_one_request()

    def answer(self) -> bytes:
        return self._answer.getvalue()

    def log_message(self, format, *args):  # quiet: no per-request stderr lines
        pass

    def do_HEAD(self):
        self._route(head=True)

    def do_GET(self):
        self._route(head=False)

    def do_POST(self):
        health = self.health
        path = self.path.split("?", 1)[0].rstrip("/") or "/"
        if path != "/drain" or health.drain is None:
            return self._json(404, {"status": "not found", "routes": ROUTES}, head=False)
        if not is_loopback_client(self.client_address[0]):
            return self._json(403, {"status": "forbidden", "reason": "POST /drain is taken from loopback only"},
                              head=False)
        health.drain()
        return self._json(202, {"status": "draining"}, head=False)

    def _route(self, head: bool) -> None:
        health = self.health
        path = self.path.split("?", 1)[0].rstrip("/") or "/"
        try:
            if path == "/metrics":
                body = health.metrics.render().encode()
                return self._send(200, body, CONTENT_TYPE, head)
            if path == "/":  # a page of /status for a browser (supervisor.ops.statuspage)
                return self._send(200, statuspage.PAGE, statuspage.CONTENT_TYPE, head, statuspage.HEADERS)
            if path not in ("/healthz", "/readyz", "/status"):
                return self._json(404, {"status": "not found", "routes": ROUTES}, head)
            snap = health.snapshot()
            if path == "/status":
                return self._json(200, snap, head)
            if path == "/healthz":
                reason = liveness(snap, health.max_loop_age, health.max_children_down)
            else:
                reason = readiness(snap, health.max_api_silence)
            ages = {k: snap.get(k) for k in ("loop_age_secs", "api_age_secs", "registered", "draining")}
            if reason is None:
                return self._json(200, {"status": "ok", **ages}, head)
            return self._json(503, {"status": "unavailable", "reason": reason, **ages}, head)
        except Exception as exc:  # noqa: BLE001 - the endpoint must outlive any snapshot bug
            log.debug("health endpoint: %s failed", path, exc_info=True)
            return self._json(500, {"status": "error", "error": f"{type(exc).__name__}: {exc}"}, head)

    def _json(self, code: int, payload: dict, head: bool) -> None:
        body = json.dumps(payload, default=str).encode() + b"\n"
        self._send(code, body, "application/json", head)

    def _send(self, code: int, body: bytes, content_type: str, head: bool, headers: dict | None = None) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        if not head:
            self.wfile.write(body)


def _plain_answer(code: int, reason: str) -> bytes:
    """A short answer that closes the connection, for a request the server will not read."""
    body = json.dumps({"status": "error", "reason": reason}).encode() + b"\n"
    head = (f"HTTP/1.1 {code} {reason}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n")
    return head.encode("ascii") + body


def frame_request(buf: bytes | bytearray) -> tuple[int, bytes | None]:
    """How much of `buf` is the first request: (its length, None) when whole, (0, None) while it is not,
    (-1, answer) when it can never be served (too big, bad length, chunked body): send `answer` and close."""
    end = buf.find(b"\r\n\r\n")
    head_end = end + 4
    bare = buf.find(b"\n\n")
    if bare != -1 and (end == -1 or bare < end):
        end, head_end = bare, bare + 2
    if end == -1:
        if len(buf) > MAX_HEAD_BYTES:
            return -1, _plain_answer(431, "Request Header Fields Too Large")
        return 0, None
    if end > MAX_HEAD_BYTES:
        return -1, _plain_answer(431, "Request Header Fields Too Large")
    length = 0
    for line in bytes(buf[:end]).split(b"\n")[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"transfer-encoding":
            return -1, _plain_answer(411, "Length Required")
        if name == b"content-length":
            text = value.strip()
            if not text.isdigit() or len(text) > 9:
                return -1, _plain_answer(400, "Bad Request")
            length = int(text)
    if length > MAX_BODY_BYTES:
        return -1, _plain_answer(413, "Content Too Large")
    total = head_end + length
    return (total, None) if len(buf) >= total else (0, None)


@dataclass
class _Connection:
    sock: socket.socket
    address: tuple
    deadline: float  # monotonic: the request must be read (or the answer sent) by then
    inbuf: bytearray
    outbuf: memoryview | None = None
    close_after: bool = False
    pipelined: bool = False  # an answer went out while inbuf held more: answer it on the next turn


class HealthServer:
    """Serves the daemon's health, readiness, metrics and status. `port=0` binds a free port."""

    def __init__(self, host: str, port: int, snapshot: Snapshot, metrics: DaemonMetrics,
                 max_loop_age: float = 10.0, max_api_silence: float = 60.0, drain: Callable[[], None] | None = None,
                 max_children_down: float = 120.0):
        self.host = host
        self.requested_port = port
        self.snapshot = snapshot
        self.metrics = metrics
        self.max_loop_age = max_loop_age
        self.max_children_down = max_children_down  # /healthz fails after this long with no child up
        self.max_api_silence = max_api_silence  # /readyz fails after this long without an API answer
        self.drain = drain  # called (on the server's thread) for POST /drain; None: no such route
        self._listener: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._open = 0  # client connections open (written by the serving thread)

    @property
    def port(self) -> int:
        """The bound port (meaningful after start())."""
        return self._listener.getsockname()[1] if self._listener is not None else self.requested_port

    def start(self) -> HealthServer:
        """Bind (raises OSError if the port is taken) and serve on one daemon thread."""
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((self.host, self.requested_port))
            listener.listen(128)
            listener.setblocking(False)
        except OSError:
            listener.close()
            raise
        self._listener = listener
        self._stopping.clear()
        self._thread = threading.Thread(target=self._serve, args=(listener,), name="health-http", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._listener is None:
            return
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._listener = None
        self._thread = None

    def connection_count(self) -> int:
        """How many client connections are open now (for the tests and /status readers)."""
        return self._open

    def _serve(self, listener: socket.socket) -> None:
        sel = selectors.DefaultSelector()
        sel.register(listener, selectors.EVENT_READ, None)
        conns: dict[int, _Connection] = {}  # by file descriptor, oldest first
        try:
            while not self._stopping.is_set():
                now = time.monotonic()
                wait = SERVE_TICK
                if conns:
                    wait = max(0.0, min(wait, min(c.deadline for c in conns.values()) - now))
                # a connection whose buffer still holds a whole pipelined request: one answer each per turn
                backlog = [c for c in conns.values() if c.pipelined]
                for key, _mask in sel.select(0.0 if backlog else wait):
                    conn = key.data
                    if conn is None:
                        self._accept(listener, sel, conns)
                    else:
                        self._guarded(self._write if conn.outbuf is not None else self._read, conn, sel, conns)
                for conn in backlog:
                    conn.pipelined = False
                    if conns.get(conn.sock.fileno()) is conn and conn.outbuf is None:
                        self._guarded(self._answer_next, conn, sel, conns)
                now = time.monotonic()
                for conn in [c for c in conns.values() if c.deadline <= now]:
                    self._close(conn, sel, conns)  # a request that did not come whole in time, or a reader that stalled
                self._open = len(conns)
        except Exception:  # noqa: BLE001 - the thread must not die silently
            log.exception("health endpoint stopped serving")
        finally:
            for conn in list(conns.values()):
                self._close(conn, sel, conns)
            sel.close()
            listener.close()
            self._open = 0

    def _guarded(self, step: Callable[[_Connection, selectors.BaseSelector, dict[int, _Connection]], None],
                 conn: _Connection, sel: selectors.BaseSelector, conns: dict[int, _Connection]) -> None:
        """Run one step of one connection; what goes wrong there closes that connection, never the server."""
        try:
            step(conn, sel, conns)
        except Exception as exc:  # noqa: BLE001 - one connection must not stop the health port
            log.debug("health endpoint: connection dropped: %s", type(exc).__name__)
            self._close(conn, sel, conns)

    def _accept(self, listener: socket.socket, sel: selectors.BaseSelector, conns: dict[int, _Connection]) -> None:
        for _ in range(ACCEPT_BATCH):
            try:
                sock, address = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # out of descriptors, say: the ones we hold are dropped oldest first below
                log.debug("health endpoint: accept failed: %s", exc)
                return
            sock.setblocking(False)
            while len(conns) >= MAX_CONNECTIONS:  # the oldest connection makes room for the newest
                self._close(next(iter(conns.values())), sel, conns)
            conn = _Connection(sock, address, time.monotonic() + REQUEST_TIMEOUT, bytearray())
            conns[sock.fileno()] = conn
            sel.register(sock, selectors.EVENT_READ, conn)

    def _read(self, conn: _Connection, sel: selectors.BaseSelector, conns: dict[int, _Connection]) -> None:
        try:
            data = conn.sock.recv(READ_CHUNK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._close(conn, sel, conns)
            return
        conn.inbuf += data
        self._answer_next(conn, sel, conns)

    def _answer_next(self, conn: _Connection, sel: selectors.BaseSelector, conns: dict[int, _Connection]) -> None:
        """Answer the first request in `conn`'s buffer if it is whole (pipelined ones wait their turn)."""
        length, refusal = frame_request(conn.inbuf)
        if refusal is not None:
            conn.inbuf.clear()
            answer, close = refusal, True
        elif length == 0:
            return
        else:
            request = bytes(conn.inbuf[:length])
            del conn.inbuf[:length]
            try:
                handler = _Handler(request, conn.address, self)
                answer, close = handler.answer(), handler.close_connection
            except Exception:  # noqa: BLE001 - one bad request must not stop the server
                log.debug("health endpoint: request failed", exc_info=True)
                answer, close = _plain_answer(500, "Internal Server Error"), True
        if not answer:
            self._close(conn, sel, conns)
            return
        conn.outbuf = memoryview(answer)
        conn.close_after = close
        conn.deadline = time.monotonic() + REQUEST_TIMEOUT
        sel.modify(conn.sock, selectors.EVENT_WRITE, conn)
        self._write(conn, sel, conns)

    def _write(self, conn: _Connection, sel: selectors.BaseSelector, conns: dict[int, _Connection]) -> None:
        assert conn.outbuf is not None
        try:
            sent = conn.sock.send(conn.outbuf)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close(conn, sel, conns)
            return
        conn.outbuf = conn.outbuf[sent:]
        if len(conn.outbuf):
            return
        conn.outbuf = None
        if conn.close_after:
            self._close(conn, sel, conns)
            return
        conn.deadline = time.monotonic() + REQUEST_TIMEOUT
        sel.modify(conn.sock, selectors.EVENT_READ, conn)
        conn.pipelined = bool(conn.inbuf)  # a request that came in behind this one is answered on the next turn

    @staticmethod
    def _close(conn: _Connection, sel: selectors.BaseSelector, conns: dict[int, _Connection]) -> None:
        conns.pop(conn.sock.fileno(), None)
        try:
            sel.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        conn.sock.close()
