"""The health/metrics HTTP endpoint (`--health-port`): /healthz, /readyz, /metrics, /status.

/healthz (liveness) fails only when the main loop stops turning; /readyz (readiness) fails while the
daemon is not registered, is draining, or has not heard from the API lately. An API outage therefore
shows in /readyz, /status and /metrics, never in /healthz.

POST /drain (from loopback only: the port is often bound to every address in a pod) asks the daemon
to drain and hand its reserve back; `python -m supervisor drain` sends it.

Runs a ThreadingHTTPServer on a daemon thread. Every request calls `snapshot()` (or renders the
metrics) on that thread. The daemon's loop publishes a frozen `Published` snapshot (at most every
100 ms, and at once when its phase changes); `snapshot()` reads the last one and computes its ages at
read time from the monotonic stamps it carries, so a stuck loop shows ever older ages and nothing here
touches the loop's parts or waits on a lock the loop may hold: /healthz exists to notice a stuck loop.
A failing snapshot gives a 500 JSON answer; the server keeps running.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import socket
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from supervisor.ops import statuspage
from supervisor.ops.metrics import CONTENT_TYPE, DaemonMetrics

log = logging.getLogger(__name__)

Snapshot = Callable[[], dict]  # /status's document, as `Published.status` makes it


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


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    health: HealthServer

    def handle_error(self, request, client_address):  # a client hung up: not worth stderr
        log.debug("health endpoint: error serving %s", client_address, exc_info=True)


class _Server6(_Server):
    address_family = socket.AF_INET6


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    server_version = "spooled-supervisor"
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args):  # quiet: no per-request stderr lines
        pass

    def do_HEAD(self):
        self._route(head=True)

    def do_GET(self):
        self._route(head=False)

    def do_POST(self):
        health = self.server.health
        path = self.path.split("?", 1)[0].rstrip("/") or "/"
        length = int(self.headers.get("Content-Length") or 0)
        if 0 < length <= 65536:
            self.rfile.read(length)  # a body is allowed and ignored
        if path != "/drain" or health.drain is None:
            return self._json(404, {"status": "not found", "routes": ROUTES}, head=False)
        if not is_loopback_client(self.client_address[0]):
            return self._json(403, {"status": "forbidden", "reason": "POST /drain is taken from loopback only"},
                              head=False)
        health.drain()
        return self._json(202, {"status": "draining"}, head=False)

    def _route(self, head: bool) -> None:
        health = self.server.health
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
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        """The bound port (meaningful after start())."""
        return self._server.server_address[1] if self._server else self.requested_port

    def start(self) -> HealthServer:
        """Bind (raises OSError if the port is taken) and serve on a daemon thread."""
        server_class = _Server6 if ":" in self.host else _Server
        self._server = server_class((self.host, self.requested_port), _Handler)
        self._server.health = self
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.1},
                                        name="health-http", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = None
        self._thread = None
