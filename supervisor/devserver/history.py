"""Every job's history (each change of status or lease, with its time, worker and lease id), kept by the
dev server only: the real Spooled API has no such record, so it is served under /_dev/ (see ui.py).

The rows are written by SQLite triggers on the jobs table, so every path that changes a job (REST, gRPC,
the sweeps, the DLQ routes, the /_dev lease tools) records it in the same transaction; a deleted job's
history goes with it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

_NOW = "((julianday('now') - 2440587.5) * 86400.0)"
_ROW = ("INSERT INTO job_events(job_id, organization_id, at, from_status, to_status, worker_id, lease_id, "
        "retry_count, error) VALUES ")

HISTORY_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS job_events(
  seq INTEGER PRIMARY KEY AUTOINCREMENT, job_id TEXT NOT NULL, organization_id TEXT NOT NULL, at REAL NOT NULL,
  from_status TEXT, to_status TEXT NOT NULL, worker_id TEXT, lease_id TEXT, retry_count INTEGER, error TEXT);
CREATE INDEX IF NOT EXISTS job_events_job ON job_events(job_id, seq);
CREATE INDEX IF NOT EXISTS job_events_org_at ON job_events(organization_id, at);
CREATE TRIGGER IF NOT EXISTS job_events_insert AFTER INSERT ON jobs BEGIN
  {_ROW}(NEW.id, NEW.organization_id, COALESCE(NEW.created_at, {_NOW}), NULL, NEW.status, NULL, NULL,
         NEW.retry_count, NULL);
END;
CREATE TRIGGER IF NOT EXISTS job_events_update AFTER UPDATE OF status, lease_id ON jobs
WHEN OLD.status IS NOT NEW.status OR OLD.lease_id IS NOT NEW.lease_id BEGIN
  {_ROW}(NEW.id, NEW.organization_id, COALESCE(NEW.updated_at, {_NOW}), OLD.status, NEW.status,
         COALESCE(NEW.assigned_worker_id, OLD.assigned_worker_id), COALESCE(NEW.lease_id, OLD.lease_id),
         NEW.retry_count, CASE WHEN NEW.last_error IS NOT OLD.last_error THEN NEW.last_error END);
END;
CREATE TRIGGER IF NOT EXISTS job_events_delete AFTER DELETE ON jobs BEGIN
  DELETE FROM job_events WHERE job_id = OLD.id;
END;
"""

EVENT_COLS = ("at", "from_status", "to_status", "worker_id", "lease_id", "retry_count", "error")


def what_happened(from_status: str | None, to_status: str, error: str | None) -> str:
    """One word for a change: created, started, completed, failed (to be retried), dead-lettered, ..."""
    if from_status is None:
        return "created" if to_status == "pending" else to_status
    if to_status == "processing":
        return "re-leased" if from_status == "processing" else "started"
    if to_status == "completed":
        return "completed"
    if to_status == "deadletter":
        return "dead-lettered"
    if to_status == "cancelled":
        return "cancelled"
    if from_status == "processing" and to_status in ("pending", "scheduled"):
        return "failed" if error else "released"
    if from_status in ("deadletter", "failed", "cancelled") and to_status in ("pending", "scheduled"):
        return "retried"
    return to_status


def job_history(read: Callable[[str, tuple], list], org: str, job_id: str, limit: int = 1000) -> list[dict[str, Any]]:
    """The job's changes, oldest first, for `org` only (another organization's job has none)."""
    rows = read("SELECT " + ", ".join(EVENT_COLS) + " FROM job_events WHERE job_id=? AND organization_id=? "
                "ORDER BY seq LIMIT ?", (job_id, org, limit))
    out = []
    for row in rows:
        event = dict(zip(EVENT_COLS, row, strict=True))
        event["event"] = what_happened(event["from_status"], event["to_status"], event["error"])
        out.append(event)
    return out


def throughput(read: Callable[[str, tuple], list], org: str, now: float, minutes: int = 30) -> dict[str, list[int]]:
    """Per queue, jobs that ended (completed, failed, dead-lettered) in each of the last `minutes` minutes,
    oldest first. It reads only the window's rows (index job_events_org_at), so a long history costs the
    lock it holds nothing."""
    start = (int(now) // 60 - minutes + 1) * 60
    rows = read("SELECT j.queue_name, CAST((e.at - ?) / 60 AS INTEGER), COUNT(*) FROM job_events e "
                "JOIN jobs j ON j.id = e.job_id WHERE e.organization_id=? AND e.at>=? AND e.from_status='processing' "
                "AND e.to_status!='processing' GROUP BY 1, 2", (start, org, start))
    out: dict[str, list[int]] = {}
    for queue, minute, count in rows:
        if 0 <= minute < minutes:
            out.setdefault(queue, [0] * minutes)[minute] = count
    return out
