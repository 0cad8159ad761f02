"""HTTP server, routing, auth, error envelopes and the fault-injection hook.

Contract: HTTP/1.1 keep-alive, a thread per connection, TCP_NODELAY, a correct
Content-Length on every response; every answer >= 400 is JSON with `code` and
`message`; no request, however malformed, and no client disconnect stops the
server. Order for /api/v1 routes: route (404/405) -> auth (401) -> rate limit
(429) -> faults (delay, 503) -> handler -> maybe cut the response.
"""

from __future__ import annotations

import email.parser
import re
import socket
import sqlite3
import sys
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote

import orjson

from . import devtools
from . import handlers as h
from .errors import STATUS_CODES, ApiError, invalid_json
from .faults import RequestStats

PUBLIC, API, DEV = "public", "api", "dev"
_REASONS = {200: "OK", 201: "Created", 204: "No Content", 400: "Bad Request", 401: "Unauthorized",
            403: "Forbidden", 404: "Not Found", 405: "Method Not Allowed", 408: "Request Timeout",
            409: "Conflict", 413: "Payload Too Large", 414: "URI Too Long", 422: "Unprocessable Entity",
            429: "Too Many Requests", 431: "Request Header Fields Too Large", 500: "Internal Server Error",
            501: "Not Implemented", 503: "Service Unavailable", 505: "HTTP Version Not Supported"}

ROUTES = [
    ("GET", "/health", h.health, PUBLIC),
    ("GET", "/health/live", h.health_live, PUBLIC),
    ("GET", "/health/ready", h.health_ready, PUBLIC),
    ("GET", "/_dev/faults", h.get_faults, DEV),
    ("POST", "/_dev/faults", h.set_faults, DEV),
    ("GET", "/_dev/stats", h.get_stats, DEV),
    ("GET", "/_dev/requests", devtools.get_requests, DEV),
    ("POST", "/_dev/leases/{id}/expire", devtools.expire_lease, DEV),
    ("POST", "/_dev/leases/{id}/steal", devtools.steal_lease, DEV),
    ("POST", "/api/v1/organizations", h.create_org, API),
    ("POST", "/api/v1/workers/register", h.register_worker, API),
    ("GET", "/api/v1/workers", h.list_workers, API),
    ("GET", "/api/v1/workers/{id}", h.get_worker, API),
    ("POST", "/api/v1/workers/{id}/heartbeat", h.worker_heartbeat, API),
    ("POST", "/api/v1/workers/{id}/deregister", h.deregister_worker, API),
    ("POST", "/api/v1/jobs", h.create_job, API),
    ("GET", "/api/v1/jobs", h.list_jobs, API),
    ("POST", "/api/v1/jobs/bulk", h.bulk_create, API),
    ("POST", "/api/v1/jobs/claim", h.claim, API),
    ("GET", "/api/v1/jobs/stats", h.job_stats, API),
    ("GET", "/api/v1/jobs/status", h.job_status, API),
    ("GET", "/api/v1/jobs/dlq", h.dlq_list, API),
    ("POST", "/api/v1/jobs/dlq/retry", h.dlq_retry, API),
    ("POST", "/api/v1/jobs/dlq/purge", h.dlq_purge, API),
    ("GET", "/api/v1/jobs/{id}", h.get_job, API),
    ("DELETE", "/api/v1/jobs/{id}", h.cancel_job, API),
    ("POST", "/api/v1/jobs/{id}/complete", h.complete, API),
    ("POST", "/api/v1/jobs/{id}/fail", h.fail, API),
    ("POST", "/api/v1/jobs/{id}/heartbeat", h.job_heartbeat, API),
    ("POST", "/api/v1/jobs/{id}/retry", h.retry_job, API),
    ("GET", "/api/v1/queues", h.list_queues, API),
    ("GET", "/api/v1/queues/{name}/stats", h.queue_stats, API),
    ("POST", "/api/v1/queues/{name}/pause", h.pause_queue, API),
    ("POST", "/api/v1/queues/{name}/resume", h.resume_queue, API),
    ("GET", "/api/v1/queues/{name}/config", h.get_queue_config, API),
    ("PUT", "/api/v1/queues/{name}/config", h.put_queue_config, API),
]
NO_AUTH = {h.create_org}  # open registration, as REGISTRATION_MODE=open


