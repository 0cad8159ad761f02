"""Settling: how each job held ends, told to the API: outcomes reported, leases renewed, timeouts
enforced, lost leases given up on.

`Settling` records what children did (`job_done`, `child_lost`) or what the parent decided for a job (a
timeout, a memory cap, a reserved job handed back), reports each outcome (complete or fail, one report of
a job on the wire at a time, retried until the API answers), renews the lease of every job held, and
drops a job whose lease is lost (a `RecallJob` or `StopJob` for the child that has it). It never changes a
child: it answers with facts. A job is settled once the API acknowledged its outcome.
"""

from __future__ import annotations

import logging
import random
from functools import partial
from logging import DEBUG, ERROR, INFO, WARNING
from typing import Any

from supervisor import exitcodes
from supervisor.backoff import backoff
from supervisor.client import rest as api
from supervisor.client.transport import Transport
from supervisor.config import Config
from supervisor.ops.logs import log_event, scrub
from supervisor.ops.nullhooks import NullHooks
from supervisor.parent.facts import (
    ChildLost,
    Fact,
    Fatal,
    Followup,
    JobDone,
    JobSettled,
    QueueFreed,
    RecallJob,
    RetryDue,
    StopJob,
    Submit,
)
from supervisor.parent.inflight import Entry, InFlight, Outcome, job_fields

log = logging.getLogger("supervisor")

RETRY_JITTER = 0.55  # seconds: the server adds up to 0.5 s to a retry's back-off


