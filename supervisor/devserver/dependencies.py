"""Job dependencies and workflow progress: the SQL the store's state changes run inside their transaction.

Contract (the real server's rules, applied at once rather than by its 10 s sweep):
- A dependency is an edge in `job_dependencies` (job_id waits for depends_on_job_id); a job created with
  `parent_job_id` gets the edge too. `dependencies_met` is 1 when the job may be claimed: with
  `dependency_mode` `all` (the default) every job it depends on completed, with `any` one of them did.
- `release(db, job_id, now)` after a completion recomputes the waiting dependents of that job.
- `cascade(db, ...)` after a job ends without completing (dead-lettered, cancelled): each waiting
  dependent that can no longer be released (`all`: one dependency failed; `any`: none can complete any
  more) is cancelled with `last_error` "Parent job failed or was deadlettered", and so on down the graph.
- `touch(db, workflow_ids, now)` recomputes a workflow's counters and status: `running` once a job was
  claimed or ended, `completed` when every job completed, `failed` when none is active and one failed,
  dead-lettered or was cancelled by the cascade.
"""

from __future__ import annotations

SCHEMA = """
CREATE TABLE IF NOT EXISTS workflows(
  id TEXT PRIMARY KEY, organization_id TEXT NOT NULL, name TEXT NOT NULL, description TEXT, status TEXT NOT NULL,
  total_jobs INTEGER NOT NULL, completed_jobs INTEGER NOT NULL DEFAULT 0, failed_jobs INTEGER NOT NULL DEFAULT 0,
  created_at REAL NOT NULL, started_at REAL, completed_at REAL, metadata TEXT);
CREATE INDEX IF NOT EXISTS workflows_org ON workflows(organization_id, created_at);
CREATE TABLE IF NOT EXISTS job_dependencies(
  job_id TEXT NOT NULL, depends_on_job_id TEXT NOT NULL, dependency_type TEXT NOT NULL DEFAULT 'all',
  created_at REAL, PRIMARY KEY(job_id, depends_on_job_id));
CREATE INDEX IF NOT EXISTS job_dependencies_parent ON job_dependencies(depends_on_job_id);
CREATE INDEX IF NOT EXISTS jobs_workflow ON jobs(workflow_id) WHERE workflow_id IS NOT NULL;
"""

PARENT_FAILED = "Parent job failed or was deadlettered"
ACTIVE = ("pending", "scheduled", "processing")

# 1 when the job's edges let it run (the real server's check_job_dependencies_met); `jobs` is the outer row
MET = ("(CASE WHEN coalesce(jobs.dependency_mode, 'all') = 'any' THEN EXISTS (SELECT 1 FROM job_dependencies d "
       "JOIN jobs p ON p.id = d.depends_on_job_id WHERE d.job_id = jobs.id AND p.status = 'completed') "
       "ELSE NOT EXISTS (SELECT 1 FROM job_dependencies d JOIN jobs p ON p.id = d.depends_on_job_id "
       "WHERE d.job_id = jobs.id AND p.status != 'completed') END)")
# 1 when it never can any more: `all` with a dependency that ended without completing, `any` with none left
DOOMED = ("(CASE WHEN coalesce(jobs.dependency_mode, 'all') = 'any' THEN NOT EXISTS (SELECT 1 FROM "
          "job_dependencies d JOIN jobs p ON p.id = d.depends_on_job_id WHERE d.job_id = jobs.id AND "
          "p.status IN ('pending','scheduled','processing','completed')) "
          "ELSE EXISTS (SELECT 1 FROM job_dependencies d JOIN jobs p ON p.id = d.depends_on_job_id "
          "WHERE d.job_id = jobs.id AND p.status IN ('failed','deadletter','cancelled')) END)")


def add_edge(db, job_id: str, depends_on: str, mode: str, now: float) -> bool:
    """Record one edge; False if it was there already."""
    cur = db.execute("INSERT OR IGNORE INTO job_dependencies VALUES (?,?,?,?)", (job_id, depends_on, mode, now))
    return cur.rowcount > 0


