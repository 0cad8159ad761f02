"""The `schedules` routes: create, list, get, update, delete, pause, resume, trigger now and history, validated
as the server validates them (cron expressions by supervisor.devserver.cron, 400 "Invalid cron expression:
..."; 404 "Schedule not found"). The sweep (supervisor.devserver.sweeps) fires them."""

from __future__ import annotations

import time

from . import cron, schedules_store
from .errors import HttpError, validation
from .handlers import U32, _json_text, body, query_int
from .keys_store import require_queue, scope
from .store import ts
from .validate import check_queue_name

ONE_MIB = 1024 * 1024


def _cron(expression: str | None, now: float) -> tuple[bool, float | None]:
    """(given?, next fire) for an expression, or the server's 400."""
    if expression is None:
        return False, None
    if len(expression) < 9 or len(expression) > 100:
        raise validation("cron_expression", "Invalid cron expression length", "length")
    try:
        return True, cron.next_after(cron.parse(expression), now)
    except cron.CronError as e:
        raise HttpError(400, "BAD_REQUEST", f"Invalid cron expression: {e}") from None


def _fields(b, creating: bool) -> dict:
    f: dict = {"name": b.str("name", creating, 1, 255), "description": b.str("description", False, 0, 1000),
               "cron_expression": b.str("cron_expression", creating, 0, 10_000),
               "timezone": b.str("timezone", False, 0, 255),
               "priority": b.int("priority", False, -100, 100), "max_retries": b.int("max_retries", False, 0, 100),
               "timeout_seconds": b.int("timeout_seconds", False, 1, 86400)}
    if f["timezone"] is not None and not cron.timezone_ok(f["timezone"]):
        raise validation("timezone", "Invalid timezone. Use IANA timezone names like 'UTC', 'America/New_York', etc.",
                         "invalid_timezone")
    present, template = b.any("payload_template", required=creating)
    if present and (creating or template is not None):
        f["payload_template"] = _json_text("payload_template", template, ONE_MIB)
    for name in ("tags", "metadata"):
        present, value = b.any(name)
        f[name] = _json_text(name, value, ONE_MIB) if present and value is not None else None
    return f


def _limit(req, default: int) -> int:
    return query_int(req, "limit", default, 0, 500, U32)


def create(app, req):
    b = body(req)
    f = _fields(b, True)
    f["queue_name"] = check_queue_name(b.str("queue_name", True, 0, 10**6))  # one a claim accepts
    require_queue(req, f["queue_name"])
    now = time.time()
    _, next_run = _cron(f["cron_expression"], now)
    return 201, schedules_store.create(app.store, req.org, f, next_run, now), None


def _schedule_id(app, req) -> str:
    """The `{id}` schedule; 404 "Schedule not found" for a queue-scoped key when it fires into another queue."""
    sid = req.params["id"]
    allowed = scope(req.key)
    if allowed is not None:
        rows = app.store._read("SELECT queue_name FROM schedules WHERE id=? AND organization_id=?", (sid, req.org))
        if rows and rows[0][0] not in allowed:
            raise schedules_store.not_found()
    return sid


def list_schedules(app, req):
    allowed = scope(req.key)
    items = schedules_store.list_schedules(app.store, req.org, _limit(req, 100) if allowed is None else 10**6)
    if allowed is not None:
        items = [s for s in items if s["queue_name"] in allowed][:_limit(req, 100)]
    return 200, items, None


def get(app, req):
    return 200, schedules_store.get(app.store, req.org, _schedule_id(app, req)), None


def update(app, req):
    sid = _schedule_id(app, req)
    b = body(req)
    f = _fields(b, False)
    f["is_active"] = b.bool("is_active")
    if f["is_active"] is not None:
        f["is_active"] = int(f["is_active"])
    given, next_run = _cron(f["cron_expression"], time.time())
    f["next_run_at"] = next_run if given else None  # a new expression that never fires keeps the old next run
    return 200, schedules_store.update(app.store, req.org, sid, f, time.time()), None


def delete(app, req):
    schedules_store.delete(app.store, req.org, _schedule_id(app, req))
    return 204, None, None


def pause(app, req):
    return 200, schedules_store.set_active(app.store, req.org, _schedule_id(app, req), False, time.time()), None


def resume(app, req):
    return 200, schedules_store.set_active(app.store, req.org, _schedule_id(app, req), True, time.time()), None


def trigger(app, req):
    now = time.time()
    jid, _, _ = schedules_store.trigger(app.store, req.org, _schedule_id(app, req), now)
    return 200, {"job_id": jid, "triggered_at": ts(now)}, None


def history(app, req):
    return 200, schedules_store.history(app.store, req.org, _schedule_id(app, req), _limit(req, 50)), None
