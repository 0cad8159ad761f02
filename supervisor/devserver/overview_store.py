"""The SQL of the dashboard, the organization routes and a job's priority (one Store, its lock and
transactions). Each function takes the Store and `now` (epoch seconds) and returns plain records."""

from __future__ import annotations

import base64
import os

from supervisor import exactjson

from .errors import not_found
from .store import Store, dumps, ts


def dashboard(store: Store, org: str, now: float) -> dict:
    """The job, queue, worker and recent-activity figures of `GET /dashboard`, as the server counts them:
    failed_24h counts failed and dead-lettered jobs updated in the last day; times are averaged over the
    jobs completed in the last day; workers are those heard from within a minute."""
    day, hour = now - 86400, now - 3600
    ((total, pending, processing, completed, failed, dead, wait_ms, run_ms, created_1h, completed_1h,
      failed_1h),) = store._read(
        "SELECT count(*), coalesce(sum(status='pending'), 0), coalesce(sum(status='processing'), 0), "
        "coalesce(sum(status='completed' AND completed_at>?), 0), "
        "coalesce(sum(status IN ('failed','deadletter') AND updated_at>?), 0), coalesce(sum(status='deadletter'), 0), "
        "avg(CASE WHEN status='completed' AND completed_at>? AND started_at IS NOT NULL "
        "THEN (started_at-created_at)*1000.0 END), "
        "avg(CASE WHEN status='completed' AND completed_at>? AND started_at IS NOT NULL "
        "THEN (completed_at-started_at)*1000.0 END), "
        "coalesce(sum(created_at>?), 0), coalesce(sum(status='completed' AND completed_at>?), 0), "
        "coalesce(sum(status IN ('failed','deadletter') AND updated_at>?), 0) "
        "FROM jobs WHERE organization_id=?", (day, day, day, day, hour, hour, hour, org))
    queues = store._read(
        "SELECT j.queue_name, sum(j.status='pending'), sum(j.status='processing'), coalesce(min(qc.enabled), 1) "
        "FROM jobs j LEFT JOIN queue_config qc ON qc.organization_id=j.organization_id AND "
        "qc.queue_name=j.queue_name WHERE j.organization_id=? GROUP BY j.queue_name ORDER BY j.queue_name LIMIT 20",
        (org,))
    ((workers, healthy),) = store._read(
        "SELECT count(*), coalesce(sum(status='healthy'), 0) FROM workers WHERE organization_id=? AND "
        "last_heartbeat>?", (org, now - 60))
    return {
        "jobs": {"total": total, "pending": pending, "processing": processing, "completed_24h": completed,
                 "failed_24h": failed, "deadletter": dead, "avg_wait_time_ms": wait_ms,
                 "avg_processing_time_ms": run_ms},
        "queues": [{"name": q, "pending": p, "processing": r, "paused": not enabled} for q, p, r, enabled in queues],
        "workers": {"total": workers, "healthy": healthy, "unhealthy": workers - healthy},
        "recent_activity": {"jobs_created_1h": created_1h, "jobs_completed_1h": completed_1h,
                            "jobs_failed_1h": failed_1h},
    }


def set_priority(store: Store, org: str, job_id: str, priority: int, now: float) -> dict:
    """A pending or scheduled job's new priority; 404 for any other job (running, finished, unknown)."""
    with store._tx() as db:
        row = db.execute("SELECT priority FROM jobs WHERE id=? AND organization_id=? AND status IN "
                         "('pending','scheduled')", (job_id, org)).fetchone()
        if row is None:
            raise not_found(f"Job {job_id} not found or not in pending/scheduled state")
        db.execute("UPDATE jobs SET priority=?, updated_at=? WHERE id=?", (priority, now, job_id))
    return {"job_id": job_id, "old_priority": row[0], "new_priority": priority}


def _table_count(store: Store, table: str, where: str, args: tuple) -> int:
    """Rows of a table another part of the server may not have created (0 then)."""
    if not store._read("SELECT 1 FROM sqlite_master WHERE type='table' AND name=?", (table,)):
        return 0
    return store._read(f"SELECT count(*) FROM {table} WHERE {where}", args)[0][0]


def resource_counts(store: Store, org: str, now: float) -> dict[str, int]:
    """What the organization holds, by the names of the plan's limits: jobs created since midnight UTC,
    active jobs (pending, scheduled, processing), queues (configured or with jobs), live workers, active
    API keys, schedules, workflows and outgoing webhooks."""
    midnight = now - now % 86400
    ((today, active),) = store._read(
        "SELECT coalesce(sum(created_at>=?), 0), coalesce(sum(status IN ('pending','scheduled','processing')), 0) "
        "FROM jobs WHERE organization_id=?", (midnight, org))
    ((queues,),) = store._read(
        "SELECT count(*) FROM (SELECT queue_name FROM queue_config WHERE organization_id=? UNION "
        "SELECT DISTINCT queue_name FROM jobs WHERE organization_id=?)", (org, org))
    ((workers,),) = store._read("SELECT count(*) FROM workers WHERE organization_id=? AND status IN "
                                "('healthy','degraded')", (org,))
    ((keys,),) = store._read("SELECT count(*) FROM api_keys WHERE organization_id=? AND coalesce(is_active, 1)",
                             (org,))
    return {"jobs_per_day": today, "active_jobs": active, "queues": queues, "workers": workers, "api_keys": keys,
            "schedules": _table_count(store, "schedules", "organization_id=?", (org,)),
            "workflows": _table_count(store, "workflows", "organization_id=?", (org,)),
            "webhooks": _table_count(store, "outgoing_webhooks", "organization_id=?", (org,))}


def organization(store: Store, org: str) -> dict:
    rows = store._read("SELECT id, name, slug, billing_email, plan_tier, settings, created_at, updated_at FROM "
                       "organizations WHERE id=?", (org,))
    if not rows:
        raise not_found("Organization not found")
    oid, name, slug, email, plan, settings, created, updated = rows[0]
    shown = _settings(settings)
    return {"id": oid, "name": name, "slug": slug, "plan_tier": plan or "free", "billing_email": email,
            "settings": shown, "custom_limits": None, "created_at": ts(created), "updated_at": ts(updated)}


def _settings(text: str | None) -> dict:
    try:
        value = exactjson.loads(text or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def webhook_token(store: Store, org: str, now: float, regenerate: bool = False) -> str:
    """The organization's incoming-webhook token (`whk_` + 32 url-safe characters), made on first use as
    the server makes one with the organization; `regenerate` replaces it."""
    with store._tx() as db:
        row = db.execute("SELECT settings FROM organizations WHERE id=?", (org,)).fetchone()
        if row is None:
            raise not_found("Organization not found")
        settings = _settings(row[0])
        token = settings.get("webhook_token")
        if regenerate or not isinstance(token, str):
            token = "whk_" + base64.urlsafe_b64encode(os.urandom(24)).rstrip(b"=").decode()
            settings["webhook_token"] = token
            db.execute("UPDATE organizations SET settings=?, updated_at=? WHERE id=?", (dumps(settings), now, org))
    return token