class Settling:
    """Outcomes, reports, renewals, timeouts and lost leases of the jobs in the in-flight table it is
    given (see the module docstring); every call goes out through `submit(call, followup)`."""

    def __init__(self, cfg: Config, client: Transport, submit: Submit, hooks: NullHooks, inflight: InFlight):
        self.cfg = cfg
        self.api = client  # builds the calls
        self.submit = submit  # the arbiter's way out to the API
        self.hooks = hooks
        self.inflight = inflight  # every job this worker holds (the table is its own part)
        self.unsent: list[Entry] = []  # outcomes recorded this turn, sent by send_reports
        self.settled = 0  # jobs whose outcome (complete or fail) the API acknowledged

    def next_deadline(self) -> float | None:
        """The earliest time this part must act: a lease to renew, a timeout, a report to (re)send."""
        if self.unsent:
            return 0.0
        return self.inflight.next_deadline()

    def stats(self) -> dict:
        """Plain data for the published snapshot."""
        return {"jobs_settled": self.settled}

    def job_fields(self, entry: Entry, now: float) -> dict:
        """What every job log line carries (supervisor.parent.inflight.job_fields)."""
        return job_fields(entry, self.cfg.worker_id, now)

    # ------------------------------------------------------------ what children did
    def job_done(self, fact: JobDone, now: float) -> list[Fact]:
        """A child answered for its job: record the outcome (`send_reports` tells the API); its queue had
        work and a child is free (`QueueFreed`)."""
        entry = self.inflight.get(fact.job_id)
        if entry is None or entry.slot != fact.slot:
            log_event(log, DEBUG, "result for a job no longer held; dropped", job_id=fact.job_id, slot=fact.slot)
            return []
        self.inflight.record_outcome(entry, Outcome(fact.ok, fact.value, "completed" if fact.ok else "failed"), now)
        self.unsent.append(entry)
        return [QueueFreed(entry.queue, entry.duration)]

    def child_lost(self, fact: ChildLost, now: float) -> None:
        """The child on `fact.slot` stopped without answering: fail the job it ran, if any."""
        entry = self.inflight.on_child(fact.slot)
        if entry is None:
            return
        if fact.outcome == "crashed":
            log_event(log, ERROR, "child died during a job", cause=fact.error, **self.job_fields(entry, now))
        self._fail(entry, fact.error, now, fact.outcome)

    def hand_back_reserved(self, error: str, now: float) -> None:
        """Give every reserved job (claimed, not started) back to the queue, failed with `error` (the API has
        no release: a fail puts it back, to be retried, by this worker or another)."""
        for entry in self.inflight.unassigned():
            log_event(log, INFO, "handing a reserved job back", error=error, **self.job_fields(entry, now))
            self._fail(entry, error, now, "failed")

    # ------------------------------------------------------------ reporting
    def send_reports(self) -> None:
        """Send the outcomes recorded since the last call (after this turn's claim, which goes first)."""
        unsent, self.unsent = self.unsent, []
        for entry in unsent:
            if self.inflight.holds(entry):
                self._report(entry)

    def _report(self, entry: Entry) -> None:
        """Tell the API how the job ended (complete or fail), once at a time; retried by on_report."""
        if entry.outcome is None or not self.inflight.begin_report(entry):
            return
        out = entry.outcome
        if out.ok:
            call = self.api.complete_call(entry.id, self.cfg.worker_id, entry.lease_id, out.value)
        else:
            call = self.api.fail_call(entry.id, self.cfg.worker_id, entry.lease_id, out.value)
        # entry.report's turn is given back by the table (report_answered) on every path, recover_report's too
        self.submit(call, Followup(partial(self.on_report, entry), partial(self.recover_report, entry)))

    def on_report(self, entry: Entry, _result: Any, error: api.ApiError | None, now: float) -> list[Fact]:
        """A report's answer: settled, refused (lease lost; a result the API refuses is failed instead), or
        retried on a back-off."""
        if not self.inflight.holds(entry) or entry.outcome is None:
            return []  # settled or void meanwhile (lease lost, handed out again)
        self.inflight.report_answered(entry)
        out = entry.outcome
        fields = self.job_fields(entry, now)
        if error is None:
            self.inflight.pop(entry.id)
            self.settled += 1
            self.hooks.job_settled(entry.queue, out.label, entry.duration)
            if out.ok:
                log_event(log, INFO, "job completed", **fields)
            else:
                log_event(log, WARNING, "job failed", error=scrub(str(out.value))[:300], **fields)
                return self._expect_retry(entry, now) + tell_child(entry, "failed", str(out.value))
            return tell_child(entry, "completed")
        if isinstance(error, (api.LeaseLost, api.AlreadyFinished)):
            self.inflight.pop(entry.id)
            self.hooks.job_settled(entry.queue, "lease_lost", entry.duration)
            log_event(log, WARNING, f"{out.verb} refused: this worker no longer holds the job; outcome dropped",
                      error=str(error), **fields)
            return tell_child(entry, "lease_lost", str(error), out.verb)
        elif isinstance(error, api.Unauthorized):
            self.inflight.pop(entry.id)
            return [Fatal(exitcodes.AUTH, str(error))]
        elif isinstance(error, api.Rejected) and out.ok:
            log_event(log, ERROR, "the API refused the result; failing the job instead", error=str(error), **fields)
            self.inflight.replace_outcome(entry, Outcome(False, f"ResultRejected: the API refused this job's result: "
                                                                f"{error}", "failed"))
            self._report(entry)
            return tell_child(entry, "refused", str(error), out.verb)  # an `error` hook, then how the failure settles
        elif isinstance(error, api.Rejected):
            self.inflight.pop(entry.id)
            log_event(log, ERROR, "the API refused the failure report; job left to its lease", error=str(error),
                      **fields)
            return tell_child(entry, "error", str(error), out.verb)
        else:
            wait = backoff(entry.report_attempts, 0.2, 15.0)
            if isinstance(error, api.RateLimited) and error.retry_after:
                wait = max(wait, float(error.retry_after))
            log_event(log, WARNING, f"{out.verb} not delivered yet; will retry", error=str(error),
                      retry_in=round(wait, 2), attempts=entry.report_attempts, **fields)
            self.inflight.report_answered(entry, retry_at=now + wait)
        return []

    def _expect_retry(self, entry: Entry, now: float) -> list[Fact]:
        """A failed job with retries left is pending again after min(2^min(retry_count, 6), 60) s plus up
        to 0.5 s of jitter (the server's fixed back-off): have its queue claimed then (`RetryDue`)."""
        retries, limit = entry.job.get("retry_count"), entry.job.get("max_retries")
        if not isinstance(retries, int) or not isinstance(limit, int) or retries >= limit:
            return []
        return [RetryDue(entry.queue, now + min(2 ** min(retries, 6), 60) + RETRY_JITTER)]

    def recover_report(self, entry: Entry, now: float) -> None:
        """Handling a report's answer raised: send it again after a second."""
        if self.inflight.holds(entry):
            self.inflight.report_answered(entry, retry_at=now + 1.0)

    # ------------------------------------------------------------ deadlines and leases
    def enforce(self, now: float) -> list[Fact]:
        """Drop reserved jobs whose lease ran out, time out jobs past their timeout_seconds, resend due
        reports, renew due leases; nothing to scan for before the table's next deadline."""
        if not self.inflight.due(now):
            return []
        facts: list[Fact] = []
        for entry in self.inflight.unassigned() + self.inflight.held():
            if entry.lease_until <= now and not entry.renewal.busy:
                # The loop did not run for longer than the lease (the host paused, the API unreachable):
                # the server has re-queued the job, so this copy must never reach a child.
                facts += self.lease_lost(entry, "its lease ran out while it waited for a child", now)
        for entry in self.inflight.timed_out(now):
            timeout = entry.job.get("timeout_seconds")
            log_event(log, WARNING, "job timed out; stopping its child", timeout_seconds=timeout,
                      **self.job_fields(entry, now))
            if entry.slot is not None:
                facts.append(StopJob(entry.slot, entry.id, "timeout"))
            self._fail(entry, f"JobTimeout: the job ran past its timeout of {timeout} s; its child process "
                              f"(pid {entry.pid}) was stopped", now, "timed_out")
        for entry in self.inflight.reports_due(now):
            self._report(entry)
        for entry in self.inflight.renewals_due(now):
            self.inflight.begin_renewal(entry)
            call = self.api.renew_lease_call(entry.id, self.cfg.worker_id, entry.lease_id, self.cfg.lease)
            # entry.renewal's turn is given back by the table (renewed, renewal_failed) on every path that keeps it
            self.submit(call, Followup(partial(self.on_renew, entry, now), partial(self.recover_renew, entry)))
        self.inflight.rescan()
        return facts

    def on_renew(self, entry: Entry, sent_at: float, _result: Any, error: api.ApiError | None,
                 now: float) -> list[Fact]:
        """A renewal's answer: the lease runs from `sent_at` again, or is lost, or the renewal is retried."""
        if not self.inflight.holds(entry):
            return []
        if error is None:
            self.inflight.renewed(entry, sent_at)
            self.hooks.lease_renewed("ok")
            return []
        retry = min(2.0, self.cfg.lease / 10.0)
        if entry.outcome is not None and not isinstance(error, api.Unauthorized):
            # The outcome is on its way (or waiting to be retried): its answer settles the job. A renewal
            # racing a delivered `complete` meets 'already completed', which is no lost lease.
            self.inflight.renewal_failed(entry, now + retry)
            return []
        if isinstance(error, (api.LeaseLost, api.AlreadyFinished)):
            self.hooks.lease_renewed("lost")
            return self.lease_lost(entry, str(error), now)
        if isinstance(error, api.Unauthorized):
            self.inflight.renewal_failed(entry, now + retry)
            return [Fatal(exitcodes.AUTH, str(error))]
        self.hooks.lease_renewed("error")
        self.inflight.renewal_failed(entry, now + retry * random.uniform(0.5, 1.0))
        log_event(log, WARNING, "lease renewal failed; retrying", error=str(error),
                  lease_left=round(entry.lease_until - now, 2), **self.job_fields(entry, now))
        return []

    def recover_renew(self, entry: Entry, now: float) -> None:
        """Handling a renewal's answer raised: renew again after a second."""
        self.inflight.renewal_failed(entry, now + 1.0)

    def lease_lost(self, entry: Entry, error: str, now: float) -> list[Fact]:
        """This worker no longer holds the job (the API says so, its lease ran out, or it was handed out
        again): drop it (if the table still has it), send nothing more for it, and have its child (if
        one runs or holds it) stopped or asked to give it back."""
        if self.inflight.holds(entry):
            self.inflight.pop(entry.id)
        self.hooks.job_settled(entry.queue, "lease_lost", None)
        log_event(log, WARNING, "lease lost; stopping the job's work", error=error, **self.job_fields(entry, now))
        if entry.slot is None:
            return tell_child(entry, "lease_lost", error, "heartbeat")
        if entry.held:
            return [RecallJob(entry.slot, entry.id)]
        return [*tell_child(entry, "lease_lost", error, "heartbeat"), StopJob(entry.slot, entry.id, "lease_lost")]

    def _fail(self, entry: Entry, error: str, now: float, label: str) -> None:
        """The job ended without its child's answer (timeout, crash, memory cap): fail it with `error`."""
        self.inflight.record_outcome(entry, Outcome(False, error, label), now)
        self._report(entry)


def tell_child(entry: Entry, settled_as: str, error: str = "", operation: str = "") -> list[Fact]:
    """How a job settled, for the child that ran it (JobSettled): the SDK worker's hooks run there. Nothing
    for a job no child started."""
    if entry.pid is None or entry.started_at is None:
        return []
    return [JobSettled(entry.pid, entry.id, settled_as, error[:2000], operation)]
