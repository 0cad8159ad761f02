"""`GET /dashboard` (the organization's jobs, queues, workers and the last hour at a glance) and
`PUT /jobs/{id}/priority` (a waiting job's new priority)."""

from __future__ import annotations

import time

import supervisor

from . import overview_store
from .errors import HttpError
from .handlers import body
from .keys_store import KeyContext, require_unrestricted
from .store import ts

STARTED = time.time()
_MONO = time.monotonic()


def dashboard(app, req):
    require_unrestricted(req, "read the organization's dashboard")  # it counts every queue's jobs and workers
    ok = app.store.ping()
    answer = overview_store.dashboard(app.store, req.org, time.time())
    answer["system"] = {"version": supervisor.__version__, "uptime_seconds": int(time.monotonic() - _MONO),
                        "started_at": ts(STARTED), "database_status": "healthy" if ok else "unhealthy",
                        "cache_status": "healthy", "environment": "development"}
    return 200, answer, None


def set_priority(app, req):
    b = body(req)
    priority = b.int("priority", True, -100, 100)
    job_id = req.params["id"]
    key = req.key
    if isinstance(key, KeyContext) and not key.unrestricted:  # another queue's job is hidden, as not found
        try:
            queue = app.store.job_raw(req.org, job_id)["queue_name"]
        except HttpError:
            queue = None
        if queue is not None and not key.can_access(queue):
            raise HttpError(404, "NOT_FOUND", f"Job {job_id} not found or not in pending/scheduled state")
    return 200, overview_store.set_priority(app.store, req.org, job_id, priority, time.time()), None
