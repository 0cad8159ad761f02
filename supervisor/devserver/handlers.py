"""One function per route: validate the request (validate.Body), call the Store, shape the answer.

Each handler takes (app, req) and returns (status, json_or_None, headers_or_None).
`req` has .org, .params (path), .query (dict of lists), .body (bytes), .headers.
"""

from __future__ import annotations

from typing import Any

from supervisor import exactjson

from .errors import HttpError, invalid_json, invalid_type, not_found, validation
from .keys_store import (
    require_job,
    require_queue,
    require_unrestricted,
    scope,
    visible_workers,
    worker_in_scope,
)
from .realtime import _NOTHING, EventStream, JobStream, QueueStream
from .store import dumps
from .validate import I64, Body, check_hostname, check_queue_name, check_url, check_worker_id
from .validate import query_int as parse_query_int

WORKER_STATUSES = ("healthy", "degraded", "draining", "offline")
JOB_STATUSES = ("pending", "scheduled", "processing", "completed", "failed", "deadletter", "cancelled")
SIXTY_FOUR_K = 64 * 1024
MAX_STREAMS_PER_ORG = 100  # open event streams (and, apart, WebSockets) per organization


def parse_json(req, optional: bool = False):
    """The request body as JSON (400 INVALID_JSON when malformed/empty/not declared JSON)."""
    if not req.body.strip():
        if optional:
            return {}
        raise invalid_json("Request body is empty", "empty_body")
    ctype = req.headers.get("content-type", "")
    if "application/json" not in ctype.lower():
        raise invalid_json("Expected request with `Content-Type: application/json`", "invalid_content_type")
    try:
        return exactjson.loads(req.body)  # integers of any size stay exact; NaN / Infinity are refused
    except ValueError as e:
        raise invalid_json(f"Failed to parse the request body as JSON: {e}") from None


def body(req, optional: bool = False) -> Body:
    return Body(parse_json(req, optional))


def _encode(field: str, value) -> str:
    """JSON text of a parsed body value, big integers exact; 400 if even the stdlib can't encode it."""
    try:
        return dumps(value)
    except (ValueError, TypeError, RecursionError):
        raise validation(field, f"{field} cannot be stored as JSON (nested too deeply)", "invalid_json") from None


def _json_text(field: str, value, limit: int) -> str:
    text = _encode(field, value)
    if len(text.encode()) > limit:
        raise validation(field, f"{field} size ({len(text.encode())} bytes) exceeds maximum ({limit} bytes)",
                         "too_large")
    return text


def _lease_id(b: Body) -> str:
    # As newer servers answer it: complete / fail / job heartbeat without lease_id -> 422 missing field.
    return b.str("lease_id", required=True, max_len=255)


U32 = (0, 2**32 - 1)  # with I64, the server's integer types for query parameters it parses, then clamps


def query_int(req, name: str, default: int, lo: int, hi: int, parsed_as: tuple[int, int] | None = None) -> int:
    """The integer query parameter `name` (`default` when absent or empty), in lo..hi.

    Without `parsed_as`, junk is 422-style VALIDATION_ERROR and a value outside lo..hi is refused. With it
    (the server's integer type, I64 or U32), junk or a value that type cannot hold is the server's 400
    "Failed to deserialize query string", and any other value is clamped into lo..hi. Either way the result
    fits SQLite."""
    raw = req.query.get(name, [None])[-1]
    if raw is None or raw == "":
        return default
    v = parse_query_int(raw, *(parsed_as or I64))
    if parsed_as is not None:
        if v is None:
            raise HttpError(400, "BAD_REQUEST",
                            f"Failed to deserialize query string: {name}: invalid digit found in string")
        return min(max(v, lo), hi)
    if v is None:
        raise validation(name, "must be an integer", "invalid_type")
    if v < lo or v > hi:
        raise validation(name, f"must be between {lo} and {hi}", "range")
    return v


def _q_str(req, name):
    v = req.query.get(name, [None])[-1]
    return v or None


