"""Workflows (a DAG of jobs) and job dependencies, as the real server answers them.

Routes:
  POST /api/v1/workflows                 {name, description?, jobs: [{key, queue_name, payload, depends_on?,
                                          dependency_mode?, priority?, max_retries?, timeout_seconds?,
                                          expires_at?}], metadata?} -> 200 {workflow_id, job_ids, status}
  GET  /api/v1/workflows[?status&limit&offset]  -> [WorkflowResponse], newest first
  GET  /api/v1/workflows/{id}            -> the detail: the workflow, its jobs, its edges and progress
  POST /api/v1/workflows/{id}/cancel     -> pending and scheduled jobs cancelled; WorkflowResponse
  POST /api/v1/workflows/{id}/retry      -> a failed workflow's failed, dead-lettered and cancelled jobs
                                            pending again; 400 for any other status
  GET  /api/v1/jobs/{id}/dependencies    -> {job_id, dependencies, dependents, dependencies_met}
  POST /api/v1/jobs/{id}/dependencies    {depends_on: [ids], dependency_mode?} -> {dependencies_added,
                                          dependencies_met}; a self edge or one that would close a cycle is
                                          skipped, and a job of any status takes them, as on the real
                                          server (a processing job keeps its lease; retried, it waits)

Bad input as the real server answers it: a missing or mistyped field 422; a rule broken (lengths, the
characters of a key, name or queue, 1-100 jobs, ranges) 400 VALIDATION_ERROR with `details`; a
dependency on a key the workflow does not have, a cycle, or a key used twice 400 BAD_REQUEST; an unknown
workflow 404 "Workflow not found", an unknown job 404 "Job {id} not found".
Dependency rules (release, the failure cascade, workflow status) are in dependencies.py.
"""

from __future__ import annotations

import time
import uuid

from . import dependencies
from .errors import HttpError, invalid_type, not_found, validation
from .handlers import I64, SIXTY_FOUR_K, _json_text, body, query_int
from .keys_store import require_job, require_queue, scope
from .store import _JOB_SELECT, JOB_COLS, _frag, ts
from .validate import Body, check_queue_name

MAX_JOBS = 100
STATUSES = ("pending", "running", "completed", "failed", "cancelled")
_NAME_EXTRA = set(" -_.:()")


def bad_request(message: str) -> HttpError:
    return HttpError(400, "BAD_REQUEST", message)


# ---------- validation ----------
def _mode(b: Body, field: str) -> str:
    raw = b.str("dependency_mode", False, 0, 10, default="all")
    if raw not in ("all", "any"):
        raise HttpError(422, "VALIDATION_ERROR", f"{field}: unknown variant `{raw}`, expected `all` or `any`",
                        details=[{"field": field, "message": "expected `all` or `any`", "code": "invalid_type"}],
                        extra={"error": "Validation failed"})
    return raw


def _job_def(app, raw, i: int) -> dict:
    where = f"jobs[{i}]"
    if not isinstance(raw, dict):
        raise invalid_type(where, "a job definition object")
    b = Body(raw)
    key = b.str("key", True, 0, 10**6)
    if not 1 <= len(key) <= 100:
        raise validation(f"{where}.key", "length must be between 1 and 100", "length")
    if not all(c.isalnum() or c in "-_" for c in key):
        raise validation(f"{where}.key", "Job key can only contain alphanumeric characters, dashes, and underscores",
                         "invalid_job_key")
    queue = check_queue_name(b.str("queue_name", True, 0, 10**6), f"{where}.queue_name")
    _, payload = b.any("payload", required=True)
    deps = b.list("depends_on", False, 10**6) or []
    if not all(isinstance(d, str) for d in deps):
        raise invalid_type(f"{where}.depends_on", "an array of strings")
    return {"key": key, "queue_name": queue, "depends_on": deps,
            "dependency_mode": _mode(b, f"{where}.dependency_mode"),
            "payload": _json_text(f"{where}.payload", payload, app.cfg.max_payload_bytes),
            "priority": b.int("priority", False, -100, 100, default=0),
            "max_retries": b.int("max_retries", False, 0, 100),
            "timeout_seconds": b.int("timeout_seconds", False, 1, 86400),
            "expires_at": b.time("expires_at")}


