"""The SQL of schedules: their rows, their runs, and the sweep that fires the due ones.

Contract (the server's scheduler): a schedule is due when active with `next_run_at <= now`; firing creates
one pending job from the schedule (payload_template, priority, max_retries, timeout_seconds, tags), records
a completed run, adds one to `run_count`, sets `last_run_at = now` and `next_run_at` to the first fire
after now, so a schedule that missed several fires (the server was down) runs once, not once per miss.
Every function takes the Store and `now` (epoch seconds).
"""

from __future__ import annotations

import uuid

from . import cron
from .errors import HttpError
from .store import Fragment, Store, ts

SCHEMA = """
CREATE TABLE IF NOT EXISTS schedules(
  id TEXT PRIMARY KEY, organization_id TEXT NOT NULL, name TEXT NOT NULL, description TEXT,
  cron_expression TEXT NOT NULL, timezone TEXT NOT NULL, queue_name TEXT NOT NULL, payload_template TEXT NOT NULL,
  priority INTEGER NOT NULL, max_retries INTEGER NOT NULL, timeout_seconds INTEGER NOT NULL,
  is_active INTEGER NOT NULL, last_run_at REAL, next_run_at REAL, run_count INTEGER NOT NULL DEFAULT 0,
  tags TEXT, metadata TEXT, created_at REAL NOT NULL, updated_at REAL NOT NULL);
CREATE INDEX IF NOT EXISTS schedules_due ON schedules(next_run_at) WHERE is_active;
CREATE INDEX IF NOT EXISTS schedules_org ON schedules(organization_id, created_at);
CREATE TABLE IF NOT EXISTS schedule_runs(
  id TEXT PRIMARY KEY, schedule_id TEXT NOT NULL, job_id TEXT, status TEXT NOT NULL, error_message TEXT,
  started_at REAL NOT NULL, completed_at REAL);
CREATE INDEX IF NOT EXISTS schedule_runs_by_schedule ON schedule_runs(schedule_id, started_at);
"""
COLS = ("id", "organization_id", "name", "description", "cron_expression", "timezone", "queue_name",
        "payload_template", "priority", "max_retries", "timeout_seconds", "is_active", "last_run_at", "next_run_at",
        "run_count", "tags", "metadata", "created_at", "updated_at")
_SELECT = "SELECT " + ", ".join(COLS) + " FROM schedules"
_TIMES = {"last_run_at", "next_run_at", "created_at", "updated_at"}
_JSON = {"payload_template", "tags", "metadata"}
UPDATABLE = ("name", "description", "cron_expression", "timezone", "payload_template", "priority", "max_retries",
             "timeout_seconds", "is_active", "next_run_at", "tags", "metadata")


def not_found() -> HttpError:
    return HttpError(404, "NOT_FOUND", "Schedule not found")


def ensure_tables(store: Store) -> None:
    with store._tx() as db:
        for stmt in SCHEMA.split(";"):
            if stmt.strip():
                db.execute(stmt)


def schedule_dict(row) -> dict:
    out: dict = {}
    for col, v in zip(COLS, row, strict=True):
        if col in _TIMES:
            v = ts(v)
        elif col in _JSON:
            v = None if v is None else Fragment(v)
        elif col == "is_active":
            v = bool(v)
        out[col] = v
    return out


def create(store: Store, org: str, fields: dict, next_run: float | None, now: float) -> dict:
    sid = str(uuid.uuid4())
    with store._tx() as db:
        db.execute("INSERT INTO schedules (id, organization_id, name, description, cron_expression, timezone, "
                   "queue_name, payload_template, priority, max_retries, timeout_seconds, is_active, next_run_at, "
                   "tags, metadata, created_at, updated_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,1,?,?,?,?,?)",
                   (sid, org, fields["name"], fields.get("description"), fields["cron_expression"],
                    fields.get("timezone") or "UTC", fields["queue_name"], fields["payload_template"],
                    fields.get("priority") or 0, 3 if fields.get("max_retries") is None else fields["max_retries"],
                    fields.get("timeout_seconds") or 300, next_run, fields.get("tags"), fields.get("metadata"),
                    now, now))
    return {"id": sid, "name": fields["name"], "cron_expression": fields["cron_expression"],
            "next_run_at": ts(next_run)}


def list_schedules(store: Store, org: str, limit: int) -> list[dict]:
    rows = store._read(_SELECT + " WHERE organization_id=? ORDER BY created_at DESC LIMIT ?", (org, limit))
    return [schedule_dict(r) for r in rows]


def get(store: Store, org: str, sid: str) -> dict:
    rows = store._read(_SELECT + " WHERE id=? AND organization_id=?", (sid, org))
    if not rows:
        raise not_found()
    return schedule_dict(rows[0])


def update(store: Store, org: str, sid: str, fields: dict, now: float) -> dict:
    """Set the given columns (a None value keeps the column, as the server's COALESCE does)."""
    sets = {k: v for k, v in fields.items() if k in UPDATABLE and v is not None}
    with store._tx() as db:
        if not db.execute("SELECT 1 FROM schedules WHERE id=? AND organization_id=?", (sid, org)).fetchone():
            raise not_found()
        assignments = "".join(f"{col}=?, " for col in sets)
        db.execute(f"UPDATE schedules SET {assignments}updated_at=? WHERE id=?", (*sets.values(), now, sid))
        return schedule_dict(db.execute(_SELECT + " WHERE id=?", (sid,)).fetchone())


def delete(store: Store, org: str, sid: str) -> None:
    with store._tx() as db:
        if db.execute("DELETE FROM schedules WHERE id=? AND organization_id=?", (sid, org)).rowcount == 0:
            raise not_found()
        db.execute("DELETE FROM schedule_runs WHERE schedule_id=?", (sid,))