class Router:
    """Static paths first, then templates with `{param}` segments; 404 / 405 as CONTRACT section 2.

    Templates are found by one dict lookup per "shape" (segment count and parameter positions): the
    path's segments with the parameter positions blanked out are the key. Among matching templates
    the first listed wins, as a scan in route order would give.
    """

    def __init__(self, routes):
        self.static: dict[str, dict] = {}
        self.templates: list[tuple[tuple[str, ...], dict]] = []
        for method, path, fn, kind in routes:
            if "{" in path:
                segs = tuple(path.strip("/").split("/"))
                for t_segs, methods in self.templates:
                    if t_segs == segs:
                        methods[method] = (fn, kind)
                        break
                else:
                    self.templates.append((segs, {method: (fn, kind)}))
            else:
                self.static.setdefault(path, {})[method] = (fn, kind)
        # {segment count: [(parameter positions, {literal key: (route order, methods, ((pos, name), ...))})]}
        self.shapes: dict[int, list[tuple[tuple[int, ...], dict]]] = {}
        for order, (t_segs, methods) in enumerate(self.templates):
            pos = tuple(i for i, t in enumerate(t_segs) if t[0] == "{")
            key = tuple(None if i in pos else t for i, t in enumerate(t_segs))
            names = tuple((i, t_segs[i][1:-1]) for i in pos)
            shapes = self.shapes.setdefault(len(t_segs), [])
            for s_pos, table in shapes:
                if s_pos == pos:
                    table.setdefault(key, (order, methods, names))
                    break
            else:
                shapes.append((pos, {key: (order, methods, names)}))

    def match(self, method: str, path: str):
        methods, params = self.static.get(path), {}
        if methods is None:
            segs = path.strip("/").split("/") if path.startswith("/") and not path.endswith("/") else None
            if segs:
                best = None
                for pos, table in self.shapes.get(len(segs), ()):
                    key = segs.copy()
                    for i in pos:
                        if not key[i]:  # an empty parameter segment matches no template
                            break
                        key[i] = None
                    else:
                        hit = table.get(tuple(key))
                        if hit is not None and (best is None or hit[0] < best[0]):
                            best = hit
                if best is not None:
                    methods, params = best[1], {name: unquote(segs[i]) for i, name in best[2]}
        if methods is None:
            raise ApiError(404, "NOT_FOUND", "No route matches this path")
        found = methods.get(method)
        if found is None:
            raise ApiError(405, "METHOD_NOT_ALLOWED", "This path does not support the request method",
                           headers={"Allow": ", ".join(sorted(methods))})
        return found[0], found[1], params


@dataclass
class Config:
    lease_duration: int = 30
    heartbeat_interval: int = 10
    max_workers: int | None = None
    max_payload_bytes: int = 1048576
    max_body_bytes: int = 2 * 1024 * 1024


class Request:
    __slots__ = ("method", "path", "query", "headers", "body", "org", "params")


class App:
    """Routes a parsed HTTP request to a handler and turns the outcome into (status, body bytes, headers)."""

    def __init__(self, store, cfg: Config, faults, limiter=None):
        self.store, self.cfg, self.faults, self.limiter = store, cfg, faults, limiter
        self.stats = RequestStats()  # /api/v1 requests per organization, for GET /_dev/stats
        self.router = Router(ROUTES)
        self.requests = devtools.RequestLog()  # GET /_dev/requests

    def authenticate(self, headers) -> str:
        auth = headers.get("authorization")
        if not auth or not auth.startswith("Bearer "):
            raise ApiError(401, "UNAUTHORIZED", "Missing or invalid Authorization header")
        token = auth[7:].strip()
        org = self.store.org_for_key(token) if token else None
        if org is None:
            raise ApiError(401, "UNAUTHORIZED", "Invalid token" if token.startswith("eyJ") else "Invalid API key")
        return org

    def handle(self, req: Request) -> tuple[int, object, dict, bool]:
        """Returns (status, json-able body or None, headers, cut?)."""
        cut = False
        try:
            fn, kind, req.params = self.router.match(req.method, req.path)
            if kind != PUBLIC:
                version = req.headers.get("x-api-version")
                if kind == API and version is not None and version.strip() != "1":
                    raise ApiError(400, "BAD_REQUEST", "Unsupported API version; only X-API-Version: 1 exists")
                req.org = None if fn in NO_AUTH else self.authenticate(req.headers)
                if kind == API:
                    org = req.org or "public"
                    if self.limiter is not None:
                        try:
                            self.limiter.take(org)
                        except ApiError:
                            self.stats.count(org, fn.__name__, rate_limited=True)
                            raise
                    self.stats.count(org, fn.__name__)
                    if self.faults.active():
                        self.faults.before()
                        cut = self.faults.should_cut()
            status, body, headers = fn(self, req)
            return status, body, headers or {}, cut
        except ApiError as e:
            return e.status, e.body, e.headers, cut
        except sqlite3.Error as e:
            print(f"warning: database error on {req.method} {req.path}: {e}", file=sys.stderr, flush=True)
            return 500, {"code": "DATABASE_ERROR", "message": "A database error occurred"}, {}, False
        except Exception as e:  # never leak a stack trace to the client
            print(f"warning: internal error on {req.method} {req.path}: {e!r}", file=sys.stderr, flush=True)
            return 500, {"code": "INTERNAL_ERROR", "message": "An internal error occurred"}, {}, False