def _has_cycle(defs: list[dict]) -> bool:
    graph = {d["key"]: d["depends_on"] for d in defs}
    state: dict[str, int] = {}  # 1 visiting, 2 done
    for start in graph:
        if state.get(start):
            continue
        stack = [(start, iter(graph[start]))]
        state[start] = 1
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                state[node] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return True
            elif not state.get(nxt):
                state[nxt] = 1
                stack.append((nxt, iter(graph.get(nxt, ()))))
    return False


def parse_workflow(app, req) -> dict:
    b = body(req)
    name = b.str("name", True, 0, 10**6)
    if not 1 <= len(name) <= 255:
        raise validation("name", "length must be between 1 and 255", "length")
    if not all(c.isalnum() or c in _NAME_EXTRA for c in name):
        raise validation("name", "Workflow name contains invalid characters", "invalid_workflow_name")
    description = b.str("description", False, 0, 1000)
    jobs = b.list("jobs", True, 10**6)
    if not 1 <= len(jobs) <= MAX_JOBS:
        raise validation("jobs", "Workflow must have 1-100 jobs", "length")
    present, metadata = b.any("metadata")
    defs = [_job_def(app, raw, i) for i, raw in enumerate(jobs)]
    keys = {d["key"] for d in defs}
    for d in defs:
        for dep in d["depends_on"]:
            if dep not in keys:
                raise bad_request(f"Job '{d['key']}' depends on unknown job '{dep}'")
    if _has_cycle(defs):
        raise bad_request("Circular dependency detected in workflow")
    if len(keys) != len(defs):
        raise bad_request("Workflow job keys must be unique")
    return {"name": name, "description": description, "jobs": defs,
            "metadata": _json_text("metadata", metadata, SIXTY_FOUR_K) if present and metadata is not None else None}


# ---------- store transactions ----------
_WF_COLS = ("id", "name", "description", "status", "total_jobs", "completed_jobs", "failed_jobs", "created_at",
            "started_at", "completed_at", "metadata")
_WF_SELECT = "SELECT " + ", ".join(_WF_COLS) + " FROM workflows"


def workflow_dict(row) -> dict:
    w = dict(zip(_WF_COLS, row, strict=True))
    total = w["total_jobs"]
    return {"id": w["id"], "name": w["name"], "description": w["description"], "status": w["status"],
            "total_jobs": total, "completed_jobs": w["completed_jobs"], "failed_jobs": w["failed_jobs"],
            "progress_percent": (w["completed_jobs"] / total * 100.0) if total else 0.0,
            "created_at": ts(w["created_at"]), "started_at": ts(w["started_at"]),
            "completed_at": ts(w["completed_at"]), "metadata": _frag(w["metadata"])}


def _workflow(db, org: str, wid: str):
    row = db.execute(_WF_SELECT + " WHERE id=? AND organization_id=?", (wid, org)).fetchone()
    if row is None:
        raise not_found("Workflow not found")
    return row