# ---------- organizations / health / dev ----------
def create_org(app, req):
    b = body(req)
    name = b.str("name", True, 3, 100)
    slug = b.str("slug", True, 3, 50)
    email = b.str("billing_email", False, 3, 255)
    if not all("0" <= c <= "9" or ("a" <= c <= "z") or c == "-" for c in slug) or slug[0] == "-" or slug[-1] == "-":
        raise validation("slug", "must be lowercase letters, digits and hyphens, not starting or ending with '-'",
                         "invalid_slug")
    return 201, app.store.create_org(name, slug, email), None


def health(app, req):
    ok = app.store.ping()
    return 200, {"status": "healthy" if ok else "degraded", "database": ok, "cache": True}, None


def health_live(app, req):
    return 200, None, None


def health_ready(app, req):
    if not app.store.ping():
        raise HttpError(503, "SERVICE_UNAVAILABLE", "Database is not available")
    return 200, None, None


def get_faults(app, req):
    """GET /_dev/faults: the faults the caller's organization's requests get."""
    return 200, app.faults.snapshot(req.org), None


def get_stats(app, req):
    """GET /_dev/stats: the caller's organization's request counts (it must authenticate)."""
    return 200, app.stats.snapshot(req.org), None


def set_faults(app, req):
    require_unrestricted(req, "set the organization's faults")  # they hit every queue
    data = parse_json(req)
    if not isinstance(data, dict):
        raise validation("body", "must be a JSON object", "invalid_type")
    try:
        return 200, app.faults.update(data, req.org), None  # the caller's organization alone
    except ValueError as e:
        raise validation(str(e).split()[0], str(e), "range") from None


# ---------- workers ----------
def register_worker(app, req):
    b = body(req)
    queue = b.str("queue_name", True, 1, 100)
    check_queue_name(queue)
    require_queue(req, queue)
    hostname = check_hostname(b.str("hostname", True, 1, 255))
    wid = b.str("worker_id", False, 1, 128)
    if wid is not None:
        check_worker_id(wid)
    w = {"worker_id": wid, "queue_name": queue, "hostname": hostname,
         "worker_type": b.str("worker_type", False, 0, 50), "version": b.str("version", False, 0, 50),
         "max_concurrency": b.int("max_concurrency", False, 1, 100, default=5)}
    present, meta = b.any("metadata")
    w["metadata"] = _json_text("metadata", meta if present and meta is not None else {}, SIXTY_FOUR_K)
    wid = app.store.register_worker(req.org, w, app.cfg.max_workers)
    return 201, {"id": wid, "queue_name": queue, "lease_duration_secs": app.cfg.lease_duration,
                 "heartbeat_interval_secs": app.cfg.heartbeat_interval}, None


def _require_worker(app, req) -> str:
    """The `{id}` worker, 404 "Worker not found" when a queue-scoped key may not see it (a queue of the
    worker lies outside the key's)."""
    wid = req.params["id"]
    if not worker_in_scope(app.store, req.key, req.org, wid):
        raise not_found("Worker not found")
    return wid


def worker_heartbeat(app, req):
    _require_worker(app, req)
    b = body(req)
    current = b.int("current_jobs", True, 0, 1000)
    status = b.str("status", False, 1, 20, default="healthy")
    if status not in WORKER_STATUSES:
        raise validation("status", "must be one of healthy, degraded, draining, offline", "invalid_status")
    present, meta = b.any("metadata")
    meta_text = _json_text("metadata", meta, SIXTY_FOUR_K) if present and meta is not None else None
    app.store.worker_heartbeat(req.org, req.params["id"], current, status, meta_text)
    return 200, None, None


def deregister_worker(app, req):
    _require_worker(app, req)
    app.store.deregister_worker(req.org, req.params["id"])
    return 204, None, None


def list_workers(app, req):
    """The organization's workers; a queue-scoped key sees those whose queues all lie in its scope."""
    workers = app.store.list_workers(req.org)
    visible = visible_workers(app.store, req.key, req.org)
    return 200, workers if visible is None else [w for w in workers if w["id"] in visible], None


