"""The SDK worker's event hooks (`worker.on(event)`), run in the child process that runs the job.

Each hook gets the SDK's own event record (`spooled.worker.types.*EventData`), with the SDK's meaning:

  started / stopped     once per child process: after --child-init, before the child's first job; and when
                        the child leaves gracefully (a recycle, reload, drain or scale-down), before its
                        atexit handlers. So N times with --procs N, and again on every replacement.
  job:claimed           when the job reaches the child to run, then job:started just before the handler.
  job:completed         once the server accepted the job's result,
  job:failed            or its failure (will_retry as the SDK computes it: retry_count < max_retries),
  job:lease_lost        instead of either, when the server refused the outcome for a lost lease or the daemon
                        stopped the job because its lease was lost; one of the three per job, never two.
  error                 when the server refused a report for another reason (the SDK reports those there): a
                        refused result (then job:failed once the failure sent instead is accepted) or a refused
                        failure report. Not for a handler's exception: that is job:failed, as in the SDK.

The parent learns how a job settled (the server's answer to its report, or a lost lease) after the child has
moved on, and tells it (a `settled` frame); the child runs these hooks between jobs, never during one: after
the report's round trip to the API, and once the job running then (if any) has ended. A hook that raises
is logged once (per hook) and never fails a job; a coroutine hook is run to its end. Hooks make no request
to the API.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger("supervisor.child")

WANT_SETTLED = ("job:completed", "job:failed", "job:lease_lost", "error")  # what needs the parent's `settled`
MAX_AWAITING = 64  # jobs remembered until they settle; the oldest is forgotten past this


class ReportRefused(Exception):
    """What an `error` hook gets when the server refused a job's report (not for a lost lease)."""


def _lease_error(text: str) -> Exception:
    """The SDK's own error for a lost lease (ConflictError, code LEASE_EXPIRED) when it can be built."""
    try:
        from spooled.errors import ConflictError

        return ConflictError(text, code="LEASE_EXPIRED")
    except Exception:
        return RuntimeError(text)


class Hooks:
    """The hooks registered on one SDK worker object, and the jobs of this child not settled yet."""

    def __init__(self, registered: dict[str, list[Callable[..., Any]]], worker_id: str, queue: str):
        from spooled.worker import types  # the worker object exists: its SDK is imported

        self.types = types
        self.registered = registered
        self.worker_id, self.queue = worker_id, queue
        self.wants_settled = any(event in registered for event in WANT_SETTLED)
        self.awaiting: dict[str, tuple[dict, Any]] = {}  # job id -> (job, the handler's result), done, not settled
        self.settled: list[dict] = []  # the parent's `settled` frames not acted on yet
        self._logged: set[int] = set()  # the hooks whose failure was logged

    # ---------------------------------------------------------------- the child's life
    def started(self) -> None:
        self.emit("started", lambda t: t.StartedEventData(worker_id=self.worker_id, queue_name=self.queue))

    def stopped(self) -> None:
        self.emit("stopped", lambda t: t.StoppedEventData(worker_id=self.worker_id, reason="graceful"))

    # ---------------------------------------------------------------- a job
    def job_begins(self, job: dict) -> None:
        job_id, queue = job["id"], job.get("queue_name", "")
        self.emit("job:claimed", lambda t: t.JobClaimedEventData(job_id=job_id, queue_name=queue))
        self.emit("job:started", lambda t: t.JobStartedEventData(job_id=job_id, queue_name=queue))

    def job_ended(self, job: dict, seen: dict) -> None:
        """Remember the job (and its result) until the parent says how the server took its outcome."""
        if not self.wants_settled:
            return
        if len(self.awaiting) >= MAX_AWAITING:
            self.awaiting.pop(next(iter(self.awaiting)))
        self.awaiting[job["id"]] = (job, seen.get("result"))

    def take_settled(self, msg: dict) -> None:
        """A `settled` frame came: acted on by `run_settled`, between jobs."""
        self.settled.append(msg)

    def run_settled(self, running: dict | None = None) -> None:
        """Run the hooks of the `settled` frames that came, for jobs this child ran (`running`: the job it
        was running when the daemon stopped it, whose frame may have come just before)."""
        frames, self.settled = self.settled, []
        for msg in frames:
            job_id = msg.get("id")
            if not isinstance(job_id, str):
                continue
            if running is not None and job_id == running.get("id"):
                self.awaiting[job_id] = (running, None)
            remembered = self.awaiting.pop(job_id, None)
            if remembered is not None:
                if msg.get("as") == "refused":  # the result was refused; the failure sent instead settles later
                    self.awaiting[job_id] = (remembered[0], None)
                self._settled(msg, *remembered)

    def _settled(self, msg: dict, job: dict, result: Any) -> None:
        job_id, queue = job["id"], job.get("queue_name", "")
        settled_as, text = msg.get("as"), str(msg.get("error") or "")
        if settled_as == "completed":
            self.emit("job:completed", lambda t: t.JobCompletedEventData(job_id=job_id, queue_name=queue,
                                                                         result=result))
        elif settled_as == "failed":
            will_retry = int(job.get("retry_count") or 0) < int(job.get("max_retries") or 0)
            self.emit("job:failed", lambda t: t.JobFailedEventData(job_id=job_id, queue_name=queue, error=text,
                                                                   will_retry=will_retry))
        elif settled_as == "lease_lost":
            operation = str(msg.get("operation") or "heartbeat")
            self.emit("job:lease_lost", lambda t: t.JobLeaseLostEventData(
                job_id=job_id, queue_name=queue, lease_id=job.get("lease_id"), operation=operation,
                error=_lease_error(text)))
        elif settled_as in ("error", "refused"):
            self.emit("error", lambda t: t.ErrorEventData(error=ReportRefused(text)))

    # ---------------------------------------------------------------- calling them
    def emit(self, event: str, data: Callable[[Any], Any]) -> None:
        """Call each hook of `event` with the record `data` builds (built only when a hook is registered)."""
        fns = self.registered.get(event)
        if not fns:
            return
        record = data(self.types)
        for fn in fns:
            try:
                result = fn(record)
                if inspect.isawaitable(result):
                    asyncio.run(_wait(result))
            except Exception:
                self._log_failure(event, fn)

    def _log_failure(self, event: str, fn: Callable[..., Any]) -> None:
        if id(fn) in self._logged:
            return
        self._logged.add(id(fn))
        name = getattr(fn, "__qualname__", None) or repr(fn)
        log.warning("an event hook raised; the job goes on (later failures of this hook are not logged)",
                    exc_info=True, extra={"fields": {"event": event, "hook": f"{getattr(fn, '__module__', '')}."
                                                                              f"{name}"}})


async def _wait(awaitable: Any) -> Any:
    return await awaitable


def hooks_of(worker: Any, worker_id: str) -> Hooks | None:
    """The hooks registered on `worker` (an SDK worker object), or None when it has none (or is None)."""
    registered = getattr(worker, "_event_handlers", None) if worker is not None else None
    if not registered:
        return None
    found = {str(event): list(fns) for event, fns in registered.items() if fns}
    if not found:
        return None
    options = getattr(worker, "_options", None)
    return Hooks(found, worker_id, str(getattr(options, "queue_name", "") or ""))
