"""The dev server's web UI: a page and its assets at the root URL, and the local-only routes it reads.

  GET /                          -- the UI (plain HTML, CSS and JS shipped in supervisor/devserver/ui/;
                                    nothing is fetched from elsewhere). It signs in with an organization's
                                    API key, kept in the tab's sessionStorage, and sends it on every request.
  GET /ui/{name}                 -- its assets
  GET /_dev/jobs/{id}/history    -- the job's every change of status or lease (time, worker, lease id),
                                    the caller's organization's jobs only: local to this dev server, the
                                    real API has no such route
  GET /_dev/overview             -- per queue (a queue-scoped key's own queues only): jobs by status, paused or
                                    not, and jobs ended per minute over the last 30 minutes

Every route here checks the Host header: an IP address or `localhost` only, so a page on another site cannot
reach the server through a name it rebinds to 127.0.0.1 (DNS rebinding).
"""

from __future__ import annotations

import ipaddress
import time
from importlib import resources

from .errors import HttpError, not_found
from .history import job_history, throughput
from .keys_store import require_job, scope
from .transport import Raw

ASSETS = {"app.js": "text/javascript; charset=utf-8", "app.css": "text/css; charset=utf-8"}
PAGE_HEADERS = {
    "Cache-Control": "no-store",
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
                               "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
}
STATUSES = ("pending", "scheduled", "processing", "completed", "failed", "deadletter", "cancelled")


def host_allowed(host: str | None) -> bool:
    """True for a Host header naming an IP address or localhost (with or without a port)."""
    if not host:
        return False
    name = host.strip().lower()
    if name.startswith("["):  # [::1]:8787
        name = name[1:name.find("]")] if "]" in name else ""
    elif name.count(":") == 1:
        name = name.rsplit(":", 1)[0]
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def check_host(req) -> None:
    if not host_allowed(req.headers.get("host")):
        raise HttpError(403, "FORBIDDEN", "This server answers only requests addressed to an IP address or localhost")


def _asset(name: str) -> bytes:
    return resources.files("supervisor.devserver").joinpath("ui", name).read_bytes()


def page(app, req):
    check_host(req)
    return 200, Raw(_asset("index.html"), "text/html; charset=utf-8"), dict(PAGE_HEADERS)


def asset(app, req):
    check_host(req)
    name = req.params["name"]
    if name not in ASSETS:
        raise not_found("No such asset")
    return 200, Raw(_asset(name), ASSETS[name]), dict(PAGE_HEADERS)


def history(app, req):
    check_host(req)
    job_id = req.params["id"]
    require_job(app.store, req.key, req.org, job_id)  # a queue-scoped key's other queues are hidden
    app.store.get_job(req.org, job_id)  # 404 for an unknown job or another organization's
    return 200, {"job_id": job_id, "events": job_history(app.store.read, req.org, job_id)}, None


def overview(app, req):
    check_host(req)
    read = app.store.read
    queues: dict[str, dict] = {}

    def queue(name: str) -> dict:
        return queues.setdefault(name, {"queue_name": name, "paused": False, "counts": dict.fromkeys(STATUSES, 0)})

    for name, status, count in read("SELECT queue_name, status, count(*) FROM jobs WHERE organization_id=? "
                                    "GROUP BY 1, 2", (req.org,)):
        queue(name)["counts"][status] = count
    for name, enabled in read("SELECT queue_name, enabled FROM queue_config WHERE organization_id=?", (req.org,)):
        queue(name)["paused"] = not enabled
    for name, per_minute in throughput(read, req.org, time.time()).items():
        queue(name)["per_minute"] = per_minute
    allowed = scope(req.key)  # a queue-scoped key sees its own queues only
    return 200, {"queues": [queues[name] for name in sorted(queues) if allowed is None or name in allowed]}, None


ROUTES = [
    ("GET", "/", page, "public"),
    ("GET", "/ui/{name}", asset, "public"),
    ("GET", "/_dev/jobs/{id}/history", history, "dev"),
    ("GET", "/_dev/overview", overview, "dev"),
]