def create(store, org: str, wf: dict) -> dict:
    now = time.time()
    wid = str(uuid.uuid4())
    facts: list = []
    ids = {d["key"]: str(uuid.uuid4()) for d in wf["jobs"]}
    with store._tx() as db:
        db.execute("INSERT INTO workflows (id, organization_id, name, description, status, total_jobs, created_at, "
                   "metadata) VALUES (?,?,?,?,'pending',?,?,?)",
                   (wid, org, wf["name"], wf["description"], len(wf["jobs"]), now, wf["metadata"]))
        for d in wf["jobs"]:
            max_retries, timeout = store._queue_defaults(db, org, d["queue_name"])
            jid = ids[d["key"]]
            db.execute("INSERT INTO jobs (id, organization_id, queue_name, status, payload, retry_count, max_retries, "
                       "created_at, expires_at, priority, timeout_seconds, updated_at, workflow_id, dependency_mode, "
                       "dependencies_met) VALUES (?,?,?,'pending',?,0,?,?,?,?,?,?,?,?,?)",
                       (jid, org, d["queue_name"], d["payload"],
                        max_retries if d["max_retries"] is None else d["max_retries"], now, d["expires_at"],
                        d["priority"], timeout if d["timeout_seconds"] is None else d["timeout_seconds"], now, wid,
                        d["dependency_mode"], 0 if d["depends_on"] else 1))
            for dep in d["depends_on"]:
                dependencies.add_edge(db, jid, ids[dep], d["dependency_mode"], now)
            facts.append((org, "job.created", {"job_id": jid, "queue_name": d["queue_name"], "priority": d["priority"],
                                               "status": "pending", "workflow_id": wid}))
    store._emit(facts)
    return {"workflow_id": wid, "job_ids": [{"key": d["key"], "job_id": ids[d["key"]]} for d in wf["jobs"]],
            "status": "pending"}


def list_workflows(store, org: str, status: str | None, limit: int, offset: int) -> list[dict]:
    sql, args = _WF_SELECT + " WHERE organization_id=?", [org]
    if status:
        sql += " AND status=?"
        args.append(status)
    rows = store._read(sql + " ORDER BY created_at DESC, rowid DESC LIMIT ? OFFSET ?", [*args, limit, offset])
    return [workflow_dict(r) for r in rows]


def _job_entry(job: dict) -> dict:
    error = None if job["last_error"] is None else {"type": "JobError", "message": job["last_error"], "stack": None}
    return {"id": job["id"], "organization_id": job["organization_id"], "queue": job["queue_name"], "job_type": "job",
            "payload": _frag(job["payload"]), "status": job["status"], "priority": job["priority"],
            "attempt": job["retry_count"], "max_retries": job["max_retries"], "backoff_type": "exponential",
            "timeout_ms": job["timeout_seconds"] * 1000, "created_at": ts(job["created_at"]),
            "scheduled_at": ts(job["scheduled_at"]), "started_at": ts(job["started_at"]),
            "completed_at": ts(job["completed_at"]), "failed_at": None, "next_retry_at": None,
            "result": _frag(job["result"]), "error": error, "metadata": _frag(job["tags"]),
            "workflow_id": job["workflow_id"], "parent_job_id": job["parent_job_id"]}


def detail(store, org: str, wid: str) -> dict:
    with store._lock:
        db = store._db
        w = workflow_dict(_workflow(db, org, wid))
        jobs = [dict(zip(JOB_COLS, r, strict=True)) for r in
                db.execute(_JOB_SELECT + " WHERE workflow_id=? AND organization_id=? ORDER BY created_at, rowid",
                           (wid, org))]
        edges = db.execute("SELECT d.depends_on_job_id, d.job_id, d.dependency_type FROM job_dependencies d "
                           "JOIN jobs j ON j.id = d.job_id WHERE j.workflow_id=? AND j.organization_id=? "
                           "ORDER BY j.rowid", (wid, org)).fetchall()
    count = {"pending": 0, "processing": 0, "completed": 0, "failed": 0}
    for j in jobs:
        s = j["status"]
        key = ("failed" if s in ("failed", "deadletter", "cancelled") else s if s in count else "pending")
        count[key] += 1
    return {"id": w["id"], "organization_id": org, "name": w["name"], "description": w["description"],
            "status": w["status"], "jobs": [_job_entry(j) for j in jobs],
            "dependencies": [{"parent_job_id": p, "child_job_id": c, "dependency_type": t} for p, c, t in edges],
            "progress": {"total": w["total_jobs"], "completed": count["completed"], "failed": count["failed"],
                         "pending": count["pending"], "processing": count["processing"]},
            "created_at": w["created_at"], "started_at": w["started_at"], "completed_at": w["completed_at"],
            "metadata": w["metadata"]}