def would_cycle(db, job_id: str, depends_on: str) -> bool:
    """Would `job_id` waiting for `depends_on` close a cycle (does `depends_on` already wait for it)?"""
    row = db.execute("WITH RECURSIVE chain(id) AS (SELECT depends_on_job_id FROM job_dependencies WHERE job_id=? "
                     "UNION SELECT d.depends_on_job_id FROM job_dependencies d JOIN chain c ON d.job_id = c.id) "
                     "SELECT 1 FROM chain WHERE id=? LIMIT 1", (depends_on, job_id)).fetchone()
    return row is not None


def recompute(db, job_id: str, now: float) -> bool:
    """Set one job's `dependencies_met` from its edges; the new value."""
    db.execute(f"UPDATE jobs SET dependencies_met = {MET}, updated_at=? WHERE id=?", (now, job_id))
    (met,) = db.execute("SELECT dependencies_met FROM jobs WHERE id=?", (job_id,)).fetchone()
    return bool(met)


def release(db, job_id: str, now: float) -> None:
    """A job completed: its waiting dependents whose edges are now met may be claimed."""
    db.execute(f"UPDATE jobs SET dependencies_met = 1, updated_at=? WHERE id IN (SELECT job_id FROM "
               f"job_dependencies WHERE depends_on_job_id=?) AND dependencies_met = 0 AND {MET}", (now, job_id))


def cascade(db, org: str, job_ids: list[str], now: float, facts: list) -> list[str]:
    """Jobs ended without completing: cancel the dependents that can no longer run, down the graph; the
    workflows touched. Appends a `job.dependency_failed` fact per cancelled job."""
    workflows: set[str] = set()
    todo = list(job_ids)
    while todo:
        marks = ",".join("?" * len(todo))
        rows = db.execute(f"SELECT id, queue_name, status, workflow_id FROM jobs WHERE status IN ('pending',"
                          f"'scheduled') AND coalesce(dependencies_met, 1) = 0 AND id IN (SELECT job_id FROM "
                          f"job_dependencies WHERE depends_on_job_id IN ({marks})) AND {DOOMED}", todo).fetchall()
        todo = []
        for jid, queue, old, workflow in rows:
            db.execute("UPDATE jobs SET status='cancelled', last_error=?, completed_at=?, updated_at=? WHERE id=?",
                       (PARENT_FAILED, now, now, jid))
            facts.append((org, "job.dependency_failed", {"job_id": jid, "queue_name": queue, "old_status": old,
                                                         "new_status": "cancelled"}))
            todo.append(jid)
            if workflow:
                workflows.add(workflow)
    return sorted(workflows)


def workflows_of(db, job_ids: list[str]) -> list[str]:
    if not job_ids:
        return []
    marks = ",".join("?" * len(job_ids))
    return [r[0] for r in db.execute(f"SELECT DISTINCT workflow_id FROM jobs WHERE id IN ({marks}) AND "
                                     "workflow_id IS NOT NULL", job_ids)]


def touch(db, workflow_ids, now: float) -> None:
    """Recompute each workflow's counters and status from its jobs (a cancelled workflow stays cancelled)."""
    for wid in workflow_ids:
        (total, done, failed, ended, active, claimed) = db.execute(
            "SELECT count(*), coalesce(sum(status='completed'), 0), "
            "coalesce(sum(status IN ('failed','deadletter')), 0), "
            "coalesce(sum(status IN ('failed','deadletter','cancelled')), 0), "
            "coalesce(sum(status IN ('pending','scheduled','processing')), 0), "
            "coalesce(sum(started_at IS NOT NULL OR status NOT IN ('pending','scheduled')), 0) "
            "FROM jobs WHERE workflow_id=?", (wid,)).fetchone()
        if active == 0 and total:
            status = "failed" if ended else "completed"
        else:
            status = "running" if claimed else "pending"
        db.execute("UPDATE workflows SET completed_jobs=?, failed_jobs=?, "
                   "status=CASE WHEN status='cancelled' THEN status ELSE ? END, "
                   "started_at=CASE WHEN started_at IS NULL AND ? != 'pending' THEN ? ELSE started_at END, "
                   "completed_at=CASE WHEN status='cancelled' THEN completed_at WHEN ? IN ('completed','failed') "
                   "THEN coalesce(completed_at, ?) ELSE NULL END WHERE id=?",
                   (done, failed, status, status, now, status, now, wid))
