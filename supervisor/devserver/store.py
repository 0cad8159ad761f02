"""The dev server's state and its transactions (SQLite in WAL mode); dependencies.py holds the dependency and
workflow statements these transactions run, workflows.py the workflow routes' own.

Contract: one connection per Store, guarded by a lock; every write runs inside
`BEGIN IMMEDIATE ... COMMIT`, so two server processes on one DB file are also
serialised by SQLite itself (busy_timeout waits). WAL + synchronous=NORMAL: a
killed process loses no committed transaction. Times are stored as epoch
seconds (REAL) and rendered as RFC 3339 UTC with `Z`. JSON values (payload,
result, tags, metadata, settings) are stored as JSON text and sent back verbatim
as orjson fragments. Methods raise errors.HttpError for the real server's error outcomes.
"""

from __future__ import annotations

import base64
import hashlib
import math
import os
import random
import sqlite3
import sys
import threading
import time
import uuid
from collections.abc import Callable
from contextlib import contextmanager

import orjson

from supervisor import exactjson

from . import dependencies
from .errors import HttpError, conflict, lease_expired, not_found, quota_exceeded, validation
from .history import HISTORY_SCHEMA

Fragment = orjson.Fragment
DEFAULT_MAX_RETRIES = 3
DEFAULT_TIMEOUT = 300
LIVE = ("healthy", "degraded")

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS organizations(
  id TEXT PRIMARY KEY, name TEXT, slug TEXT UNIQUE, billing_email TEXT UNIQUE, plan_tier TEXT,
  created_at REAL, updated_at REAL);
CREATE TABLE IF NOT EXISTS api_keys(
  id TEXT PRIMARY KEY, organization_id TEXT NOT NULL, key_hash TEXT UNIQUE NOT NULL, name TEXT, created_at REAL);
CREATE TABLE IF NOT EXISTS workers(
  id TEXT PRIMARY KEY, organization_id TEXT NOT NULL, queue_name TEXT, queue_names TEXT, hostname TEXT,
  worker_type TEXT, max_concurrency INTEGER, current_jobs INTEGER DEFAULT 0, status TEXT,
  last_heartbeat REAL, metadata TEXT, version TEXT, registered_at REAL, updated_at REAL,
  jobs_processed INTEGER NOT NULL DEFAULT 0, jobs_failed INTEGER NOT NULL DEFAULT 0);
CREATE INDEX IF NOT EXISTS workers_live ON workers(status, last_heartbeat);
CREATE INDEX IF NOT EXISTS workers_org ON workers(organization_id, last_heartbeat);
CREATE TABLE IF NOT EXISTS jobs(
  id TEXT PRIMARY KEY, organization_id TEXT NOT NULL, queue_name TEXT NOT NULL, status TEXT NOT NULL,
  payload TEXT NOT NULL, result TEXT, retry_count INTEGER NOT NULL DEFAULT 0, max_retries INTEGER NOT NULL,
  last_error TEXT, created_at REAL NOT NULL, scheduled_at REAL, started_at REAL, completed_at REAL,
  expires_at REAL, priority INTEGER NOT NULL DEFAULT 0, tags TEXT, timeout_seconds INTEGER NOT NULL,
  parent_job_id TEXT, completion_webhook TEXT, completion_webhook_secret TEXT, assigned_worker_id TEXT,
  lease_id TEXT, lease_expires_at REAL, idempotency_key TEXT, updated_at REAL, workflow_id TEXT,
  dependency_mode TEXT, dependencies_met INTEGER);
CREATE INDEX IF NOT EXISTS jobs_ready ON jobs(organization_id, queue_name, priority DESC, created_at)
  WHERE status IN ('pending','scheduled');
CREATE INDEX IF NOT EXISTS jobs_due ON jobs(scheduled_at) WHERE status = 'scheduled';
CREATE INDEX IF NOT EXISTS jobs_lease ON jobs(lease_expires_at) WHERE status = 'processing';
CREATE INDEX IF NOT EXISTS jobs_assigned ON jobs(assigned_worker_id) WHERE status = 'processing';
CREATE UNIQUE INDEX IF NOT EXISTS jobs_idem ON jobs(organization_id, idempotency_key)
  WHERE idempotency_key IS NOT NULL;
CREATE INDEX IF NOT EXISTS jobs_org_created ON jobs(organization_id, created_at);
CREATE INDEX IF NOT EXISTS jobs_parent ON jobs(parent_job_id) WHERE parent_job_id IS NOT NULL;
CREATE TABLE IF NOT EXISTS dead_letter_queue(
  id TEXT PRIMARY KEY, organization_id TEXT NOT NULL, job_id TEXT NOT NULL, queue_name TEXT, reason TEXT,
  original_payload TEXT, error_details TEXT, created_at REAL);
CREATE INDEX IF NOT EXISTS dlq_job ON dead_letter_queue(job_id);
CREATE TABLE IF NOT EXISTS revoked_tokens(jti TEXT PRIMARY KEY, expires_at REAL);
CREATE TABLE IF NOT EXISTS queue_config(
  organization_id TEXT NOT NULL, queue_name TEXT NOT NULL, id TEXT, max_retries INTEGER, default_timeout INTEGER,
  rate_limit INTEGER, enabled INTEGER NOT NULL DEFAULT 1, settings TEXT, created_at REAL, updated_at REAL,
  PRIMARY KEY(organization_id, queue_name));