def cancel(store, org: str, wid: str) -> dict:
    now = time.time()
    with store._tx() as db:
        _workflow(db, org, wid)
        db.execute("UPDATE workflows SET status='cancelled', completed_at=? WHERE id=?", (now, wid))
        rows = db.execute("SELECT id, queue_name, status FROM jobs WHERE workflow_id=? AND organization_id=? AND "
                          "status IN ('pending','scheduled')", (wid, org)).fetchall()
        db.execute("UPDATE jobs SET status='cancelled', completed_at=?, updated_at=? WHERE workflow_id=? AND "
                   "organization_id=? AND status IN ('pending','scheduled')", (now, now, wid, org))
        out = workflow_dict(_workflow(db, org, wid))
    store._emit([(org, "job.cancelled", {"job_id": jid, "queue_name": q, "old_status": s}) for jid, q, s in rows])
    return out


def retry(store, org: str, wid: str) -> dict:
    now = time.time()
    with store._tx() as db:
        row = _workflow(db, org, wid)
        if row[3] != "failed":
            raise bad_request(f"Cannot retry workflow with status '{row[3]}'. Only failed workflows can be retried.")
        rows = db.execute("SELECT id, queue_name, status FROM jobs WHERE workflow_id=? AND organization_id=? AND "
                          "status IN ('failed','deadletter','cancelled')", (wid, org)).fetchall()
        for jid, _, _ in rows:
            db.execute("UPDATE jobs SET status='pending', retry_count=0, last_error=NULL, started_at=NULL, "
                       "completed_at=NULL, scheduled_at=NULL, assigned_worker_id=NULL, lease_id=NULL, "
                       "lease_expires_at=NULL, updated_at=? WHERE id=?", (now, jid))
            db.execute("DELETE FROM dead_letter_queue WHERE job_id=?", (jid,))
        for jid, _, _ in rows:
            dependencies.recompute(db, jid, now)
        db.execute("UPDATE workflows SET status='running', completed_at=NULL WHERE id=?", (wid,))
        dependencies.touch(db, [wid], now)
        out = workflow_dict(_workflow(db, org, wid))
    store._emit([(org, "job.retried", {"job_id": jid, "queue_name": q, "old_status": s}) for jid, q, s in rows])
    return out


def _deps_of(db, sql: str, job_id: str, org: str) -> list[dict]:
    return [{"job_id": r[0], "queue_name": r[1], "status": r[2]} for r in db.execute(sql, (job_id, org))]


def job_dependencies(store, org: str, job_id: str) -> dict:
    with store._lock:
        db = store._db
        row = db.execute("SELECT coalesce(dependencies_met, 1) FROM jobs WHERE id=? AND organization_id=?",
                         (job_id, org)).fetchone()
        if row is None:
            raise not_found(f"Job {job_id} not found")
        deps = _deps_of(db, "SELECT j.id, j.queue_name, j.status FROM job_dependencies d JOIN jobs j ON "
                        "j.id = d.depends_on_job_id WHERE d.job_id=? AND j.organization_id=?", job_id, org)
        dependents = _deps_of(db, "SELECT j.id, j.queue_name, j.status FROM job_dependencies d JOIN jobs j ON "
                              "j.id = d.job_id WHERE d.depends_on_job_id=? AND j.organization_id=?", job_id, org)
    return {"job_id": job_id, "dependencies": deps, "dependents": dependents, "dependencies_met": bool(row[0])}


def add_dependencies(store, org: str, job_id: str, depends_on: list[str], mode: str) -> dict:
    now = time.time()
    facts: list = []
    with store._tx() as db:
        if not db.execute("SELECT 1 FROM jobs WHERE id=? AND organization_id=?", (job_id, org)).fetchone():
            raise not_found(f"Job {job_id} not found")
        for dep in depends_on:
            if not db.execute("SELECT 1 FROM jobs WHERE id=? AND organization_id=?", (dep, org)).fetchone():
                raise not_found(f"Dependency job {dep} not found in your organization")
        db.execute("UPDATE jobs SET dependency_mode=?, dependencies_met=0 WHERE id=?", (mode, job_id))
        added = 0
        for dep in depends_on:
            if dep == job_id or dependencies.would_cycle(db, job_id, dep):
                continue  # skipped, as the real server skips a self edge or one that would close a cycle
            added += dependencies.add_edge(db, job_id, dep, mode, now)
        met = dependencies.recompute(db, job_id, now)
        if not met:  # a dependency that already failed dooms the job at once
            store._ended(db, org, depends_on, now, facts)
    store._emit(facts)
    return {"dependencies_added": added, "dependencies_met": met}


