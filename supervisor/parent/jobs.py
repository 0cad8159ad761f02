"""The arbiter's job flow: claim for idle children, hand jobs over, renew leases, enforce timeouts,
report outcomes, and stop the work whose lease is lost.

A mixin of `Arbiter`, which owns the state (`inflight`, `children`, claim timing, ...); only the
parent's loop calls these methods. Every API call goes out through `self.submit` and comes back
through the matching `on_*` method.
"""

from __future__ import annotations

import logging
import random
import signal
from logging import DEBUG, ERROR, INFO, WARNING

from supervisor import exitcodes
from supervisor.backoff import backoff
from supervisor.client import rest as api
from supervisor.ops.logs import log_event
from supervisor.parent.childproc import Child, signal_child, stop_child
from supervisor.parent.inflight import Entry
from supervisor.parent.pool import MEMORY_CHECK_EVERY

log = logging.getLogger("supervisor")


class JobFlow:
    def child_done(self, child: Child, msg: dict, now: float) -> None:
        job_id = msg.get("id")
        child.jobs_done += 1
        child.job_id = None
        if child.state == "busy":
            child.state = "idle"
        entry = self.inflight.get(job_id)
        if entry is None or entry.slot != child.slot:
            log_event(log, DEBUG, "result for a job no longer held; dropped", job_id=job_id, pid=child.pid)
            entry = None
        else:
            outcome = ("complete", msg.get("result")) if msg.get("ok") else ("fail", msg.get("error") or "Job failed")
            self.inflight.finish(entry, outcome, now)
        if child.job_quota and child.jobs_done >= child.job_quota:
            self.retire(child, "max_jobs")
        if self.cfg.max_memory_per_child_mb and (child.read_rss() or 0) > self.cfg.max_memory_per_child_mb * 2**20:
            self.retire(child, "max_memory")
        if child.retire:
            self.pool_changed = True  # converge replaces it this turn (a reload: one at a time)
        self.dispatch_waiting(now)
        self.next_claim_at = min(self.next_claim_at, now)  # claim again as soon as a child frees up,
        self.maybe_claim(now)  # and before reporting: the child waits on the claim, the report can wait
        if entry is not None:
            if self.claim_inflight:
                self.reports_after_claim.append(entry)  # so the server answers the claim first
            else:
                self.report(entry)

    def dispatch_waiting(self, now: float) -> None:
        waiting = self.inflight.waiting()
        if not waiting:
            return
        for child, entry in zip(self.idle_children(), waiting):
            try:
                child.chan.send({"t": "job", "job": entry.job})
            except OSError:
                continue  # the sentinel will report the death; the job stays waiting
            self._watch_writes(child)
            child.state, child.job_id = "busy", entry.id
            self.inflight.start(entry, child.slot, child.pid, now)
            log_event(log, DEBUG, "job started", **self.job_fields(entry, now))

    def maybe_claim(self, now: float) -> None:
        if (not self.registered or self.draining or self.claim_inflight or now < self.next_claim_at
                or now < self.claim_not_before):
            return
        free = len(self.idle_children()) - len(self.inflight.waiting())
        if free <= 0:
            return
        self.claim_inflight = True
        self.submit(("claim", free, now), self.api.claim_call(self.cfg.queue, self.cfg.worker_id, free, self.cfg.lease),
                    first=True)

    def on_claim(self, asked: int, sent_at: float, jobs, error, now: float) -> None:
        self.claim_inflight = False
        if error is not None:
            self.claim_failures += 1
            self.send_held_reports()
            if isinstance(error, api.Unauthorized):
                return self.fatal(exitcodes.AUTH, error)
            wait = backoff(self.claim_failures, 0.2, max(self.cfg.poll_interval, 5.0))
            if isinstance(error, api.RateLimited) and error.retry_after is not None:
                wait = max(wait, float(error.retry_after))
            log_event(log, WARNING if self.claim_failures <= 3 or self.claim_failures % 20 == 0 else DEBUG,
                      "claim failed", error=str(error), retry_in=round(wait, 2), failures=self.claim_failures)
            self.claim_not_before = now + wait
            return
        self.claim_failures = 0
        self.claim_not_before = 0.0
        for job in jobs:
            if not isinstance(job, dict) or not isinstance(job.get("id"), str) or not job.get("lease_id"):
                log_event(log, ERROR, "claim answer holds a job without an id or lease_id; ignored", job=str(job)[:200])
                continue
            self.take_claimed(job, sent_at, now)
        self.hooks.claimed(len(jobs))
        if len(jobs) < asked:
            self.empty_claims += 1
            self.next_claim_at = now + backoff(self.empty_claims, 0.05, self.cfg.poll_interval)
        else:
            self.empty_claims = 0
            self.next_claim_at = now
        self.dispatch_waiting(now)
        self.send_held_reports()

    def take_claimed(self, job: dict, sent_at: float, now: float) -> None:
        """Add a claimed job to the table. The same id again means the server re-issued it (our lease had
        expired): the old copy's work and answers are void."""
        old = self.inflight.get(job["id"])
        if old is not None:
            self.lease_lost(old, "the server handed this job out again under a new lease", now)
        self.inflight.add(job, sent_at)
        log_event(log, DEBUG, "job claimed", job_id=job["id"], queue=self.cfg.queue, worker_id=self.cfg.worker_id)

    def send_held_reports(self) -> None:
        held, self.reports_after_claim = self.reports_after_claim, []
        for entry in held:
            if self.inflight.get(entry.id) is entry:
                self.report(entry)

    def report(self, entry: Entry) -> None:
        """Tell the API how the job ended (complete or fail), once; retried by on_report."""
        if entry.reporting:
            return
        entry.reporting = True
        entry.report_attempts += 1
        kind, value = entry.outcome
        if kind == "complete":
            self.submit(("report", entry), self.api.complete_call(entry.id, self.cfg.worker_id, entry.lease_id, value))
        else:
            self.submit(("report", entry), self.api.fail_call(entry.id, self.cfg.worker_id, entry.lease_id, value))

    def on_report(self, entry: Entry, error, now: float) -> None:
        job_id = entry.id
        if self.inflight.get(job_id) is not entry:
            return  # settled or void meanwhile (lease lost, handed out again)
        entry.reporting = False
        kind, value = entry.outcome
        fields = self.job_fields(entry, now)
        if error is None:
            self.inflight.pop(job_id)
            self.hooks.job_finished(entry.queue, entry.kind, entry.duration)
            if kind == "complete":
                log_event(log, INFO, "job completed", **fields)
            else:
                log_event(log, WARNING, "job failed", error=str(value)[:300], **fields)
            return
        if isinstance(error, (api.LeaseLost, api.AlreadyFinished)):
            self.inflight.pop(job_id)
            self.hooks.job_finished(entry.queue, "lease_lost", entry.duration)
            log_event(log, WARNING, f"{kind} refused: this worker no longer holds the job; outcome dropped",
                      error=str(error), **fields)
        elif isinstance(error, api.Unauthorized):
            self.inflight.pop(job_id)
            self.fatal(exitcodes.AUTH, error)
        elif isinstance(error, api.Rejected) and kind == "complete":
            log_event(log, ERROR, "the API refused the result; failing the job instead", error=str(error), **fields)
            entry.outcome, entry.kind = ("fail", f"ResultRejected: the API refused this job's result: {error}"), "failed"
            self.report(entry)
        elif isinstance(error, api.Rejected):
            self.inflight.pop(job_id)
            log_event(log, ERROR, "the API refused the failure report; job left to its lease", error=str(error), **fields)
        else:
            wait = backoff(entry.report_attempts, 0.2, 15.0)
            if isinstance(error, api.RateLimited) and error.retry_after:
                wait = max(wait, float(error.retry_after))
            log_event(log, WARNING, f"{kind} not delivered yet; will retry", error=str(error),
                      retry_in=round(wait, 2), attempts=entry.report_attempts, **fields)
            self.after(wait, self._retry_report, entry)

    def _retry_report(self, entry: Entry) -> None:
        if self.inflight.get(entry.id) is entry and entry.outcome is not None:
            self.report(entry)

    def enforce_deadlines(self, now: float) -> None:
        for entry in self.inflight.timed_out(now):
            timeout = entry.job.get("timeout_seconds")
            log_event(log, WARNING, "job timed out; stopping its child", timeout_seconds=timeout,
                      **self.job_fields(entry, now))
            self.stop_job(entry, "timeout", now)
            self.fail_job(entry, f"JobTimeout: the job ran past its timeout of {timeout} s; its child process "
                                 f"(pid {entry.pid}) was stopped", now, "timed_out")
        for child in self.children.values():
            if child.kill_at is not None and now >= child.kill_at:
                log_event(log, WARNING, "child ignored SIGTERM; sending SIGKILL", slot=child.slot, pid=child.pid,
                          reason=child.stop_reason)
                signal_child(child, signal.SIGKILL)
                child.kill_at = None
        for entry in self.inflight.renewals_due(now):
            entry.renewing = True
            self.submit(("renew", entry, now), self.api.renew_lease_call(entry.id, self.cfg.worker_id,
                                                                         entry.lease_id, self.cfg.lease))
        if now >= self.next_memory_check:
            self.next_memory_check = now + MEMORY_CHECK_EVERY
            self.check_memory(now)

    def on_renew(self, entry: Entry, sent_at: float, error, now: float) -> None:
        if self.inflight.get(entry.id) is not entry:
            return
        if error is None:
            self.inflight.renewed(entry, sent_at)
            self.hooks.lease_renewed("ok")
            return
        entry.renewing = False
        if entry.outcome is not None and not isinstance(error, api.Unauthorized):
            # The outcome is on its way (or waiting to be retried): its answer settles the job. A renewal
            # racing a delivered `complete` meets 'already completed', which is no lost lease.
            entry.renew_at = now + min(2.0, self.cfg.lease / 10.0)
            return
        if isinstance(error, (api.LeaseLost, api.AlreadyFinished)):
            self.hooks.lease_renewed("lost")
            self.lease_lost(entry, error, now)
        elif isinstance(error, api.Unauthorized):
            self.fatal(exitcodes.AUTH, error)
        else:
            self.hooks.lease_renewed("error")
            entry.renew_at = now + min(2.0, self.cfg.lease / 10.0) * random.uniform(0.5, 1.0)
            log_event(log, WARNING, "lease renewal failed; retrying", error=str(error),
                      lease_left=round(entry.lease_until - now, 2), **self.job_fields(entry, now))

    def job_fields(self, entry: Entry, now: float) -> dict:
        """What every job log line carries: job_id, queue, worker_id, the child's pid and the duration so far."""
        duration = entry.duration
        if duration is None:
            duration = now - entry.started_at if entry.started_at is not None else 0.0
        return {"job_id": entry.id, "queue": entry.queue, "worker_id": self.cfg.worker_id, "pid": entry.pid,
                "duration": round(duration, 4)}

    def lease_lost(self, entry: Entry, error, now: float) -> None:
        """The API says this worker no longer holds the job: stop the work, send nothing more for it."""
        self.inflight.pop(entry.id)
        self.hooks.job_finished(entry.queue, "lease_lost", None)
        log_event(log, WARNING, "lease lost; stopping the job's work", error=str(error), **self.job_fields(entry, now))
        self.stop_job(entry, "lease_lost", now)

    def stop_job(self, entry: Entry, reason: str, now: float) -> None:
        """Stop the child running `entry`, if one is (SIGTERM, then SIGKILL after the grace)."""
        child = self.children.get(entry.slot) if entry.slot is not None else None
        if child is not None and child.job_id == entry.id:
            child.job_id = None
            stop_child(child, reason, now, self.cfg.kill_grace)

    def fail_job(self, entry: Entry, error: str, now: float, kind: str = "failed") -> None:
        """The job ended without its child's answer (timeout, crash, memory cap): fail it with `error`."""
        self.inflight.finish(entry, ("fail", error), now, kind)
        self.report(entry)