def get_worker(app, req):
    _require_worker(app, req)
    return 200, app.store.get_worker(req.org, req.params["id"]), None


# ---------- jobs ----------
def _job_fields(app, b: Body, queue: str, defaults: dict | None = None) -> dict:
    """Validate one job's fields (single create or a bulk item)."""
    defaults = defaults or {}
    present, payload = b.any("payload", required=True)
    j: dict[str, Any] = {"queue_name": queue, "payload": _json_text("payload", payload, app.cfg.max_payload_bytes)}
    j["priority"] = b.int("priority", False, -100, 100, default=defaults.get("priority"))
    j["max_retries"] = b.int("max_retries", False, 0, 100, default=defaults.get("max_retries"))
    j["timeout_seconds"] = b.int("timeout_seconds", False, 1, 86400, default=defaults.get("timeout_seconds"))
    j["scheduled_at"] = b.time("scheduled_at")
    j["expires_at"] = b.time("expires_at")
    j["idempotency_key"] = b.str("idempotency_key", False, 1, 255)
    j["parent_job_id"] = b.str("parent_job_id", False, 1, 255)
    hook = b.str("completion_webhook", False, 1, 2048)
    j["completion_webhook"] = None if hook is None else check_url(hook, "completion_webhook")
    j["completion_webhook_secret"] = b.str("completion_webhook_secret", False, 0, 255)
    present, tags = b.any("tags")
    j["tags"] = _json_text("tags", tags, SIXTY_FOUR_K) if present and tags is not None else None
    return j


def create_job(app, req):
    b = body(req)
    queue = b.queue_name()
    require_queue(req, queue)
    fields = _job_fields(app, b, queue)
    jid, created = app.store.create_job(req.org, fields)  # the store announces job.created
    return (201 if created else 200), {"id": jid, "created": created}, None


def bulk_create(app, req):
    b = body(req)
    queue = b.queue_name()
    require_queue(req, queue)
    jobs = b.list("jobs", True, 100, 1)
    defaults = {"priority": b.int("default_priority", False, -100, 100),
                "max_retries": b.int("default_max_retries", False, 0, 100),
                "timeout_seconds": b.int("default_timeout_seconds", False, 1, 86400)}
    items: list[tuple[int, dict | HttpError]] = []
    for i, raw in enumerate(jobs):
        try:
            items.append((i, _job_fields(app, Body(raw), queue, defaults)))
        except HttpError as e:
            items.append((i, e))
    return 200, app.store.bulk_create(req.org, items), None


def event_filter(app, req) -> tuple[str | None, set[str] | None, str | None]:
    """The realtime filters of `/api/v1/events` and `/api/v1/ws`: `queue` (a valid queue name, else 400),
    `events` (comma-separated names to keep) and `job_id`; 404 with `--events off`, 503 while refusing."""
    if not app.cfg.events:
        raise HttpError(404, "NOT_FOUND", "No route matches this path")
    if app.events.refusing(req.org):
        raise HttpError(503, "SERVICE_UNAVAILABLE", "Event streams are refused for now", headers={"Retry-After": "1"})
    queue = req.query.get("queue", [None])[0]
    if queue is not None:
        check_queue_name(queue, "queue")
        require_queue(req, queue)
    names = req.query.get("events", [None])[0]
    wanted = {n.strip().lower() for n in names.split(",") if n.strip()} if names else None
    job_id = req.query.get("job_id", [None])[0] or None
    return queue, wanted, job_id


def open_subscriber(app, req, queue: str | None, wanted: set[str] | None, job_id: str | None, raw: bool,
                    cap: int = MAX_STREAMS_PER_ORG):
    """A new subscriber for the caller, kept to a queue-scoped key's queues and ended with its key (revoked or
    expired); None when the organization already has `cap` of this kind open."""
    key = req.key
    return app.events.subscribe_capped(req.org, queue, wanted, job_id, raw, cap,
                                       key_id=getattr(key, "key_id", None), scope=scope(key),
                                       expires_at=getattr(key, "expires_at", None))