_MAXLINE, _MAXHEADERS = 65536, 100  # http.client's limits on one header line and on the header count
# A plain header line, as the `email` parser reads it: name of RFC 2822 ftext, a colon, the value
# after leading blanks, no character that parser would treat as a line break, then the line end.
_HEADER_LINE = re.compile(rb"([\x21-\x39\x3b-\x7e]+):[ \t]*([^\r\n\x0b\x0c\x1c\x1d\x1e\x85]*)\r?\n\Z")


class Handler(BaseHTTPRequestHandler):
    """One keep-alive connection. Never raises out of handle(); always answers JSON errors."""

    protocol_version = "HTTP/1.1"
    server_version = "spooled-dev"
    sys_version = ""
    timeout = 600  # idle keep-alive connections are dropped after this many seconds
    app: App = None  # set by make_server

    def setup(self):
        super().setup()
        try:
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass

    def log_message(self, format, *args):  # no per-request logging
        pass

    def send_error(self, code, message=None, explain=None):
        """Used by the stdlib parser for malformed request lines and headers: answer JSON and close."""
        self.close_connection = True
        body = {"code": STATUS_CODES.get(code, "BAD_REQUEST" if code < 500 else "INTERNAL_ERROR"),
                "message": message or _REASONS.get(code, "Bad Request")}
        try:
            self._write(code, body, {}, close=True)
        except OSError:
            pass

    def handle_one_request(self):
        try:
            self.raw_requestline = self.rfile.readline(65537)
            if len(self.raw_requestline) > 65536:
                self.requestline, self.request_version, self.command = "", "", ""
                self.send_error(414, "Request line too long")
                return
            if not self.raw_requestline:
                self.close_connection = True
                return
            if not self.parse_request():
                return
            self._dispatch()
        except (OSError, ValueError):  # timeouts, resets, broken pipes, garbage
            self.close_connection = True

    def parse_request(self):
        """The stdlib's parse_request, without its `email`-package header parser on the common path.

        A plain `METHOD /path HTTP/1.1` request line whose header lines are all plain `Name: value`
        is parsed here into a dict keyed by lower-cased name (first occurrence wins, value as
        `email.message.Message.get` gives it). Anything unusual (another HTTP version, a malformed
        request line, continuation lines, a line that is no header) goes through exactly the stdlib's
        code, so every answer to odd input is what it was. Callers read headers by lower-case name.
        """
        requestline = str(self.raw_requestline, "iso-8859-1").rstrip("\r\n")
        words = requestline.split()
        if len(words) != 3 or words[2] != "HTTP/1.1":
            return super().parse_request()
        self.command = words[0]
        path = words[1]
        if path.startswith("//"):
            path = "/" + path.lstrip("/")
        self.path, self.requestline, self.request_version = path, requestline, "HTTP/1.1"
        self.close_connection = False
        lines = []  # http.client._read_headers, with its limits and their 431 answers
        readline = self.rfile.readline
        while True:
            line = readline(_MAXLINE + 1)
            if len(line) > _MAXLINE:
                self.send_error(431, "Line too long")
                return False
            lines.append(line)
            if len(lines) > _MAXHEADERS:
                self.send_error(431, "Too many headers")
                return False
            if line in (b"\r\n", b"\n", b""):
                break
        headers = {}
        match = _HEADER_LINE.match
        for line in lines[:-1]:
            m = match(line)
            if m is None:  # anything unusual: the stdlib's parser decides, as before
                headers = email.parser.Parser(_class=self.MessageClass).parsestr(
                    b"".join(lines).decode("iso-8859-1"))
                break
            name = m.group(1).decode("iso-8859-1").lower()
            if name not in headers:
                headers[name] = m.group(2).decode("iso-8859-1")
        self.headers = headers
        conntype = headers.get("connection", "").lower()
        if conntype == "close":
            self.close_connection = True
        elif conntype == "keep-alive":
            self.close_connection = False
        if headers.get("expect", "").lower() == "100-continue" and not self.handle_expect_100():
            return False
        return True

    def _read_body(self) -> bytes:
        limit = self.app.cfg.max_body_bytes
        te = (self.headers.get("transfer-encoding") or "").lower()
        if "chunked" in te:
            chunks, total = [], 0
            while True:
                line = self.rfile.readline(1024)
                try:
                    size = int(line.split(b";")[0].strip() or b"x", 16)
                except ValueError:
                    self.close_connection = True
                    raise invalid_json("Malformed chunked request body") from None
                if size == 0:
                    while self.rfile.readline(1024) not in (b"\r\n", b"\n", b""):
                        pass
                    break
                total += size
                if total > limit:
                    self.close_connection = True
                    raise invalid_json(f"Request body exceeds the limit of {limit} bytes", "body_too_large")
                chunks.append(self.rfile.read(size))
                self.rfile.readline(16)
            return b"".join(chunks)
        raw = self.headers.get("content-length")
        if raw is None:
            return b""
        try:
            length = int(raw)
            if length < 0:
                raise ValueError
        except ValueError:
            self.close_connection = True
            raise ApiError(400, "BAD_REQUEST", "Invalid Content-Length header") from None
        if length > limit:
            self.close_connection = True
            if length <= 64 * limit:  # drain so the client can read our answer
                left = length
                while left > 0:
                    chunk = self.rfile.read(min(left, 1 << 16))
                    if not chunk:
                        break
                    left -= len(chunk)
            raise invalid_json(f"Request body exceeds the limit of {limit} bytes", "body_too_large")
        body = self.rfile.read(length) if length else b""
        if len(body) < length:
            self.close_connection = True
            raise invalid_json("Request body is truncated")
        return body

    def _dispatch(self):
        req = Request()
        path, _, qs = self.path.partition("?")
        req.method, req.path, req.headers, req.org, req.params = self.command, path, self.headers, None, {}
        req.query = parse_qs(qs) if qs else {}
        try:
            req.body = self._read_body()
        except ApiError as e:
            self._write(e.status, e.body, e.headers, close=True)
            return
        received = time.time()
        status, body, headers, cut = self.app.handle(req)
        self.app.requests.record(req.method, path, status, req.body, received)
        if path.startswith("/api/"):
            headers["x-api-version"] = "1"
        self._write(status, body, headers, cut=cut)

    def _write(self, status: int, body, headers: dict, close: bool = False, cut: bool = False):
        payload = b"" if body is None or status == 204 else orjson.dumps(body)
        lines = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Unknown')}"]
        if status != 204:
            if body is not None:
                lines.append("Content-Type: application/json")
            lines.append(f"Content-Length: {len(payload)}")
        for k, v in headers.items():
            lines.append(f"{k}: {v}")
        if close or cut or self.close_connection:
            self.close_connection = True
            lines.append("Connection: close")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        if cut:  # injected fault: headers and half the body, then the socket closes
            self.wfile.write(head + payload[: len(payload) // 2])
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            return
        self.wfile.write(head + payload)


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256

    def handle_error(self, request, client_address):  # client went away: nothing to report
        exc = sys.exc_info()[1]
        if not isinstance(exc, OSError):
            print(f"warning: connection error from {client_address}: {exc!r}", file=sys.stderr, flush=True)


def make_server(app: App, host: str, port: int) -> Server:
    handler = type("BoundHandler", (Handler,), {"app": app})
    return Server((host, port), handler)


def serve_in_thread(server: Server) -> threading.Thread:
    t = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, name="devserver-http",
                         daemon=True)
    t.start()
    return t
