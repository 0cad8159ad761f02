"""Dev-only routes for testing a worker: lose a lease on demand, and see the requests the server got.

  POST /_dev/leases/{id}/expire  -- the job's lease expires now: the sweep re-issues it (the holder gets
                                    409 LEASE_EXPIRED until the sweep runs, 404 after)
  POST /_dev/leases/{id}/steal   -- {"worker_id": W, "lease_duration_secs": N}: the job is re-issued to W
                                    under a new lease; answers it. The holder gets 404 (W is another
                                    worker) or 409 LEASE_EXPIRED (W is the holder: its lease id is stale)
  GET  /_dev/requests            -- the caller's organization's /api/v1 requests among the last 10,000 the
                                    server answered (unauthenticated ones are not kept), in order: method, path,
                                    status, lease_id (from a job route's body), received and t (Unix
                                    seconds: body read, answer ready); `?since=T` keeps those answered after T
"""

from __future__ import annotations

import collections
import re
import threading
import time

from .handlers import body
from .keys_store import require_job, require_unrestricted
from .validate import check_worker_id


class RequestLog:
    """A bounded, thread-safe record of the /api/v1 requests answered."""

    def __init__(self, size: int = 10_000):
        self._entries: collections.deque[tuple[str, dict]] = collections.deque(maxlen=size)
        self._lock = threading.Lock()

    def record(self, method: str, path: str, status: int, raw_body: bytes | None, received: float,
               org: str | None = None) -> None:
        """Record one answered request of `org` (None: it did not authenticate, and nobody sees it)."""
        if not path.startswith("/api/v1/") or org is None:
            return
        entry = {"method": method, "path": path, "status": status, "lease_id": _lease_id(path, raw_body),
                 "received": received, "t": time.time()}
        with self._lock:
            self._entries.append((org, entry))

    def since(self, t: float, org: str) -> list[dict]:
        """`org`'s requests answered after `t`, in order."""
        with self._lock:
            return [e for o, e in self._entries if o == org and e["t"] > t]


_LEASE_ID = re.compile(rb'"lease_id"\s*:\s*"([^"\\]{1,255})"')


def _lease_id(path: str, raw_body: bytes | None) -> str | None:
    """The lease_id a job route's body names (a regex, not a parse: results can be MiBs)."""
    if not raw_body or not path.startswith("/api/v1/jobs/"):
        return None
    m = _LEASE_ID.search(raw_body)
    return m.group(1).decode("ascii", "replace") if m else None


def get_requests(app, req):
    require_unrestricted(req, "read the organization's request log")  # it holds every queue's lease ids
    raw = (req.query.get("since") or ["0"])[0]
    try:
        since = float(raw)
    except ValueError:
        since = 0.0
    return 200, app.requests.since(since, req.org), None


def expire_lease(app, req):
    require_job(app.store, req.key, req.org, req.params["id"])
    app.store.expire_lease(req.org, req.params["id"])
    return 200, {"success": True}, None


def steal_lease(app, req):
    require_job(app.store, req.key, req.org, req.params["id"])
    b = body(req, optional=True)
    worker = check_worker_id(b.str("worker_id", False, 1, 255) or "dev-thief")
    secs = b.int("lease_duration_secs", False, 5, 3600, default=app.cfg.lease_duration)
    return 200, app.store.steal_lease(req.org, req.params["id"], worker, secs), None