def sse_events(app, req):
    """GET /api/v1/events: the organization's realtime events as server-sent events (supervisor.devserver.realtime);
    at most MAX_STREAMS_PER_ORG open at once per organization (429), as the real server caps them."""
    queue, wanted, job_id = event_filter(app, req)
    sub = open_subscriber(app, req, queue, wanted, job_id, raw=False)
    if sub is None:
        raise HttpError(429, "RATE_LIMIT_EXCEEDED", "Too many SSE connections")
    return 200, EventStream(app.events, sub), None


def _stream(app, req, queue: str | None, names, job_id: str | None):
    """A counted subscriber for one more of the caller's event streams (see `open_subscriber`); 404 with
    `--events off`, 503 while refusing, 429 past MAX_STREAMS_PER_ORG."""
    if not app.cfg.events:
        raise HttpError(404, "NOT_FOUND", "No route matches this path")
    if app.events.refusing(req.org):
        raise HttpError(503, "SERVICE_UNAVAILABLE", "Event streams are refused for now", headers={"Retry-After": "1"})
    sub = open_subscriber(app, req, queue, names, job_id, raw=False)
    if sub is None:
        raise HttpError(429, "RATE_LIMIT_EXCEEDED", "Too many SSE connections")
    return sub


def sse_job(app, req):
    """GET /api/v1/events/jobs/{id}: one job's status changes until it ends (realtime.JobStream). Another
    organization's job, one outside a scoped key's queues, or none, is an `error` event in the stream, as on
    the server."""
    job_id = req.params["id"]
    sub = _stream(app, req, None, None, job_id)
    allowed = scope(req.key)

    def status():
        found = app.store.job_status(req.org, job_id)
        return found if found is None or allowed is None or found[1] in allowed else None

    return 200, JobStream(app.events, sub, status), None


def sse_queue(app, req):
    """GET /api/v1/events/queues/{name}: the queue's job counts every 5 s (realtime.QueueStream); a name that
    is no valid queue name is 400, a queue the key may not read 403."""
    name = req.params["name"]
    check_queue_name(name, "name")
    require_queue(req, name)
    sub = _stream(app, req, None, _NOTHING, None)
    return 200, QueueStream(app.events, sub, name, lambda: app.store.queue_counts(req.org, name)), None


def event_streams(app, req):
    """GET /_dev/events: how many of the caller's organization's event streams are open, and how many events
    were published to it."""
    return 200, {"streams": app.events.count(req.org), "published": app.events.published_to(req.org)}, None


def drop_event_streams(app, req):
    """POST /_dev/events/drop, body optional {"refuse_secs": s}: end the caller's organization's open event
    streams (clients see their connection close), and answer its new ones 503 for `refuse_secs` seconds
    (default 0). Other organizations' streams are untouched."""
    require_unrestricted(req, "drop the organization's event streams")
    b = body(req, optional=True)
    refuse = b.int("refuse_secs", False, 0, 3600, default=0)
    return 200, {"dropped": app.events.drop_all(req.org, refuse or 0)}, None


def claim(app, req):
    b = body(req)
    queue = b.queue_name()
    require_queue(req, queue)
    worker = b.str("worker_id", True, 1, 255)
    limit = b.int("limit", False, 1, 100, default=1)
    lease = b.int("lease_duration_secs", False, 5, 3600, default=app.cfg.lease_duration)
    return 200, {"jobs": app.store.claim(req.org, queue, worker, limit, lease)}, None


def complete(app, req):
    require_job(app.store, req.key, req.org, req.params["id"], "Job not found or not owned by worker")
    b = body(req)
    worker = b.str("worker_id", True, 1, 255)
    lease_id = _lease_id(b)
    present, result = b.any("result")
    result_text = None if not present or result is None else _encode("result", result)
    app.store.complete(req.org, req.params["id"], worker, lease_id, result_text)
    return 200, {"success": True}, None