""" + HISTORY_SCHEMA

JOB_COLS = ("id", "organization_id", "queue_name", "status", "payload", "result", "retry_count", "max_retries",
            "last_error", "created_at", "scheduled_at", "started_at", "completed_at", "expires_at", "priority",
            "tags", "timeout_seconds", "parent_job_id", "completion_webhook", "assigned_worker_id", "lease_id",
            "lease_expires_at", "idempotency_key", "updated_at", "workflow_id", "dependency_mode",
            "dependencies_met")
_JOB_SELECT = "SELECT " + ", ".join(JOB_COLS) + " FROM jobs"
_TIME_COLS = {"created_at", "scheduled_at", "started_at", "completed_at", "expires_at", "lease_expires_at",
              "updated_at"}
_JSON_COLS = {"payload", "result", "tags"}
SUMMARY_COLS = ("id", "queue_name", "status", "priority", "retry_count", "max_retries", "payload", "last_error",
                "created_at", "scheduled_at", "started_at", "completed_at")
_SUMMARY_SELECT = "SELECT " + ", ".join(SUMMARY_COLS) + " FROM jobs"
WORKER_COLS = ("id", "organization_id", "queue_name", "queue_names", "hostname", "worker_type", "max_concurrency",
               "current_jobs", "status", "last_heartbeat", "metadata", "version", "registered_at", "updated_at",
               "jobs_processed", "jobs_failed")


_CLAIM = ("UPDATE jobs SET status='processing', assigned_worker_id=?, lease_id=?||id, lease_expires_at=?, "
          "started_at=?, updated_at=? WHERE id IN (SELECT id FROM jobs WHERE NOT EXISTS (SELECT 1 FROM queue_config "
          "WHERE organization_id=? AND queue_name=? AND NOT enabled) AND organization_id=? AND "
          "queue_name=? AND status IN ('pending','scheduled') AND (scheduled_at IS NULL OR scheduled_at<=?) "
          "AND (expires_at IS NULL OR expires_at>?) AND (dependencies_met IS NULL OR dependencies_met=1) "
          "ORDER BY priority DESC, created_at LIMIT ?) "
          "RETURNING id, queue_name, payload, retry_count, max_retries, timeout_seconds, lease_id, priority, "
          "created_at, workflow_id")


EARLIEST = -62167219200.0  # 0000-01-01T00:00:00Z, the first instant RFC 3339 can write
LATEST = 253402300799.999999  # 9999-12-31T23:59:59.999999Z, the last


def _repair_settings(db) -> None:
    """A queue's settings are a JSON object (pause and resume keep their state in it); rows stored as
    another JSON value by an older server become `{}`."""
    db.execute("UPDATE queue_config SET settings='{}' WHERE settings IS NULL OR NOT json_valid(settings) OR "
               "json_type(settings) != 'object'")


# The schema's version is one marker, `PRAGMA user_version`: the last step below the database has had. Each
# step brings a database of the version before up to its own; a database made before versions were kept is
# version 0. New tables need no step (SCHEMA creates them IF NOT EXISTS); a new column on an existing table
# does (ALTER TABLE ... ADD COLUMN). A database of a higher version than the last step is refused.
def _key_and_org_columns(db) -> None:
    """API keys gain queue scopes, a rate limit, revocation, expiry and last use; organizations gain
    settings (the incoming-webhook token lives there)."""
    for table, column in (("api_keys", "queues TEXT"), ("api_keys", "rate_limit INTEGER"),
                          ("api_keys", "is_active INTEGER NOT NULL DEFAULT 1"), ("api_keys", "expires_at REAL"),
                          ("api_keys", "last_used REAL"), ("organizations", "settings TEXT")):
        if column.split()[0] not in {r[1] for r in db.execute(f"PRAGMA table_info({table})")}:
            db.execute(f"ALTER TABLE {table} ADD COLUMN {column}")


def _one_marker(db) -> None:
    """The version moves from the `meta` row older servers kept beside `PRAGMA user_version` to
    user_version alone."""
    db.execute("DELETE FROM meta WHERE key='schema_version'")


MIGRATIONS: list[tuple[int, Callable]] = [
    (1, _repair_settings),
    (2, _key_and_org_columns),
    (3, _one_marker),
]
SCHEMA_VERSION = MIGRATIONS[-1][0]  # the user_version this code writes


def schema_version(db) -> int:
    """The database's schema version. Servers before the one marker kept it in `meta` (with user_version
    0, or 1 for their job history); that row, when present, is the version."""
    found = db.execute("PRAGMA user_version").fetchone()[0]
    has_meta = db.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='meta'").fetchone()
    row = db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone() if has_meta else None
    if row is None:
        return found
    try:
        return int(row[0])
    except (TypeError, ValueError):
        raise NewerSchema(f"the database's schema version {row[0]!r} (in its meta table) is not a number; "
                          "use another database") from None


def migrate(db) -> None:
    """Run the steps a database has not had yet, and record the version reached in user_version (inside
    the caller's transaction). The caller has refused a database newer than SCHEMA_VERSION."""
    version = schema_version(db)
    for step_version, step in MIGRATIONS:
        if step_version > version:
            step(db)
            version = step_version
    db.execute(f"PRAGMA user_version={version}")


def ts(t: float | None) -> str | None:
    """Epoch seconds -> RFC 3339 UTC with microseconds and `Z`, for any instant from year 0000 to 9999
    (before 1970 too: the second is floored, so the fraction is never negative); outside, the nearest end."""
    if t is None:
        return None
    if not EARLIEST <= t <= LATEST:
        t = EARLIEST if t < EARLIEST else LATEST
    sec, micro = divmod(round(t * 1_000_000), 1_000_000)
    if sec > 253402300799:  # a fraction that rounds up past the last second
        sec, micro = 253402300799, 999999
    g = time.gmtime(sec)
    return (f"{g.tm_year:04d}-{g.tm_mon:02d}-{g.tm_mday:02d}T{g.tm_hour:02d}:{g.tm_min:02d}:{g.tm_sec:02d}."
            f"{micro:06d}Z")


def dumps(value) -> str:
    """Compact JSON text; integers of any size exact (see supervisor.exactjson)."""
    return exactjson.dumps(value).decode()


def _frag(text):
    return None if text is None else Fragment(text)


def _shown_settings(text: str) -> str:
    """A queue's settings as the API shows them: without the pause time kept here as epoch seconds."""
    if "paused_at_epoch" not in text:
        return text
    settings = _settings_object(text)
    settings.pop("paused_at_epoch", None)
    return dumps(settings)


def _settings_object(text: str | None) -> dict:
    """A queue's stored settings as a dict; anything else (not JSON, or JSON but not an object) as {}."""
    try:
        value = exactjson.loads(text or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def new_api_key() -> str:
    return "sp_test_" + base64.urlsafe_b64encode(os.urandom(32)).rstrip(b"=").decode()


def job_dict(row) -> dict:
    out = {}
    for col, v in zip(JOB_COLS, row, strict=True):
        if col in _TIME_COLS:
            v = ts(v)
        elif col in _JSON_COLS:
            v = _frag(v)
        elif col == "dependencies_met":
            v = None if v is None else bool(v)
        out[col] = v
    return out


def summary_dict(row) -> dict:
    (id_, q, status, prio, rc, mr, payload, err, created, sched, started, completed) = row
    job_type = ""
    if payload and payload.startswith("{") and '"job_type"' in payload:
        jt = exactjson.loads(payload).get("job_type")
        job_type = jt if isinstance(jt, str) else ""
    return {"id": id_, "queue_name": q, "status": status, "priority": prio, "attempt": rc, "retry_count": rc,
            "max_retries": mr, "job_type": job_type, "last_error": err, "created_at": ts(created),
            "scheduled_at": ts(sched), "started_at": ts(started), "completed_at": ts(completed)}


def worker_dict(row, full: bool) -> dict:
    w = dict(zip(WORKER_COLS, row, strict=True))
    base = {"id": w["id"], "queue_name": w["queue_name"], "hostname": w["hostname"], "status": w["status"],
            "current_jobs": w["current_jobs"], "max_concurrency": w["max_concurrency"],
            "last_heartbeat": ts(w["last_heartbeat"]), "jobs_processed": w["jobs_processed"],
            "jobs_failed": w["jobs_failed"]}
    if not full:
        return base
    base.update({"organization_id": w["organization_id"], "queue_names": _frag(w["queue_names"]),
                 "worker_type": w["worker_type"], "metadata": _frag(w["metadata"] or "{}"),
                 "version": w["version"], "registered_at": ts(w["registered_at"]),
                 "updated_at": ts(w["updated_at"])})
    return base


RECHECK = 1.0  # seconds a verified API key is trusted before it is read again


class KeyCache:
    """Verified keys by their value, each with the monotonic time it was read."""

    def __init__(self) -> None:
        self._hits: dict[str, tuple[object, float]] = {}

    def get(self, key: str, mono: float) -> object | None:
        hit = self._hits.get(key)
        if hit is None or mono - hit[1] > RECHECK:
            return None
        return hit[0]

    def put(self, key: str, ctx: object, mono: float) -> None:
        if len(self._hits) > 10000:  # a flood of distinct keys cannot grow it without bound
            self._hits.clear()
        self._hits[key] = (ctx, mono)

    def forget(self) -> None:
        self._hits.clear()


class NewerSchema(ValueError):
    """The database was written by a newer version of this code (its schema version is higher), or its
    version cannot be read."""


def split_statements(script: str) -> list[str]:
    """The script's statements, a trigger's body (BEGIN ...; END) kept whole."""
    out: list[str] = []
    part = ""
    for piece in script.split(";"):
        part += piece + ";"
        if sqlite3.complete_statement(part):
            if part.strip(" \n;"):
                out.append(part)
            part = ""
    return out


class Store:
    """The dev server's state. Thread-safe; one instance per process."""

    def __init__(self, path: str):
        self.path = path
        self._lock = threading.RLock()
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=15.0)
        self._db.execute("PRAGMA busy_timeout=15000")
        if path != ":memory:":
            self._db.execute("PRAGMA journal_mode=WAL")
            # Checkpoint every 4000 WAL pages (16 MiB) instead of 1000: the hot pages of the job table and
            # its indexes are copied back (and fsynced) 4x less often, ~20% less CPU per claim+complete.
            self._db.execute("PRAGMA wal_autocheckpoint=4000")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA foreign_keys=OFF")
        try:
            found = schema_version(self._db)
        except NewerSchema:
            self._db.close()
            raise
        if found > SCHEMA_VERSION:
            self._db.close()
            raise NewerSchema(f"the database has schema version {found}, newer than this spooled-supervisor's "
                              f"{SCHEMA_VERSION}; upgrade spooled-supervisor or use another database")
        with self._tx() as db:
            for stmt in split_statements(SCHEMA + ";\n" + dependencies.SCHEMA):
                db.execute(stmt)
            migrate(db)
        self.keys = KeyCache()  # verified API keys (supervisor.devserver.keys_store)
        self.closed = False
        # Called after each committed state change with (org, fact, data): realtime events, webhooks.
        self.listeners: list[Callable[[str, str, dict], None]] = []

    # ---- plumbing ----
    @contextmanager
    def _tx(self):
        """A write transaction: BEGIN IMMEDIATE under the connection lock; rollback on any error."""
        with self._lock:
            db = self._db
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")

    def _read(self, sql, args=()):
        with self._lock:
            return self._db.execute(sql, args).fetchall()

    def read(self, sql: str, args: tuple = ()) -> list:
        """One read statement's rows (for the UI's local routes: supervisor.devserver.ui)."""
        return self._read(sql, args)

    def _emit(self, facts: list[tuple[str, str, dict]]) -> None:
        """Tell every listener what a committed transaction changed, as (org, fact, data) (the facts are listed
        in docs/events.md); a listener's error is logged, never raised into the request that made the change."""
        for listener in self.listeners:
            for org, name, data in facts:
                try:
                    listener(org, name, data)
                except Exception as e:
                    print(f"warning: event listener failed on {name}: {e!r}", file=sys.stderr, flush=True)

    def publish(self, org: str, fact: str, data: dict) -> None:
        """Announce a committed change made outside this module, e.g. `publish(org, "schedule.triggered",
        {"schedule_id", "schedule_name", "job_id", ...})` after a schedule fired: the data is what the
        outgoing webhooks subscribed to that event receive."""
        self._emit([(org, fact, data)])

    def ping(self) -> bool:
        try:
            self._read("SELECT 1")
            return True
        except Exception:
            return False

    def close(self) -> None:
        with self._lock:
            if self.closed:
                return
            self.closed = True
            try:
                if self.path != ":memory:":
                    self._db.execute("PRAGMA wal_checkpoint(PASSIVE)")
            finally:
                self._db.close()

    # ---- orgs and keys ----
    def bootstrap(self, given_key: str | None) -> str:
        """Make sure the default org exists; return the key to print (given, or the stored/generated one)."""
        now = time.time()
        with self._tx() as db:
            row = db.execute("SELECT value FROM meta WHERE key='default_org'").fetchone()
            if row:
                org = row[0]
            else:
                org = str(uuid.uuid4())
                db.execute("INSERT INTO organizations (id, name, slug, billing_email, plan_tier, created_at, "
                           "updated_at) VALUES (?,?,?,?,?,?,?)",
                           (org, "Default", "default", None, "free", now, now))
                db.execute("INSERT INTO meta VALUES ('default_org', ?)", (org,))
            if given_key:
                key = given_key
            else:
                row = db.execute("SELECT value FROM meta WHERE key='default_api_key'").fetchone()
                key = row[0] if row else new_api_key()
                db.execute("INSERT OR REPLACE INTO meta VALUES ('default_api_key', ?)", (key,))
            db.execute("INSERT OR IGNORE INTO api_keys (id, organization_id, key_hash, name, created_at) "
                       "VALUES (?,?,?,?,?)",
                       (str(uuid.uuid4()), org, hash_key(key), "Dev server key", now))
            db.execute("UPDATE api_keys SET is_active=1, expires_at=NULL WHERE key_hash=? AND organization_id=?",
                       (hash_key(key), org))  # the key the dev server prints always works
            owner = db.execute("SELECT organization_id FROM api_keys WHERE key_hash=?", (hash_key(key),)).fetchone()
        if owner[0] != org:
            raise ValueError("the given API key belongs to another organization in this database")
        return key

    def org_for_key(self, key: str) -> str | None:
        """The organization of an active, unexpired API key (uncached; the routes use keys_store)."""
        rows = self._read("SELECT organization_id FROM api_keys WHERE key_hash=? AND coalesce(is_active, 1) AND "
                          "(expires_at IS NULL OR expires_at>?)", (hash_key(key), time.time()))
        return rows[0][0] if rows else None

    def org_plan(self, org: str) -> str:
        rows = self._read("SELECT plan_tier FROM organizations WHERE id=?", (org,))
        return rows[0][0] if rows else "free"

    def create_org(self, name: str, slug: str, billing_email: str | None) -> dict:
        now = time.time()
        org, key_id, key = str(uuid.uuid4()), str(uuid.uuid4()), new_api_key()
        with self._tx() as db:
            if db.execute("SELECT 1 FROM organizations WHERE slug=?", (slug,)).fetchone():
                raise conflict("Organization slug already exists")
            if billing_email and db.execute("SELECT 1 FROM organizations WHERE billing_email=?",
                                            (billing_email,)).fetchone():
                raise conflict("Billing email already in use")
            db.execute("INSERT INTO organizations (id, name, slug, billing_email, plan_tier, created_at, "
                       "updated_at) VALUES (?,?,?,?,?,?,?)",
                       (org, name, slug, billing_email, "free", now, now))
            db.execute("INSERT INTO api_keys (id, organization_id, key_hash, name, created_at) VALUES (?,?,?,?,?)",
                       (key_id, org, hash_key(key), "Initial Admin Key", now))
        return {"organization": {"id": org, "name": name, "slug": slug, "plan_tier": "free",
                                 "billing_email": billing_email, "settings": {}, "created_at": ts(now),
                                 "updated_at": ts(now)},
                "api_key": {"id": key_id, "key": key, "name": "Initial Admin Key", "created_at": ts(now)}}

    # ---- workers ----
    def register_worker(self, org: str, w: dict, max_workers: int | None) -> str:
        """Upsert by id. 409 if another org owns the id; 429 QUOTA_EXCEEDED over the worker cap."""
        now = time.time()
        wid = w["worker_id"] or str(uuid.uuid4())
        with self._tx() as db:
            row = db.execute("SELECT organization_id, status FROM workers WHERE id=?", (wid,)).fetchone()
            if row and row[0] != org:
                raise conflict("Worker ID already in use")
            if max_workers is not None and not (row and row[1] in LIVE):
                (count,) = db.execute("SELECT count(*) FROM workers WHERE organization_id=? AND status IN "
                                      "('healthy','degraded')", (org,)).fetchone()
                if count >= max_workers:
                    plan = db.execute("SELECT plan_tier FROM organizations WHERE id=?", (org,)).fetchone()
                    raise quota_exceeded("workers", count, max_workers, plan[0] if plan else "free")
            args = (w["queue_name"], dumps([w["queue_name"]]), w["hostname"], w["worker_type"],
                    w["max_concurrency"], w["metadata"], w["version"])
            if row:
                db.execute("UPDATE workers SET queue_name=?, queue_names=?, hostname=?, worker_type=?, "
                           "max_concurrency=?, metadata=?, version=?, status='healthy', last_heartbeat=?, "
                           "updated_at=? WHERE id=?", (*args, now, now, wid))
            else:
                db.execute("INSERT INTO workers (queue_name, queue_names, hostname, worker_type, max_concurrency, "
                           "metadata, version, id, organization_id, current_jobs, status, last_heartbeat, "
                           "registered_at, updated_at) VALUES (?,?,?,?,?,?,?,?,?,0,'healthy',?,?,?)",
                           (*args, wid, org, now, now, now))
        self._emit([(org, "worker.registered", {"worker_id": wid, "queue_name": w["queue_name"],
                                                 "hostname": w["hostname"]})])
        return wid

    def worker_heartbeat(self, org: str, wid: str, current_jobs: int, status: str, metadata: str | None) -> None:
        now = time.time()
        with self._tx() as db:
            cur = db.execute("UPDATE workers SET last_heartbeat=?, current_jobs=?, status=?, "
                             "metadata=COALESCE(?, metadata), updated_at=? WHERE id=? AND organization_id=?",
                             (now, current_jobs, status, metadata, now, wid, org))
            if cur.rowcount == 0:
                raise not_found("Worker not found")

    def deregister_worker(self, org: str, wid: str) -> int:
        """Release the worker's processing jobs to pending (no retry increment); mark it offline."""
        now = time.time()
        with self._tx() as db:
            if not db.execute("SELECT 1 FROM workers WHERE id=? AND organization_id=?", (wid, org)).fetchone():
                raise not_found("Worker not found")
            released = db.execute("UPDATE jobs SET status='pending', assigned_worker_id=NULL, lease_id=NULL, "
                                  "lease_expires_at=NULL, updated_at=? WHERE assigned_worker_id=? AND "
                                  "organization_id=? AND status='processing' RETURNING id, queue_name",
                                  (now, wid, org)).fetchall()
            db.execute("UPDATE workers SET status='offline', updated_at=? WHERE id=?", (now, wid))
        facts = [(org, "job.released", {"job_id": jid, "queue_name": q, "new_status": "pending"})
                 for jid, q in released]
        self._emit([*facts, (org, "worker.deregistered", {"worker_id": wid})])
        return len(released)

    def list_workers(self, org: str) -> list[dict]:
        rows = self._read("SELECT " + ", ".join(WORKER_COLS) + " FROM workers WHERE organization_id=? "
                          "ORDER BY last_heartbeat DESC LIMIT 100", (org,))
        return [worker_dict(r, False) for r in rows]

    def get_worker(self, org: str, wid: str) -> dict:
        rows = self._read("SELECT " + ", ".join(WORKER_COLS) + " FROM workers WHERE id=? AND organization_id=?",
                          (wid, org))
        if not rows:
            raise not_found("Worker not found")
        return worker_dict(rows[0], True)

    # ---- job creation ----
    def _queue_defaults(self, db, org, queue):
        row = db.execute("SELECT max_retries, default_timeout FROM queue_config WHERE organization_id=? AND "
                         "queue_name=?", (org, queue)).fetchone()
        if not row:
            return DEFAULT_MAX_RETRIES, DEFAULT_TIMEOUT
        return (DEFAULT_MAX_RETRIES if row[0] is None else row[0]), (DEFAULT_TIMEOUT if row[1] is None else row[1])

    def _insert_job(self, db, org: str, j: dict, now: float, facts: list | None = None) -> tuple[str, bool]:
        key = j.get("idempotency_key")
        if key is not None:
            row = db.execute("SELECT id FROM jobs WHERE organization_id=? AND idempotency_key=?", (org, key)).fetchone()
            if row:
                db.execute("UPDATE jobs SET updated_at=? WHERE id=?", (now, row[0]))
                return row[0], False
        max_retries, timeout = self._queue_defaults(db, org, j["queue_name"])
        if j.get("max_retries") is not None:
            max_retries = j["max_retries"]
        if j.get("timeout_seconds") is not None:
            timeout = j["timeout_seconds"]
        deps = None
        parent = j.get("parent_job_id")
        if parent is not None:
            prow = db.execute("SELECT status, queue_name FROM jobs WHERE id=? AND organization_id=?",
                              (parent, org)).fetchone()
            if not prow:
                raise validation("parent_job_id", "parent_job_id does not reference a job in this organization",
                                 "invalid_parent")
            if prow[1] != j["queue_name"]:
                raise validation("parent_job_id", "parent_job_id must reference a job in the same queue",
                                 "invalid_parent")
            deps = 1 if prow[0] == "completed" else 0
        sched = j.get("scheduled_at")
        status = "scheduled" if sched is not None and sched > now else "pending"
        jid = str(uuid.uuid4())
        db.execute("INSERT INTO jobs (id, organization_id, queue_name, status, payload, retry_count, max_retries, "
                   "created_at, scheduled_at, expires_at, priority, tags, timeout_seconds, parent_job_id, "
                   "completion_webhook, completion_webhook_secret, idempotency_key, updated_at, dependencies_met) "
                   "VALUES (?,?,?,?,?,0,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                   (jid, org, j["queue_name"], status, j["payload"], max_retries, now, sched, j.get("expires_at"),
                    j.get("priority") or 0, j.get("tags"), timeout, parent, j.get("completion_webhook"),
                    j.get("completion_webhook_secret"), key, now, deps))
        if deps == 0 and parent is not None:  # the parent's completion releases it through this edge, as the
            # real server records one
            dependencies.add_edge(db, jid, parent, "all", now)
        if facts is not None:
            facts.append((org, "job.created", {"job_id": jid, "queue_name": j["queue_name"],
                                               "priority": j.get("priority") or 0, "status": status}))
        return jid, True

    def create_job(self, org: str, j: dict) -> tuple[str, bool]:
        facts: list = []
        with self._tx() as db:
            out = self._insert_job(db, org, j, time.time(), facts)
        self._emit(facts)
        return out

    def bulk_create(self, org: str, items: list[tuple[int, dict | HttpError]]) -> dict:
        """items: list of (index, job dict) or (index, HttpError). All in one transaction."""
        succeeded, failed = [], []
        now = time.time()
        facts: list = []
        with self._tx() as db:
            for index, item in items:
                if isinstance(item, HttpError):
                    failed.append({"index": index, "error": item.body["message"]})
                    continue
                try:
                    jid, created = self._insert_job(db, org, item, now, facts)
                except HttpError as e:
                    failed.append({"index": index, "error": e.body["message"]})
                    continue
                succeeded.append({"index": index, "job_id": jid, "created": created})
        self._emit(facts)
        return {"succeeded": succeeded, "failed": failed, "total": len(items),
                "success_count": len(succeeded), "failure_count": len(failed)}

    # ---- the worker hot path ----
    def claim(self, org: str, queue: str, worker_id: str, limit: int, lease_secs: int) -> list[dict]:
        """Atomically lease up to `limit` eligible jobs; paused or unknown queues give []."""
        rows, expires = self._claim_rows(org, queue, worker_id, limit, lease_secs)
        lease_at = ts(expires)
        return [{"id": r[0], "queue_name": r[1], "payload": Fragment(r[2]), "retry_count": r[3],
                 "max_retries": r[4], "timeout_seconds": r[5], "lease_expires_at": lease_at, "lease_id": r[6]}
                for r in rows]

    def claim_raw(self, org: str, queue: str, worker_id: str, limit: int, lease_secs: int) -> list[dict]:
        """`claim` for the gRPC server: the same lease, answered with raw columns (JSON text, epoch times)."""
        rows, expires = self._claim_rows(org, queue, worker_id, limit, lease_secs)
        return [{"id": r[0], "organization_id": org, "queue_name": r[1], "status": "processing", "payload": r[2],
                 "retry_count": r[3], "max_retries": r[4], "timeout_seconds": r[5], "lease_id": r[6],
                 "priority": r[7], "created_at": r[8], "lease_expires_at": expires, "started_at": expires - lease_secs,
                 "assigned_worker_id": worker_id} for r in rows]

    def _claim_rows(self, org: str, queue: str, worker_id: str, limit: int, lease_secs: int) -> tuple[list, float]:
        prefix = str(uuid.uuid4()) + "-"
        with self._tx() as db:  # one statement: a paused queue (enabled=0) leases nothing
            # the clock is read under the lock: a job another call released (its dependency completed, read
            # its time before waiting for the lock) is never stamped as started before that completion
            now = time.time()
            expires = now + lease_secs
            rows = db.execute(_CLAIM, (worker_id, prefix, expires, now, now, org, queue, org, queue, now, now,
                                       limit)).fetchall()
            workflows = {r[9] for r in rows if r[9] is not None}
            if workflows:
                dependencies.touch(db, workflows, now)
        rows.sort(key=lambda r: (-r[7], r[8]))
        if rows and self.listeners:
            self._emit([(org, "job.started", {"job_id": r[0], "queue_name": r[1], "worker_id": worker_id})
                        for r in rows])
        return rows, expires

    def _classify_miss(self, db, org, job_id, worker_id, now, expired_msg):
        """Why a fenced update (job id, worker and lease id must all match) touched no row."""
        row = db.execute("SELECT status, lease_expires_at, lease_id FROM jobs WHERE id=? AND organization_id=? "
                         "AND assigned_worker_id=?", (job_id, org, worker_id)).fetchone()
        if not row:
            return not_found("Job not found or not owned by worker")
        status, lease_at, _ = row
        if status == "processing":
            if lease_at is None or lease_at <= now:
                return lease_expired(expired_msg)
            return lease_expired("lease_id does not match the job's current lease; this worker no longer holds it")
        if status in ("pending", "scheduled"):
            return lease_expired(expired_msg)
        return conflict(f"Job is already {status}")

    _FENCE = ("WHERE id=? AND organization_id=? AND assigned_worker_id=? AND status='processing' "
              "AND lease_expires_at IS NOT NULL AND lease_expires_at>? AND lease_id=?")

    def complete(self, org: str, job_id: str, worker_id: str, lease_id: str, result: str | None) -> None:
        now = time.time()
        with self._tx() as db:
            done = db.execute("UPDATE jobs SET status='completed', result=?, completed_at=?, updated_at=? "
                              + self._FENCE + " RETURNING queue_name, started_at, completion_webhook, "
                              "completion_webhook_secret, workflow_id", (result, now, now, job_id, org, worker_id,
                                                                         now, lease_id)).fetchone()
            if done is None:
                raise self._classify_miss(db, org, job_id, worker_id, now, "Job lease expired before completion")
            db.execute("UPDATE workers SET jobs_processed=jobs_processed+1 WHERE id=? AND organization_id=?",
                       (worker_id, org))
            db.execute("UPDATE jobs SET dependencies_met=1, updated_at=? WHERE parent_job_id=? AND "
                       "dependencies_met=0", (now, job_id))
            dependencies.release(db, job_id, now)
            if done[4] is not None:
                dependencies.touch(db, [done[4]], now)
        if self.listeners:
            queue, started, hook, secret, _ = done
            self._emit([(org, "job.completed", {
                "job_id": job_id, "queue_name": queue, "result": result,
                "duration_ms": 0 if started is None else max(0, int((now - started) * 1000)),
                "completion_webhook": hook, "completion_webhook_secret": secret})])

    def fail(self, org: str, job_id: str, worker_id: str, lease_id: str, error: str) -> bool:
        """Retry with backoff min(2^n,60)s + 0-499 ms jitter, or dead-letter. Returns True if retried."""
        return self.fail_job(org, job_id, worker_id, lease_id, error)[0]

    def fail_job(self, org: str, job_id: str, worker_id: str, lease_id: str, error: str, retry: bool = True,
                 count_dead: bool = False) -> tuple[bool, float]:
        """`fail`, returning (will_retry, retry delay in s). `retry=False` dead-letters now (gRPC
        `Fail.retry: false`); `count_dead` also counts the attempt when dead-lettering (gRPC always does)."""
        now = time.time()
        with self._tx() as db:
            row = db.execute("SELECT retry_count, max_retries, payload, queue_name, completion_webhook, "
                             "completion_webhook_secret FROM jobs " + self._FENCE,
                             (job_id, org, worker_id, now, lease_id)).fetchone()
            if not row:
                raise self._classify_miss(db, org, job_id, worker_id, now,
                                          "Job lease expired before failure was reported")
            rc, mr, payload, queue, hook, secret = row
            facts: list = []
            will_retry, delay = retry and rc < mr, 0.0
            if will_retry:
                delay = min(2 ** min(rc, 6), 60) + random.randint(0, 499) / 1000.0
                db.execute("UPDATE jobs SET status='pending', retry_count=retry_count+1, last_error=?, "
                           "assigned_worker_id=NULL, lease_id=NULL, lease_expires_at=NULL, scheduled_at=?, "
                           "updated_at=? WHERE id=?", (error, now + delay, now, job_id))
            else:
                if count_dead:
                    db.execute("UPDATE jobs SET retry_count=retry_count+1 WHERE id=?", (job_id,))
                self._dead_letter(db, org, job_id, queue, payload, error, rc + int(count_dead), now, facts)
            db.execute("UPDATE workers SET jobs_failed=jobs_failed+1 WHERE id=? AND organization_id=?",
                       (worker_id, org))
        facts.insert(0, (org, "job.failed", {
            "job_id": job_id, "queue_name": queue, "error": error,
            "retry_count": rc + int(will_retry or count_dead), "new_status": "pending" if will_retry else "deadletter",
            "completion_webhook": hook, "completion_webhook_secret": secret}))
        self._emit(facts)
        return will_retry, delay

    def _dead_letter(self, db, org, job_id, queue, payload, error, retries, now, facts: list):
        """Dead-letter one job; what that changes besides the job itself (its dependents cancelled) is
        appended to `facts`."""
        db.execute("UPDATE jobs SET status='deadletter', last_error=?, assigned_worker_id=NULL, lease_id=NULL, "
                   "lease_expires_at=NULL, updated_at=? WHERE id=?", (error, now, job_id))
        self._ended(db, org, [job_id], now, facts)
        db.execute("INSERT INTO dead_letter_queue VALUES (?,?,?,?,?,?,?,?)",
                   (str(uuid.uuid4()), org, job_id, queue, error, payload,
                    dumps({"final_error": error, "total_retries": retries}), now))

    @staticmethod
    def _ended(db, org: str, job_ids: list[str], now: float, facts: list) -> None:
        """Jobs ended without completing: cancel the dependents that can no longer run, update workflows."""
        touched = dependencies.cascade(db, org, job_ids, now, facts)
        dependencies.touch(db, set(touched) | set(dependencies.workflows_of(db, job_ids)), now)

    def renew_lease(self, org: str, job_id: str, worker_id: str, lease_id: str, secs: int) -> None:
        now = time.time()
        with self._tx() as db:
            cur = db.execute("UPDATE jobs SET lease_expires_at=?, updated_at=? " + self._FENCE,
                             (now + secs, now, job_id, org, worker_id, now, lease_id))
            if cur.rowcount == 0:
                raise self._classify_miss(db, org, job_id, worker_id, now, "Job lease expired and cannot be extended")

    # ---- reads for the gRPC server ----
    def job_raw(self, org: str, job_id: str) -> dict:
        """One job's columns as stored (JSON text, epoch seconds); 404 if unknown."""
        rows = self._read(_JOB_SELECT + " WHERE id=? AND organization_id=?", (job_id, org))
        if not rows:
            raise not_found("Job not found")
        return dict(zip(JOB_COLS, rows[0], strict=True))

    def job_status(self, org: str, job_id: str) -> tuple[str, str] | None:
        """A job's (status, queue name), or None when `org` has no such job."""
        rows = self._read("SELECT status, queue_name FROM jobs WHERE id=? AND organization_id=?", (job_id, org))
        return (rows[0][0], rows[0][1]) if rows else None

    def queue_counts(self, org: str, queue: str) -> dict[str, int]:
        """A queue's jobs by status, as the real server's queue stream counts them: `pending` with the scheduled
        ones, `failed` with the dead-lettered ones, `completed` of all time."""
        out = {"pending": 0, "processing": 0, "completed": 0, "failed": 0}
        into = {"pending": "pending", "scheduled": "pending", "processing": "processing", "completed": "completed",
                "failed": "failed", "deadletter": "failed"}
        for status, n in self._read("SELECT status, COUNT(*) FROM jobs WHERE organization_id=? AND queue_name=? "
                                    "GROUP BY status", (org, queue)):
            if status in into:
                out[into[status]] += n
        return out

    def lease_state(self, org: str, job_id: str) -> tuple[str, str | None, float | None] | None:
        """(status, lease_id, lease_expires_at) of a job, or None if unknown."""
        rows = self._read("SELECT status, lease_id, lease_expires_at FROM jobs WHERE id=? AND organization_id=?",
                          (job_id, org))
        return tuple(rows[0]) if rows else None

    def grpc_queue_stats(self, org: str, queue: str) -> dict:
        """Counts by status for one queue, `total`, and the age of its oldest pending job in ms."""
        out = dict.fromkeys(("pending", "scheduled", "processing", "completed", "failed", "deadletter"), 0)
        total = 0
        for status, n in self._read("SELECT status, count(*) FROM jobs WHERE organization_id=? AND queue_name=? "
                                    "GROUP BY status", (org, queue)):
            total += n
            if status in out:
                out[status] = n
        rows = self._read("SELECT min(created_at) FROM jobs WHERE organization_id=? AND queue_name=? AND "
                          "status='pending'", (org, queue))
        oldest = rows[0][0] if rows else None
        out["total"] = total
        out["max_age_ms"] = int((time.time() - oldest) * 1000) if oldest else 0
        return out

    def heartbeat_sticky(self, org: str, wid: str, current_jobs: int, status: str,
                         metadata: str | None) -> tuple[bool, bool]:
        """gRPC Heartbeat: (acknowledged, should_drain). An unknown worker is not an error; once
        `draining`, a worker stays draining (and is told to drain) whatever status it reports."""
        now = time.time()
        with self._tx() as db:
            row = db.execute("SELECT status FROM workers WHERE id=? AND organization_id=?", (wid, org)).fetchone()
            if not row:
                return False, False
            new = "draining" if row[0] == "draining" else status
            db.execute("UPDATE workers SET last_heartbeat=?, current_jobs=?, status=?, metadata=COALESCE(?, metadata), "
                       "updated_at=? WHERE id=?", (now, current_jobs, new, metadata, now, wid))
            return True, new == "draining"

    # ---- job reads and admin ----
    def get_job(self, org: str, job_id: str) -> dict:
        rows = self._read(_JOB_SELECT + " WHERE id=? AND organization_id=?", (job_id, org))
        if not rows:
            raise not_found("Job not found")
        return job_dict(rows[0])

    def list_jobs(self, org: str, queue: str | None, statuses: list[str] | None, tag: str | None, limit: int,
                  offset: int, order_desc: bool = True,
                  scope: frozenset[str] | None = None) -> tuple[list[dict], bool]:
        """One page of jobs; with `scope` (a queue-scoped key's queues) only jobs of those queues."""
        sql = _SUMMARY_SELECT + " WHERE organization_id=?"
        args: list[str | int] = [org]
        if queue:
            sql += " AND queue_name=?"
            args.append(queue)
        if scope is not None:
            sql += f" AND queue_name IN ({','.join('?' * len(scope))})"
            args += sorted(scope)
        if statuses:
            sql += f" AND status IN ({','.join('?' * len(statuses))})"
            args += statuses
        if tag:
            sql += (" AND tags IS NOT NULL AND json_valid(tags) AND EXISTS (SELECT 1 FROM json_each(jobs.tags) "
                    "WHERE json_each.value=? OR json_each.key=?)")
            args += [tag, tag]
        sql += f" ORDER BY created_at {'DESC' if order_desc else 'ASC'} LIMIT ? OFFSET ?"
        args += [limit + 1, offset]
        rows = self._read(sql, args)
        return [summary_dict(r) for r in rows[:limit]], len(rows) > limit

    def status_by_ids(self, org: str, ids: list[str]) -> list[dict]:
        if not ids:
            return []
        rows = self._read("SELECT id, status, queue_name, retry_count, created_at, completed_at FROM jobs WHERE "
                          f"organization_id=? AND id IN ({','.join('?' * len(ids))})", [org, *ids])
        return [{"id": r[0], "status": r[1], "queue_name": r[2], "retry_count": r[3], "created_at": ts(r[4]),
                 "completed_at": ts(r[5])} for r in rows]

    def cancel(self, org: str, job_id: str) -> None:
        now = time.time()
        with self._tx() as db:
            row = db.execute("SELECT status FROM jobs WHERE id=? AND organization_id=?", (job_id, org)).fetchone()
            if not row:
                raise not_found("Job not found")
            if row[0] not in ("pending", "scheduled"):
                raise conflict("Job cannot be cancelled (not in pending or scheduled state)")
            (queue,) = db.execute("UPDATE jobs SET status='cancelled', completed_at=?, updated_at=? WHERE id=? "
                                  "RETURNING queue_name", (now, now, job_id)).fetchone()
            facts: list = [(org, "job.cancelled", {"job_id": job_id, "queue_name": queue, "old_status": row[0]})]
            self._ended(db, org, [job_id], now, facts)
        self._emit(facts)

    def _revive(self, db, job_ids: list[str], now: float) -> None:
        for jid in job_ids:
            db.execute("UPDATE jobs SET status='pending', retry_count=0, last_error=NULL, assigned_worker_id=NULL, "
                       "lease_id=NULL, lease_expires_at=NULL, completed_at=NULL, scheduled_at=NULL, updated_at=? "
                       "WHERE id=?", (now, jid))
            db.execute("DELETE FROM dead_letter_queue WHERE job_id=?", (jid,))
        dependencies.touch(db, dependencies.workflows_of(db, job_ids), now)

    def retry_job(self, org: str, job_id: str) -> dict:
        now = time.time()
        with self._tx() as db:
            row = db.execute("SELECT status FROM jobs WHERE id=? AND organization_id=?", (job_id, org)).fetchone()
            if not row:
                raise not_found("Job not found")
            if row[0] not in ("failed", "deadletter"):
                raise conflict(f"Job cannot be retried (status is {row[0]}; only failed or deadletter jobs can be)")
            self._revive(db, [job_id], now)
            job = job_dict(db.execute(_JOB_SELECT + " WHERE id=?", (job_id,)).fetchone())
        self._emit([(org, "job.retried", {"job_id": job_id, "queue_name": job["queue_name"], "old_status": row[0]})])
        return job

    def dlq_retry(self, org: str, queue: str | None, job_ids: list[str] | None, limit: int) -> dict:
        now = time.time()
        sql = "SELECT id, queue_name FROM jobs WHERE organization_id=? AND status='deadletter'"
        args: list[str | int] = [org]
        if queue:
            sql += " AND queue_name=?"
            args.append(queue)
        if job_ids is not None:
            sql += f" AND id IN ({','.join('?' * len(job_ids))})" if job_ids else " AND 0"
            args += job_ids
        sql += " ORDER BY created_at LIMIT ?"
        args.append(limit)
        with self._tx() as db:
            rows = db.execute(sql, args).fetchall()
            ids = [r[0] for r in rows]
            self._revive(db, ids, now)
        self._emit([(org, "job.retried", {"job_id": jid, "queue_name": q, "old_status": "deadletter"})
                    for jid, q in rows])
        return {"retried_count": len(ids), "retried_jobs": ids, "skipped_jobs": [], "job_ids": ids}

    def dlq_purge(self, org: str, queue: str | None, older_than: float | None, limit: int) -> int:
        sql = "SELECT id FROM jobs WHERE organization_id=? AND status='deadletter'"
        args: list[str | float] = [org]
        if queue:
            sql += " AND queue_name=?"
            args.append(queue)
        if older_than is not None:
            sql += " AND updated_at < ?"
            args.append(older_than)
        sql += " LIMIT ?"
        args.append(limit)
        with self._tx() as db:
            ids = [r[0] for r in db.execute(sql, args).fetchall()]
            for jid in ids:
                db.execute("DELETE FROM dead_letter_queue WHERE job_id=?", (jid,))
                db.execute("DELETE FROM jobs WHERE id=?", (jid,))
        return len(ids)

    def stats(self, org: str, scope: frozenset[str] | None = None) -> dict:
        """Jobs per status; with `scope` (a queue-scoped key's queues) only jobs of those queues."""
        out = dict.fromkeys(("pending", "scheduled", "processing", "completed", "failed", "deadletter",
                             "cancelled"), 0)
        sql, args = "SELECT status, count(*) FROM jobs WHERE organization_id=?", [org]
        if scope is not None:
            sql += f" AND queue_name IN ({','.join('?' * len(scope))})"
            args += sorted(scope)
        for status, n in self._read(sql + " GROUP BY status", args):
            out[status] = n
        out["total"] = sum(out.values())
        return out

    # ---- queues ----
    def list_queues(self, org: str) -> list[dict]:
        """`GET /queues` as the real server answers it: configured queues plus the "implicit" ones that only
        have jobs (reported with the default config), sorted by name, at most 100 (as the real server since 0.1.114)."""
        rows = self._read("SELECT queue_name, max_retries, default_timeout, rate_limit, enabled FROM queue_config "
                          "WHERE organization_id=? ORDER BY queue_name LIMIT 100", (org,))
        out = {r[0]: {"queue_name": r[0], "max_retries": DEFAULT_MAX_RETRIES if r[1] is None else r[1],
                      "default_timeout": DEFAULT_TIMEOUT if r[2] is None else r[2], "rate_limit": r[3],
                      "enabled": bool(r[4])} for r in rows}
        for (name,) in self._read("SELECT DISTINCT queue_name FROM jobs WHERE organization_id=? AND queue_name NOT IN "
                                  "(SELECT queue_name FROM queue_config WHERE organization_id=?) ORDER BY queue_name "
                                  "LIMIT 100", (org, org)):
            out.setdefault(name, {"queue_name": name, "max_retries": DEFAULT_MAX_RETRIES,
                                  "default_timeout": DEFAULT_TIMEOUT, "rate_limit": None, "enabled": True})
        return [out[name] for name in sorted(out)][:100]

    def queue_stats(self, org: str, queue: str) -> dict:
        """`GET /queues/{name}/stats` as the real server computes it; an unknown queue gives zeros, not 404.

        pending counts `pending` only (a retry waiting out its back-off is `pending`); failed_jobs_24h counts
        status `failed`, which no worker path sets (dead-lettered jobs are not in it); the average processing
        time is over every completed job; max_job_age_seconds is the oldest pending/scheduled job's age, or null.
        """
        now = time.time()
        ((pending, processing, completed, failed, avg_ms, oldest),) = self._read(
            "SELECT coalesce(sum(status='pending'), 0), coalesce(sum(status='processing'), 0), "
            "coalesce(sum(status='completed' AND completed_at>?), 0), "
            "coalesce(sum(status='failed' AND completed_at>?), 0), "
            "avg(CASE WHEN status='completed' AND completed_at IS NOT NULL AND started_at IS NOT NULL "
            "THEN (completed_at-started_at)*1000.0 END), "
            "min(CASE WHEN status IN ('pending','scheduled') THEN created_at END) "
            "FROM jobs WHERE organization_id=? AND queue_name=?", (now - 86400, now - 86400, org, queue))
        ((workers,),) = self._read(
            "SELECT count(*) FROM workers WHERE organization_id=? AND status='healthy' AND (queue_name=? OR EXISTS "
            "(SELECT 1 FROM json_each(CASE WHEN json_valid(queue_names) THEN queue_names ELSE '[]' END) "
            "WHERE value=?))", (org, queue, queue))
        return {"queue_name": queue, "pending_jobs": pending, "processing_jobs": processing,
                "completed_jobs_24h": completed, "failed_jobs_24h": failed, "avg_processing_time_ms": avg_ms,
                "max_job_age_seconds": None if oldest is None else int(math.floor(now - oldest + 0.5)),
                "active_workers": workers}

    def _config_dict(self, db, org, queue) -> dict:
        r = db.execute("SELECT id, max_retries, default_timeout, rate_limit, enabled, settings, created_at, "
                       "updated_at FROM queue_config WHERE organization_id=? AND queue_name=?", (org, queue)).fetchone()
        return {"id": r[0], "organization_id": org, "queue_name": queue,
                "max_retries": DEFAULT_MAX_RETRIES if r[1] is None else r[1],
                "default_timeout": DEFAULT_TIMEOUT if r[2] is None else r[2], "rate_limit": r[3],
                "enabled": bool(r[4]), "settings": _frag(_shown_settings(r[5] or "{}")), "created_at": ts(r[6]),
                "updated_at": ts(r[7])}

    def _ensure_config(self, db, org, queue, now):
        db.execute("INSERT OR IGNORE INTO queue_config (organization_id, queue_name, id, enabled, settings, "
                   "created_at, updated_at) VALUES (?,?,?,1,'{}',?,?)", (org, queue, str(uuid.uuid4()), now, now))

    def pause_queue(self, org: str, queue: str, reason: str | None) -> dict:
        now = time.time()
        with self._tx() as db:
            known = (db.execute("SELECT 1 FROM queue_config WHERE organization_id=? AND queue_name=?",
                                (org, queue)).fetchone()
                     or db.execute("SELECT 1 FROM jobs WHERE organization_id=? AND queue_name=? LIMIT 1",
                                   (org, queue)).fetchone())
            if not known:
                raise not_found("Queue not found")
            self._ensure_config(db, org, queue, now)
            (settings,) = db.execute("SELECT settings FROM queue_config WHERE organization_id=? AND queue_name=?",
                                     (org, queue)).fetchone()
            s = _settings_object(settings)
            s.update({"paused": True, "paused_at": ts(now), "paused_at_epoch": now, "paused_reason": reason})
            db.execute("UPDATE queue_config SET enabled=0, settings=?, updated_at=? WHERE organization_id=? AND "
                       "queue_name=?", (dumps(s), now, org, queue))
        self._emit([(org, "queue.paused", {"queue_name": queue, "reason": reason})])
        return {"queue_name": queue, "paused": True, "paused_at": ts(now), "reason": reason}

    def resume_queue(self, org: str, queue: str) -> dict:
        now = time.time()
        with self._tx() as db:
            row = db.execute("SELECT settings FROM queue_config WHERE organization_id=? AND queue_name=?",
                             (org, queue)).fetchone()
            if not row:
                raise not_found("Queue not found")
            s = _settings_object(row[0])
            since = s.get("paused_at_epoch")
            if not isinstance(since, (int, float)) or isinstance(since, bool):
                since = None
            s.update({"paused": False})
            for k in ("paused_at", "paused_at_epoch", "paused_reason"):
                s.pop(k, None)
            db.execute("UPDATE queue_config SET enabled=1, settings=?, updated_at=? WHERE organization_id=? AND "
                       "queue_name=?", (dumps(s), now, org, queue))
        self._emit([(org, "queue.resumed", {"queue_name": queue})])
        return {"queue_name": queue, "resumed": True, "paused_duration_secs": int(now - since) if since else 0}

    def delete_queue(self, org: str, queue: str, delete_jobs: bool) -> None:
        """Remove the queue's config (and, with `delete_jobs`, every job in it, dead-lettered ones included).
        Raises 409 when jobs are pending or processing and are to be kept, 404 when nothing was removed."""
        with self._tx() as db:
            removed = 0
            if delete_jobs:
                db.execute("DELETE FROM dead_letter_queue WHERE organization_id=? AND queue_name=?", (org, queue))
                removed += db.execute("DELETE FROM jobs WHERE organization_id=? AND queue_name=?",
                                      (org, queue)).rowcount
            else:
                ((busy,),) = db.execute("SELECT count(*) FROM jobs WHERE organization_id=? AND queue_name=? AND "
                                        "status IN ('pending','processing')", (org, queue)).fetchall()
                if busy:
                    raise conflict(f"Cannot delete queue {queue} with {busy} pending/processing jobs")
            removed += db.execute("DELETE FROM queue_config WHERE organization_id=? AND queue_name=?",
                                  (org, queue)).rowcount
            if not removed:
                raise not_found("Queue not found")

    def get_queue(self, org: str, queue: str) -> dict:
        """The queue's config; for a queue with jobs but no config row, the defaults `list_queues` shows for it
        (an id derived from the name, the times of its oldest job); else 404."""
        with self._lock:
            if self._db.execute("SELECT 1 FROM queue_config WHERE organization_id=? AND queue_name=?",
                                (org, queue)).fetchone():
                return self._config_dict(self._db, org, queue)
            (oldest,) = self._db.execute("SELECT min(created_at) FROM jobs WHERE organization_id=? AND queue_name=?",
                                         (org, queue)).fetchone()
        if oldest is None:
            raise not_found("Queue not found")
        return {"id": str(uuid.uuid5(uuid.NAMESPACE_URL, f"spooled-queue:{org}:{queue}")), "organization_id": org,
                "queue_name": queue, "max_retries": DEFAULT_MAX_RETRIES, "default_timeout": DEFAULT_TIMEOUT,
                "rate_limit": None, "enabled": True, "settings": {}, "created_at": ts(oldest), "updated_at": ts(oldest)}

    def get_queue_config(self, org: str, queue: str) -> dict:
        with self._lock:
            if not self._db.execute("SELECT 1 FROM queue_config WHERE organization_id=? AND queue_name=?",
                                    (org, queue)).fetchone():
                raise not_found("Queue not found")
            return self._config_dict(self._db, org, queue)

    def put_queue_config(self, org: str, queue: str, fields: dict) -> dict:
        """Upsert; omitted fields keep their values."""
        now = time.time()
        with self._tx() as db:
            self._ensure_config(db, org, queue, now)
            for col, val in fields.items():
                db.execute(f"UPDATE queue_config SET {col}=?, updated_at=? WHERE organization_id=? AND queue_name=?",
                           (val, now, org, queue))
            return self._config_dict(db, org, queue)

    # ---- background recovery (called by sweeps) ----
    def sweep_expired_leases(self) -> int:
        """Expired processing leases -> pending with retry_count+1 (no backoff), or dead-letter.

        Also activates due scheduled jobs (status scheduled -> pending), as the real scheduler does.
        """
        now = time.time()
        with self._tx() as db:
            db.execute("UPDATE jobs SET status='pending', updated_at=? WHERE status='scheduled' AND scheduled_at<=?",
                       (now, now))
            rows = db.execute("SELECT id, organization_id, queue_name, retry_count, max_retries, payload FROM jobs "
                              "WHERE status='processing' AND lease_expires_at<=?", (now,)).fetchall()
            facts = self._recover(db, rows, now, "Lease expired (worker timeout)",
                                  "Max retries exceeded after lease expiration")
        self._emit(facts)
        return len(rows)

    def _recover(self, db, rows, now, retry_msg, dead_msg) -> list:
        """Processing jobs whose holder is gone back to pending (or dead-lettered); the facts to emit."""
        facts: list = []
        for jid, org, queue, rc, mr, payload in rows:
            if rc < mr:
                db.execute("UPDATE jobs SET status='pending', retry_count=retry_count+1, last_error=?, "
                           "assigned_worker_id=NULL, lease_id=NULL, lease_expires_at=NULL, updated_at=? WHERE id=?",
                           (retry_msg, now, jid))
                facts.append((org, "job.released", {"job_id": jid, "queue_name": queue, "new_status": "pending"}))
            else:
                facts.append((org, "job.released", {"job_id": jid, "queue_name": queue, "new_status": "deadletter"}))
                self._dead_letter(db, org, jid, queue, payload, dead_msg, rc, now, facts)
        return facts

    def reap_stale_workers(self, offline_after: float) -> tuple[int, int]:
        """Workers silent for `offline_after` s go offline; processing jobs of offline workers are recovered."""
        now = time.time()
        with self._tx() as db:
            n = db.execute("UPDATE workers SET status='offline', updated_at=? WHERE status IN ('healthy','degraded') "
                           "AND last_heartbeat<?", (now, now - offline_after)).rowcount
            rows = db.execute("SELECT j.id, j.organization_id, j.queue_name, j.retry_count, j.max_retries, j.payload "
                              "FROM jobs j JOIN workers w ON w.id=j.assigned_worker_id AND "
                              "w.organization_id=j.organization_id WHERE j.status='processing' AND "
                              "w.status='offline'").fetchall()
            facts = self._recover(db, rows, now, "Worker went offline",
                                  "Max retries exceeded after worker went offline")
        self._emit(facts)
        return n, len(rows)

    # ---- dev tools: lose a lease on demand (POST /_dev/leases/{id}/expire | steal) ----
    def expire_lease(self, org: str, job_id: str) -> None:
        """Make a processing job's lease expire now: the next sweep hands the job out again (until then the
        holder's renewal or report meets 409 LEASE_EXPIRED, after it 404)."""
        now = time.time()
        with self._tx() as db:
            cur = db.execute("UPDATE jobs SET lease_expires_at=?, updated_at=? WHERE id=? AND organization_id=? "
                             "AND status='processing'", (now, now, job_id, org))
            if cur.rowcount == 0:
                raise self._not_processing(db, org, job_id)

    def steal_lease(self, org: str, job_id: str, worker_id: str, secs: int) -> dict:
        """Re-issue a processing job to `worker_id` under a new lease, as a claim by that worker would: the
        old holder's renewal or report meets 404 (another worker's job now) or 409 (its lease id is stale)."""
        now = time.time()
        lease_id = f"{uuid.uuid4()}-{job_id}"
        with self._tx() as db:
            cur = db.execute("UPDATE jobs SET assigned_worker_id=?, lease_id=?, lease_expires_at=?, updated_at=? "
                             "WHERE id=? AND organization_id=? AND status='processing'",
                             (worker_id, lease_id, now + secs, now, job_id, org))
            if cur.rowcount == 0:
                raise self._not_processing(db, org, job_id)
        return {"id": job_id, "worker_id": worker_id, "lease_id": lease_id, "lease_expires_at": ts(now + secs)}

    @staticmethod
    def _not_processing(db, org: str, job_id: str) -> HttpError:
        row = db.execute("SELECT status FROM jobs WHERE id=? AND organization_id=?", (job_id, org)).fetchone()
        return not_found("Job not found") if row is None else conflict(f"Job is {row[0]}, not processing")