def set_active(store: Store, org: str, sid: str, active: bool, now: float) -> dict:
    """Pause (next_run_at kept), or resume (next_run_at from now, as the server recomputes it)."""
    with store._tx() as db:
        row = db.execute("SELECT cron_expression FROM schedules WHERE id=? AND organization_id=?",
                         (sid, org)).fetchone()
        if row is None:
            raise not_found()
        if active:
            try:
                next_run = cron.next_after(cron.parse(row[0]), now)
            except cron.CronError:
                next_run = None
            db.execute("UPDATE schedules SET is_active=1, next_run_at=?, updated_at=? WHERE id=?", (next_run, now, sid))
        else:
            db.execute("UPDATE schedules SET is_active=0, updated_at=? WHERE id=?", (now, sid))
        return schedule_dict(db.execute(_SELECT + " WHERE id=?", (sid,)).fetchone())


def _job_from(store: Store, db, org: str, row, now: float) -> str:
    queue, payload, priority, max_retries, timeout, tags = row
    jid, _ = store._insert_job(db, org, {"queue_name": queue, "payload": payload, "priority": priority,
                                         "max_retries": max_retries, "timeout_seconds": timeout, "tags": tags}, now)
    return jid


_JOB_COLS = "queue_name, payload_template, priority, max_retries, timeout_seconds, tags"


def trigger(store: Store, org: str, sid: str, now: float) -> tuple[str, str, int]:
    """Create the schedule's job now (its next fire unchanged); (job id, queue, priority)."""
    with store._tx() as db:
        row = db.execute(f"SELECT {_JOB_COLS} FROM schedules WHERE id=? AND organization_id=?", (sid, org)).fetchone()
        if row is None:
            raise not_found()
        jid = _job_from(store, db, org, row, now)
        db.execute("UPDATE schedules SET last_run_at=?, run_count=run_count+1, updated_at=? WHERE id=?",
                   (now, now, sid))
    announce(store, org, sid, jid, row[0], row[2], now)
    return jid, row[0], row[2]


def history(store: Store, org: str, sid: str, limit: int) -> list[dict]:
    if not store._read("SELECT 1 FROM schedules WHERE id=? AND organization_id=?", (sid, org)):
        raise not_found()
    rows = store._read("SELECT id, schedule_id, job_id, status, error_message, started_at, completed_at FROM "
                       "schedule_runs WHERE schedule_id=? ORDER BY started_at DESC LIMIT ?", (sid, limit))
    return [{"id": r[0], "schedule_id": r[1], "job_id": r[2], "status": r[3], "error_message": r[4],
             "started_at": ts(r[5]), "completed_at": ts(r[6])} for r in rows]


def next_due(store: Store) -> float | None:
    """When the earliest active schedule is due (None when none is)."""
    rows = store._read("SELECT min(next_run_at) FROM schedules WHERE is_active AND next_run_at IS NOT NULL")
    return rows[0][0] if rows else None


def _next_run(expression: str, now: float) -> float | None:
    try:
        return cron.next_after(cron.parse(expression), now)
    except cron.CronError:
        return None


def fire_due(store: Store, now: float, limit: int = 100) -> list[tuple[str, str, str, int]]:
    """Fire every due schedule once (see the module's contract); the jobs made, as (org, job id, queue,
    priority). A schedule whose expression no longer parses gets no next fire. The next runs are worked out
    before the write transaction (a rare expression's walk can take a while, and claims wait on the lock);
    a schedule paused, deleted or fired meanwhile is skipped."""
    due = store._read("SELECT id, cron_expression FROM schedules WHERE is_active AND next_run_at IS NOT NULL AND "
                      "next_run_at<=? ORDER BY next_run_at LIMIT ?", (now, limit))
    planned = {sid: (expression, _next_run(expression, now)) for sid, expression in due}
    made = []
    fired = []
    with store._tx() as db:
        for sid, (planned_expression, next_run) in planned.items():
            row = db.execute(f"SELECT organization_id, cron_expression, {_JOB_COLS} FROM schedules WHERE id=? AND "
                             "is_active AND next_run_at IS NOT NULL AND next_run_at<=?", (sid, now)).fetchone()
            if row is None:
                continue
            org, expression, *job = row
            if expression != planned_expression:  # changed in between: rare, worked out here
                next_run = _next_run(expression, now)
            jid = _job_from(store, db, org, job, now)
            db.execute("INSERT INTO schedule_runs VALUES (?,?,?,'completed',NULL,?,?)",
                       (str(uuid.uuid4()), sid, jid, now, now))
            db.execute("UPDATE schedules SET last_run_at=?, run_count=run_count+1, next_run_at=?, updated_at=? "
                       "WHERE id=?", (now, next_run, now, sid))
            made.append((org, jid, job[0], job[2]))
            fired.append((org, sid, jid, job[0], job[2]))
    for org, sid, jid, queue, priority in fired:
        announce(store, org, sid, jid, queue, priority, now)
    return made


def announce(store: Store, org: str, sid: str, jid: str, queue: str, priority: int, now: float) -> None:
    """After a fire commits: the job's `job.created` (realtime, webhooks) and the schedule's `schedule.triggered`
    (webhooks)."""
    store.publish(org, "job.created", {"job_id": jid, "queue_name": queue, "priority": priority or 0,
                                       "status": "pending"})
    store.publish(org, "schedule.triggered", {"schedule_id": sid, "job_id": jid, "queue_name": queue,
                                              "triggered_at": ts(now)})