def fail(app, req):
    require_job(app.store, req.key, req.org, req.params["id"], "Job not found or not owned by worker")
    b = body(req)
    worker = b.str("worker_id", True, 1, 255)
    error = b.str("error", True, 1, 2048)
    lease_id = _lease_id(b)
    app.store.fail(req.org, req.params["id"], worker, lease_id, error)
    return 200, {"success": True}, None


def job_heartbeat(app, req):
    require_job(app.store, req.key, req.org, req.params["id"], "Job not found or not owned by worker")
    b = body(req)
    worker = b.str("worker_id", True, 1, 255)
    lease_id = _lease_id(b)
    secs = b.int("lease_duration_secs", False, 5, 3600, default=app.cfg.lease_duration)
    app.store.renew_lease(req.org, req.params["id"], worker, lease_id, secs)
    return 200, {"success": True}, None


def get_job(app, req):
    require_job(app.store, req.key, req.org, req.params["id"])
    return 200, app.store.get_job(req.org, req.params["id"]), None


def cancel_job(app, req):
    require_job(app.store, req.key, req.org, req.params["id"])
    app.store.cancel(req.org, req.params["id"])
    return 204, None, None


def retry_job(app, req):
    require_job(app.store, req.key, req.org, req.params["id"])
    return 200, app.store.retry_job(req.org, req.params["id"]), None


def _statuses(req):
    raw = _q_str(req, "status")
    if not raw:
        return None
    out = [s.strip() for s in raw.split(",") if s.strip()]
    for s in out:
        if s not in JOB_STATUSES:
            raise validation("status", f"unknown status '{s}'", "invalid_status")
    return out


def _tag(req) -> str | None:
    """The `tag` filter of the job lists: one tag of at most 64 characters."""
    tag = _q_str(req, "tag")
    if tag is not None and len(tag) > 64:
        raise validation("tag", "must be at most 64 characters", "length")
    return tag


def list_jobs(app, req):
    queue = _q_str(req, "queue_name") or _q_str(req, "queue")
    require_queue(req, queue)
    limit = query_int(req, "limit", 50, 1, 100)
    offset = query_int(req, "offset", 0, 0, 10**9)
    items, more = app.store.list_jobs(req.org, queue, _statuses(req), _tag(req), limit, offset,
                                      scope=scope(req.key))
    return 200, items, {"X-Has-More": "true" if more else "false"}


def job_status(app, req):
    raw = _q_str(req, "ids") or ""
    ids = [i.strip() for i in raw.split(",") if i.strip()]
    if len(ids) > 100:
        raise validation("ids", "at most 100 ids per request", "too_many")
    allowed = scope(req.key)
    rows = app.store.status_by_ids(req.org, ids)
    return 200, rows if allowed is None else [r for r in rows if r["queue_name"] in allowed], None


def job_stats(app, req):
    return 200, app.store.stats(req.org, scope(req.key)), None


def dlq_list(app, req):
    queue = _q_str(req, "queue_name") or _q_str(req, "queue")
    require_queue(req, queue)
    limit = query_int(req, "limit", 50, 1, 100)
    offset = query_int(req, "offset", 0, 0, 10**9)
    items, more = app.store.list_jobs(req.org, queue, ["deadletter"], _tag(req), limit, offset,
                                      scope=scope(req.key))
    return 200, items, {"X-Has-More": "true" if more else "false"}


def _dlq_queue(req, queue: str | None, verb: str) -> str | None:
    """The dead-letter queue a retry or purge acts on: a queue-scoped key must name one of its queues."""
    if queue is None:
        require_unrestricted(req, f"{verb} every queue's dead letters; name a queue")
    require_queue(req, queue)
    return queue