# ---------- handlers ----------
def create_workflow(app, req):
    wf = parse_workflow(app, req)
    for d in wf["jobs"]:  # a queue-scoped key creates jobs in its queues only
        require_queue(req, d["queue_name"])
    return 200, create(app.store, req.org, wf), None


def _outside(store, org: str, allowed: frozenset[str] | None) -> set[str]:
    """The organization's workflows with a job outside `allowed` (a queue-scoped key's queues)."""
    if allowed is None:
        return set()
    marks = ",".join("?" * len(allowed))
    rows = store._read(f"SELECT DISTINCT workflow_id FROM jobs WHERE organization_id=? AND workflow_id IS NOT NULL "
                       f"AND queue_name NOT IN ({marks})", [org, *sorted(allowed)])
    return {r[0] for r in rows}


def _require_workflow(app, req) -> str:
    """The `{id}` workflow; 404 "Workflow not found" for a queue-scoped key when any of its jobs lies in
    another queue (the key may act only on what it can see whole)."""
    wid = req.params["id"]
    if wid in _outside(app.store, req.org, scope(req.key)):
        raise not_found("Workflow not found")
    return wid


def list_route(app, req):
    status = (req.query.get("status") or [""])[-1]
    limit = query_int(req, "limit", 50, 1, 100, I64)
    offset = query_int(req, "offset", 0, 0, 10**9, I64)
    status = status if status in STATUSES else None
    allowed = scope(req.key)
    if allowed is None:
        return 200, list_workflows(app.store, req.org, status, limit, offset), None
    hidden = _outside(app.store, req.org, allowed)
    shown = [w for w in list_workflows(app.store, req.org, status, 10**9, 0) if w["id"] not in hidden]
    return 200, shown[offset:offset + limit], None


def get_workflow(app, req):
    return 200, detail(app.store, req.org, _require_workflow(app, req)), None


def cancel_workflow(app, req):
    return 200, cancel(app.store, req.org, _require_workflow(app, req)), None


def retry_workflow(app, req):
    return 200, retry(app.store, req.org, _require_workflow(app, req)), None


def get_job_dependencies(app, req):
    job_id = req.params["id"]
    require_job(app.store, req.key, req.org, job_id, f"Job {job_id} not found")
    return 200, job_dependencies(app.store, req.org, job_id), None


def add_job_dependencies(app, req):
    b = body(req)
    deps = b.list("depends_on", True, 10**6)
    if not 1 <= len(deps) <= 100:
        raise validation("depends_on", "must contain between 1 and 100 items", "length")
    if not all(isinstance(d, str) for d in deps):
        raise invalid_type("depends_on", "an array of strings")
    mode = _mode(b, "dependency_mode")
    job_id = req.params["id"]
    require_job(app.store, req.key, req.org, job_id, f"Job {job_id} not found")
    for dep in deps:
        require_job(app.store, req.key, req.org, dep, f"Dependency job {dep} not found in your organization")
    return 200, add_dependencies(app.store, req.org, req.params["id"], deps, mode), None


ROUTES = [
    ("POST", "/api/v1/workflows", create_workflow),
    ("GET", "/api/v1/workflows", list_route),
    ("GET", "/api/v1/workflows/{id}", get_workflow),
    ("POST", "/api/v1/workflows/{id}/cancel", cancel_workflow),
    ("POST", "/api/v1/workflows/{id}/retry", retry_workflow),
    ("GET", "/api/v1/jobs/{id}/dependencies", get_job_dependencies),
    ("POST", "/api/v1/jobs/{id}/dependencies", add_job_dependencies),
]
