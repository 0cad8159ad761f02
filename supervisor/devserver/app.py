"""Routing, auth, error envelopes and the fault-injection hook; the server is transport.Server.

Contract: every answer >= 400 is JSON with `code` and `message`; no request, however malformed, and
no client disconnect stops the server (framing, limits and connections: see transport). Order for
/api/v1 routes: route (404/405) -> auth (401) -> rate limit (429) -> faults (delay, 503) -> handler
-> maybe cut the response. Every /api/ answer carries `x-api-version: 1`.
"""

from __future__ import annotations

import sqlite3
import sys
import threading
import time
from dataclasses import dataclass
from urllib.parse import unquote

from . import devtools, ui
from . import handlers as h
from .errors import HttpError
from .faults import RequestStats
from .realtime import Broadcaster
from .transport import Limits, Request, Server

__all__ = ["App", "ServerConfig", "Limits", "Request", "Router", "Server", "make_server", "serve_in_thread"]

PUBLIC, API, DEV = "public", "api", "dev"
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
    ("GET", "/api/v1/events", h.sse_events, API),
    ("GET", "/_dev/events", h.event_streams, DEV),
    ("POST", "/_dev/events/drop", h.drop_event_streams, DEV),
    ("GET", "/api/v1/queues", h.list_queues, API),
    ("GET", "/api/v1/queues/{name}", h.get_queue, API),
    ("DELETE", "/api/v1/queues/{name}", h.delete_queue, API),
    ("GET", "/api/v1/queues/{name}/stats", h.queue_stats, API),
    ("POST", "/api/v1/queues/{name}/pause", h.pause_queue, API),
    ("POST", "/api/v1/queues/{name}/resume", h.resume_queue, API),
    ("GET", "/api/v1/queues/{name}/config", h.get_queue_config, API),
    ("PUT", "/api/v1/queues/{name}/config", h.put_queue_config, API),
    *ui.ROUTES,  # the web UI and the local routes it reads
]
NO_AUTH = {h.create_org}  # open registration, as REGISTRATION_MODE=open
QUERY_TOKEN = {h.sse_events}  # routes that also take `?token=` / `?api_key=` (the browser's EventSource, WebSocket)


class Router:
    """Static paths first, then templates with `{param}` segments; 404 / 405 in the API's error envelope.

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
                    key: list[str | None] = list(segs)
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
            raise HttpError(404, "NOT_FOUND", "No route matches this path")
        found = methods.get(method)
        if found is None:
            raise HttpError(405, "METHOD_NOT_ALLOWED", "This path does not support the request method",
                           headers={"Allow": ", ".join(sorted(methods))})
        return found[0], found[1], params


@dataclass
class ServerConfig:
    lease_duration: int = 30
    heartbeat_interval: int = 10
    max_workers: int | None = None
    max_payload_bytes: int = 1048576
    max_body_bytes: int = 2 * 1024 * 1024
    events: bool = True  # serve GET /api/v1/events


class App:
    """Routes a parsed HTTP request to a handler and turns the outcome into (status, body bytes, headers)."""

    def __init__(self, store, cfg: ServerConfig, faults, limiter=None):
        self.store, self.cfg, self.faults, self.limiter = store, cfg, faults, limiter
        self.stats = RequestStats()  # /api/v1 requests per organization, for GET /_dev/stats
        self.router = Router(ROUTES)
        self.requests = devtools.RequestLog()  # GET /_dev/requests
        self.events = Broadcaster()  # GET /api/v1/events, /api/v1/ws
        store.listeners.append(self.events.on_fact)

    def authenticate(self, headers, query: dict | None = None) -> str:
        """The organization of the request's credentials: the `Authorization: Bearer` header, or, given the
        `query` of a realtime route, its `token` / `api_key` parameter (as the real server allows there only)."""
        auth = headers.get("authorization")
        if not auth and query:
            token = (query.get("token") or query.get("api_key") or [""])[-1]
            auth = "Bearer " + token if token else None
        if not auth or not auth.startswith("Bearer "):
            raise HttpError(401, "UNAUTHORIZED", "Missing or invalid Authorization header")
        token = auth[7:].strip()
        org = self.store.org_for_key(token) if token else None
        if org is None:
            raise HttpError(401, "UNAUTHORIZED", "Invalid token" if token.startswith("eyJ") else "Invalid API key")
        return org

    def serve(self, req: Request) -> tuple[int, object, dict, bool]:
        """handle() plus the `x-api-version: 1` header every /api/ answer carries, recorded in the request
        log (GET /_dev/requests)."""
        received = time.time()
        status, body, headers, cut = self.handle(req)
        self.requests.record(req.method, req.path, status, req.body, received)
        if req.path.startswith("/api/"):
            headers["x-api-version"] = "1"
        return status, body, headers, cut

    def handle(self, req: Request) -> tuple[int, object, dict, bool]:
        """Returns (status, json-able body or None, headers, cut?)."""
        cut = False
        try:
            fn, kind, req.params = self.router.match(req.method, req.path)
            if kind != PUBLIC:
                version = req.headers.get("x-api-version")
                if kind == API and version is not None and version.strip() != "1":
                    raise HttpError(400, "BAD_REQUEST", "Unsupported API version; only X-API-Version: 1 exists")
                req.org = None if fn in NO_AUTH else self.authenticate(
                    req.headers, req.query if fn in QUERY_TOKEN else None)
                if kind == API:
                    org = req.org or "public"
                    if self.limiter is not None:
                        try:
                            self.limiter.take(org)
                        except HttpError:
                            self.stats.count(org, fn.__name__, rate_limited=True)
                            raise
                    self.stats.count(org, fn.__name__)
                    if self.faults.active():
                        self.faults.before()
                        cut = self.faults.should_cut()
            status, body, headers = fn(self, req)
            return status, body, headers or {}, cut
        except HttpError as e:
            return e.status, e.body, e.headers, cut
        except sqlite3.Error as e:
            print(f"warning: database error on {req.method} {req.path}: {e}", file=sys.stderr, flush=True)
            return 500, {"code": "DATABASE_ERROR", "message": "A database error occurred"}, {}, False
        except Exception as e:  # never leak a stack trace to the client
            print(f"warning: internal error on {req.method} {req.path}: {e!r}", file=sys.stderr, flush=True)
            return 500, {"code": "INTERNAL_ERROR", "message": "An internal error occurred"}, {}, False


def make_server(app: App, host: str, port: int, limits: Limits | None = None) -> Server:
    """A server for `app` on host:port (OSError if it can't listen); the body cap is the app's."""
    limits = limits or Limits()
    limits.max_body_bytes = app.cfg.max_body_bytes
    return Server(app.serve, host, port, limits)


def serve_in_thread(server: Server) -> threading.Thread:
    t = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, name="devserver-http",
                         daemon=True)
    t.start()
    return t