def dlq_retry(app, req):
    b = body(req, optional=True)
    queue = _dlq_queue(req, b.str("queue_name", False, 1, 100), "retry")
    ids = b.list("job_ids", False, 100)
    if ids is not None and not all(isinstance(i, str) for i in ids):
        raise HttpError(422, "VALIDATION_ERROR", "Field `job_ids` has an invalid type: expected an array of strings",
                       details=[{"field": "job_ids", "message": "expected an array of strings",
                                 "code": "invalid_type"}], extra={"error": "Validation failed"})
    limit = b.int("limit", False, 1, 100, default=100)
    return 200, app.store.dlq_retry(req.org, queue, ids, limit), None


def dlq_purge(app, req):
    b = body(req, optional=True)
    if b.bool("confirm", False, False) is not True:
        raise validation("confirm", "must be true to purge the dead-letter queue", "confirm_required")
    queue = _dlq_queue(req, b.str("queue_name", False, 1, 100), "purge")
    older = b.time("older_than")
    limit = b.int("limit", False, 1, 10000, default=10000)
    return 200, {"purged_count": app.store.dlq_purge(req.org, queue, older, limit)}, None


# ---------- queues ----------
def list_queues(app, req):
    allowed = scope(req.key)
    queues = app.store.list_queues(req.org)
    return 200, queues if allowed is None else [q for q in queues if q["queue_name"] in allowed], None


def _queue_name_param(name: str) -> str:
    """The real server's check on the `{name}` of queue read routes: 400 BAD_REQUEST, not VALIDATION_ERROR."""
    if not name or len(name.encode()) > 100:  # bytes, as the server counts them
        raise HttpError(400, "BAD_REQUEST", "Invalid queue name length")
    if not all(c.isalnum() or c in "-_." for c in name):
        raise HttpError(400, "BAD_REQUEST", "Queue name contains invalid characters")
    return name


def get_queue(app, req):
    """`GET /queues/{name}`: the queue's config; a queue that only has jobs gets the defaults `GET /queues`
    lists it with; 404 for a queue that exists in no form."""
    return 200, app.store.get_queue(req.org, _queue_name_param(req.params["name"])), None


def delete_queue(app, req):
    """`DELETE /queues/{name}[?delete_jobs=true]`: 409 while it has pending or processing jobs, unless they
    are deleted too; 404 when there was nothing to delete; else 204."""
    raw = (_q_str(req, "delete_jobs") or "false").lower()
    if raw not in ("true", "false"):
        raise validation("delete_jobs", "must be true or false", "invalid_type")
    app.store.delete_queue(req.org, _queue_name_param(req.params["name"]), raw == "true")
    return 204, None, None


def queue_stats(app, req):
    return 200, app.store.queue_stats(req.org, _queue_name_param(req.params["name"])), None


def pause_queue(app, req):
    b = body(req, optional=True)
    reason = b.str("reason", False, 0, 1000)
    return 200, app.store.pause_queue(req.org, check_queue_name(req.params["name"], "name"), reason), None


def resume_queue(app, req):
    return 200, app.store.resume_queue(req.org, check_queue_name(req.params["name"], "name")), None


def get_queue_config(app, req):
    return 200, app.store.get_queue_config(req.org, req.params["name"]), None


def put_queue_config(app, req):
    b = body(req)
    name = check_queue_name(req.params["name"], "name")
    b.queue_name(required=False)  # optional here (the path names the queue), but a string when sent
    fields = {}
    for col, lo, hi in (("max_retries", 0, 100), ("default_timeout", 1, 86400), ("rate_limit", 1, 100000)):
        v = b.int(col, False, lo, hi)
        if v is not None:
            fields[col] = v
    enabled = b.bool("enabled")
    if enabled is not None:
        fields["enabled"] = int(enabled)
    present, settings = b.any("settings")
    if present and settings is not None:
        if not isinstance(settings, dict):  # pause and resume keep their state in it
            raise invalid_type("settings", "a JSON object")
        fields["settings"] = _json_text("settings", settings, SIXTY_FOUR_K)
    return 200, app.store.put_queue_config(req.org, name, fields), None
