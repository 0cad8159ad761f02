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

from . import (
    auth,
    devtools,
    keys,
    keys_store,
    organizations,
    overview,
    schedules,
    schedules_store,
    ui,
    webhooks,
    websocket,
    workflows,
)
from . import handlers as h
from .errors import HttpError, no_route
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
    ("GET", "/api/v1/events/jobs/{id}", h.sse_job, API),
    ("GET", "/api/v1/events/queues/{name}", h.sse_queue, API),
    ("GET", "/api/v1/ws", websocket.connect, API),
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
    # dashboard, a job's priority, organizations and their usage
    ("GET", "/api/v1/dashboard", overview.dashboard, API),
    ("PUT", "/api/v1/jobs/{id}/priority", overview.set_priority, API),
    ("GET", "/api/v1/organizations", organizations.list_orgs, API),
    ("GET", "/api/v1/organizations/usage", organizations.usage, API),
    ("GET", "/api/v1/organizations/webhook-token", organizations.get_webhook_token, API),
    ("POST", "/api/v1/organizations/webhook-token/regenerate", organizations.regenerate_webhook_token, API),
    ("POST", "/api/v1/organizations/webhook-token/clear", organizations.clear_webhook_token, API),
    ("GET", "/api/v1/organizations/check-slug", organizations.check_slug, API),
    ("POST", "/api/v1/organizations/generate-slug", organizations.generate_slug, API),
    ("GET", "/api/v1/organizations/{id}", organizations.get_org, API),
    # API keys and auth
    ("GET", "/api/v1/api-keys", keys.list_keys, API),
    ("POST", "/api/v1/api-keys", keys.create_key, API),
    ("GET", "/api/v1/api-keys/{id}", keys.get_key, API),
    ("PUT", "/api/v1/api-keys/{id}", keys.update_key, API),
    ("DELETE", "/api/v1/api-keys/{id}", keys.revoke_key, API),
    ("POST", "/api/v1/auth/login", auth.login, API),
    ("POST", "/api/v1/auth/refresh", auth.refresh, API),
    ("POST", "/api/v1/auth/validate", auth.validate_token, API),
    ("GET", "/api/v1/auth/me", auth.me, API),
    ("POST", "/api/v1/auth/logout", auth.logout, API),
    # schedules
    ("GET", "/api/v1/schedules", schedules.list_schedules, API),
    ("POST", "/api/v1/schedules", schedules.create, API),
    ("GET", "/api/v1/schedules/{id}", schedules.get, API),
    ("PUT", "/api/v1/schedules/{id}", schedules.update, API),
    ("DELETE", "/api/v1/schedules/{id}", schedules.delete, API),
    ("POST", "/api/v1/schedules/{id}/pause", schedules.pause, API),
    ("POST", "/api/v1/schedules/{id}/resume", schedules.resume, API),
    ("POST", "/api/v1/schedules/{id}/trigger", schedules.trigger, API),
    ("GET", "/api/v1/schedules/{id}/history", schedules.history, API),
    *[(method, path, fn, API) for method, path, fn in workflows.ROUTES],
    *[(method, path, fn, API) for method, path, fn in webhooks.ROUTES],
    *ui.ROUTES,  # the web UI and the local routes it reads
]
# open registration (as REGISTRATION_MODE=open) with its slug helpers, and the auth routes that read their own
# credentials
NO_AUTH = {h.create_org, auth.login, auth.refresh, auth.validate_token, auth.me, organizations.check_slug,
           organizations.generate_slug}
# routes that also take `?token=` / `?api_key=` (a browser's EventSource or WebSocket cannot set a header)
QUERY_TOKEN = {h.sse_events, h.sse_job, h.sse_queue, websocket.connect}


def credentials(headers, query: dict | None) -> dict:
    """The headers to authenticate: as sent, or, given the `query` of a realtime route and no Authorization
    header, its `token` / `api_key` parameter as a Bearer header (the real server allows it there only)."""
    if headers.get("authorization") or not query:
        return headers
    token = (query.get("token") or query.get("api_key") or [""])[-1]
    return {**headers, "authorization": "Bearer " + token} if token else headers


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
            raise no_route(path)
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
    webhook_timeout: float = 10.0  # seconds one outgoing webhook attempt may take in all
    webhook_backoff: float = 1.0  # seconds before the first retry of a failed delivery (then doubling)


class App:
    """Routes a parsed HTTP request to a handler and turns the outcome into (status, body bytes, headers)."""

    def __init__(self, store, cfg: ServerConfig, faults, limiter=None):
        self.store, self.cfg, self.faults, self.limiter = store, cfg, faults, limiter
        self.stats = RequestStats()  # /api/v1 requests per organization, for GET /_dev/stats
        self.router = Router(ROUTES)
        self.requests = devtools.RequestLog()  # GET /_dev/requests
        self.events = Broadcaster()  # GET /api/v1/events, /api/v1/ws
        schedules_store.ensure_tables(store)
        store.listeners.append(self.events.on_fact)
        self.webhooks = webhooks.Webhooks(store, cfg.webhook_timeout, cfg.webhook_backoff)  # outgoing deliveries
        store.listeners.append(self.webhooks.on_fact)

    def authenticate(self, headers, query: dict | None = None) -> str:
        """The caller's organization (see `credentials` and `auth.authenticate`)."""
        return auth.authenticate(self.store, credentials(headers, query), time.time()).org

    def serve(self, req: Request) -> tuple[int, object, dict, bool]:
        """handle() plus the `x-api-version: 1` header every /api/ answer carries, recorded in the request
        log (GET /_dev/requests)."""
        received = time.time()
        status, body, headers, cut = self.handle(req)
        self.requests.record(req.method, req.path, status, req.body, received, req.org)
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
                if fn not in NO_AUTH:
                    req.key = auth.authenticate(self.store, credentials(req.headers, req.query if fn in QUERY_TOKEN
                                                                        else None), time.time())
                    req.org = req.key.org
                    if "name" in req.params:  # the queue routes: a queue-scoped key stays in its queues
                        keys_store.require_queue(req, req.params["name"])
                if kind == API:
                    org = req.org or "public"
                    if self.limiter is not None:
                        try:
                            self.limiter.take(org)
                        except HttpError:
                            self.stats.count(org, fn.__name__, rate_limited=True)
                            raise
                    self.stats.count(org, fn.__name__)
                    if self.faults.active(org):
                        self.faults.before(org)
                        cut = self.faults.should_cut(org)
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
