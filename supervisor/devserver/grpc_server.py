"""Spooled's gRPC API (QueueService, WorkerService) served from the dev server's Store.

Contract (the real server's): auth by `x-api-key` or `authorization: Bearer` metadata (UNAUTHENTICATED
otherwise); the per-organization rate limit answers RESOURCE_EXHAUSTED "Rate limit exceeded"; then
the fault switches apply as on REST (delay; `fail_503` -> UNAVAILABLE before handling; `cut` ->
handled, then UNAVAILABLE instead of the answer). Leases <= 0 mean 300 s, others are clamped to
5-3600. Settlement needs a lease_id (INVALID_ARGUMENT); a lease held by this worker but expired or
replaced is FAILED_PRECONDITION; anything else NOT_FOUND "Job not found or not authorized".
`StreamJobs` keeps the real server's clock: each turn re-checks the key and the rate limit, then either
claims one job (when the stream holds none) or sleeps STREAM_POLL_INTERVAL (an empty queue, or the job
it holds still out); nothing wakes it early but its own client going away. A job claimed for a client
that went away stays leased until the lease runs out. An organization holds at most `stream_limit`
open streams (StreamJobs and ProcessJobs); past it a new one is RESOURCE_EXHAUSTED.
`ProcessJobs` answers every message once, in order, with in-band `ErrorResponse`s worded as the real
server words them. Payloads and results are Struct: a non-object payload goes out missing; numbers
are doubles.
"""

from __future__ import annotations

import sqlite3
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import orjson
from google.protobuf import struct_pb2

from supervisor.proto import spooled_pb2 as pb
from supervisor.proto import spooled_pb2_grpc as pb_grpc
from supervisor.proto.structs import plain_struct

from .errors import HttpError
from .keys_store import KeyContext, job_in_scope, key_context, worker_in_scope
from .store import Store, dumps
from .validate import check_hostname, check_queue_name, check_worker_id

GRPC_DEFAULT_LEASE_DURATION_SECS = 300  # a claim or stream that names no lease (<= 0)
STREAM_POLL_INTERVAL = 1.0  # seconds: the real server's STREAM_POLL_INTERVAL_MS
STREAM_LIMIT = 100  # open streams per organization
MAX_RESULT_BYTES = 1024 * 1024
MAX_ERROR_BYTES = 4096
TRUNCATED = "... [truncated]"
MAX_MESSAGE = 4 * 1024 * 1024
NOT_OWNED = "Job not found or not authorized"
LEASE_MISMATCH = "lease_id does not match the job's current lease"
STATUSES = {"pending": pb.JOB_STATUS_PENDING, "scheduled": pb.JOB_STATUS_SCHEDULED,
            "processing": pb.JOB_STATUS_PROCESSING, "completed": pb.JOB_STATUS_COMPLETED,
            "failed": pb.JOB_STATUS_FAILED, "deadletter": pb.JOB_STATUS_DEADLETTER,
            "cancelled": pb.JOB_STATUS_CANCELLED}
WORKER_STATUSES = ("healthy", "degraded", "draining", "offline")
SC = grpc.StatusCode


class GrpcError(Exception):
    """A gRPC status to end the call with; `inband` is the ProcessJobs ErrorResponse code for it."""

    def __init__(self, code: grpc.StatusCode, message: str, inband: str = "INTERNAL"):
        super().__init__(message)
        self.code, self.message, self.inband = code, message, inband


def clamp_lease(secs: int) -> int:
    return GRPC_DEFAULT_LEASE_DURATION_SECS if secs <= 0 else max(5, min(3600, secs))


def cut_error(text: str) -> str:
    """An error text of at most MAX_ERROR_BYTES of UTF-8, marked as cut when it was."""
    raw = text.encode()
    if len(raw) <= MAX_ERROR_BYTES:
        return text
    return raw[:MAX_ERROR_BYTES - len(TRUNCATED)].decode("utf-8", "ignore") + TRUNCATED


def check_grpc_queue(name: str) -> None:
    """The real gRPC service's queue-name rule and wording (it differs from REST's)."""
    if not name or len(name) > 255:
        raise _invalid("Queue name must be 1-255 characters")
    if not all(c.isalnum() or c in "-_." for c in name):
        raise _invalid("Queue name can only contain alphanumeric characters, dashes, underscores, and dots")
    if name[0] in ".-":
        raise _invalid("Queue name cannot start with dots or dashes")


def _invalid(message: str) -> GrpcError:
    return GrpcError(SC.INVALID_ARGUMENT, message, "INVALID_ARGUMENT")


def from_api_error(e: HttpError, job_route: bool = False) -> GrpcError:
    """The store's REST-shaped outcome as the gRPC status the real server gives."""
    code, msg = e.body.get("code"), e.body.get("message", "")
    if e.status in (400, 422):
        return _invalid(msg)
    if e.status == 401:
        return GrpcError(SC.UNAUTHENTICATED, msg, "UNAUTHENTICATED")
    if e.status == 403:
        return GrpcError(SC.PERMISSION_DENIED, msg, "PERMISSION_DENIED")
    if e.status == 429:
        return GrpcError(SC.RESOURCE_EXHAUSTED, msg if code == "QUOTA_EXCEEDED" else "Rate limit exceeded",
                         "RATE_LIMIT_EXCEEDED")
    if e.status == 503:
        return GrpcError(SC.UNAVAILABLE, msg, "INTERNAL")
    if job_route and code == "LEASE_EXPIRED":
        return GrpcError(SC.FAILED_PRECONDITION, LEASE_MISMATCH if "does not match" in msg else "Lease expired",
                         "LEASE_EXPIRED")
    if job_route and e.status in (404, 409):  # not held by this worker, or already settled (a duplicate)
        return GrpcError(SC.NOT_FOUND, NOT_OWNED, "NOT_FOUND")
    if e.status == 404:
        return GrpcError(SC.NOT_FOUND, msg, "NOT_FOUND")
    if e.status == 409:
        return GrpcError(SC.ALREADY_EXISTS, msg, "INVALID_REQUEST")
    return GrpcError(SC.INTERNAL, msg, "INTERNAL")


# ------------------------------------------------------------------ conversions
def struct_from_json(text: str | None) -> struct_pb2.Struct | None:
    """Stored JSON text -> Struct, or None when it is not an object (it then goes out missing)."""
    if not text or not text.lstrip().startswith("{"):
        return None
    s = struct_pb2.Struct()
    s.update(orjson.loads(text))
    return s


def json_from_struct(msg, field: str) -> str | None:
    """A Struct field as JSON text (None when unset); every number is a double, as the wire has it."""
    if not msg.HasField(field):
        return None
    return dumps(plain_struct(getattr(msg, field), ints=False))


def _stamp(job: pb.Job, field: str, t: float | None) -> None:
    if t is not None:  # (what Timestamp.FromNanoseconds does, without its Python call)
        stamp = getattr(job, field)
        stamp.seconds, stamp.nanos = divmod(int(t * 1e9), 1_000_000_000)


def job_message(row: dict) -> pb.Job:
    """A Job message from store columns (JSON text, epoch seconds)."""
    job = pb.Job(id=row["id"], organization_id=row.get("organization_id") or "", queue_name=row["queue_name"],
                 status=STATUSES.get(row.get("status") or "", pb.JOB_STATUS_UNSPECIFIED),
                 retry_count=row.get("retry_count") or 0, max_retries=row.get("max_retries") or 0,
                 last_error=row.get("last_error") or "", priority=row.get("priority") or 0,
                 timeout_seconds=row.get("timeout_seconds") or 0,
                 assigned_worker_id=row.get("assigned_worker_id") or "",
                 idempotency_key=row.get("idempotency_key") or "", lease_id=row.get("lease_id") or "")
    for field in ("payload", "result"):
        s = struct_from_json(row.get(field))
        if s is not None:
            getattr(job, field).CopyFrom(s)
    for field in ("created_at", "scheduled_at", "started_at", "completed_at", "lease_expires_at"):
        _stamp(job, field, row.get(field))
    return job


def _settlement_ids(req) -> None:
    if not req.job_id:
        raise _invalid("Job ID is required")
    if not req.worker_id:
        raise _invalid("Worker ID is required")
    if not req.lease_id:
        raise _invalid("lease_id is required for job settlement")


def _inband(code: str, message: str) -> pb.ProcessResponse:
    return pb.ProcessResponse(error=pb.ErrorResponse(code=code, message=message))


def _status_text(code: grpc.StatusCode, message: str) -> str:
    """A status as the real server prints one into an in-band error (its Rust library's wording)."""
    described = {SC.RESOURCE_EXHAUSTED: "Some resource has been exhausted"}.get(code, code.name)
    return f"status: '{described}', self: {orjson.dumps(message).decode()}"


# ------------------------------------------------------------------ the services
class _Drawn:
    """Marks the thread's call as delayed while inside (a plain class: a generator-based context manager
    costs several calls more, on every unary call)."""

    __slots__ = ("local",)

    def __init__(self, local: threading.local):
        self.local = local

    def __enter__(self) -> None:
        self.local.delayed = True

    def __exit__(self, *exc: object) -> None:
        self.local.delayed = False


class Backend:
    """The operations both services share: auth, limits, faults, and one method per RPC body."""

    def __init__(self, store: Store, cfg, faults, limiter=None, events=None, stream_limit: int = STREAM_LIMIT,
                 stream_poll: float = STREAM_POLL_INTERVAL):
        self.store, self.cfg, self.faults, self.limiter = store, cfg, faults, limiter
        self.events = events  # the REST app's realtime.Broadcaster (the store announces what changes here too)
        self.stream_limit, self.stream_poll = stream_limit, stream_poll
        self._streams: dict[str, int] = {}
        self._streams_lock = threading.Lock()
        self._local = threading.local()  # .delayed: this thread's call already waited out its delay
        self._drawn = _Drawn(self._local)

    # -- the wire server's delays (grpc_wire.Delays) --
    def active(self) -> bool:
        return self.faults.delays()

    def draw(self, metadata: tuple) -> float:
        key = self._key_of({k.lower(): v for k, v in metadata})
        if not key:
            return 0.0
        try:
            org = key_context(self.store, key, time.time()).org
        except Exception:  # refused (or the store failed): the call itself says so, at once
            return 0.0
        return self.faults.draw_delay(org)

    def drawn(self) -> _Drawn:
        """`with backend.drawn():` this thread's call has waited out its delay (admit draws no second one)."""
        return self._drawn

    def open_stream(self, org: str, context) -> None:
        """Count one more open stream of `org` until the call ends; past the limit, RESOURCE_EXHAUSTED."""
        with self._streams_lock:
            if self._streams.get(org, 0) >= self.stream_limit:
                raise GrpcError(SC.RESOURCE_EXHAUSTED, f"Stream limit reached: at most {self.stream_limit} open "
                                "streams per organization", "RATE_LIMIT_EXCEEDED")
            self._streams[org] = self._streams.get(org, 0) + 1
        done = threading.Event()

        def close() -> None:
            if done.is_set():
                return
            done.set()
            with self._streams_lock:
                self._streams[org] -= 1

        if not context.add_callback(close):  # the call already ended
            close()

    def open_streams(self, org: str) -> int:
        with self._streams_lock:
            return self._streams.get(org, 0)

    def key_still_valid(self, context) -> KeyContext:
        """The per-turn re-check a stream makes: the key must still name an organization."""
        try:
            return self.authenticate(context)
        except GrpcError:
            raise GrpcError(SC.UNAUTHENTICATED, "API key revoked or expired", "UNAUTHENTICATED") from None

    def rate_limit(self, org: str) -> None:
        if self.limiter is not None:
            try:
                self.limiter.take(org)
            except HttpError:
                raise GrpcError(SC.RESOURCE_EXHAUSTED, "Rate limit exceeded", "RATE_LIMIT_EXCEEDED") from None

    def authenticate(self, context) -> KeyContext:
        """Who the call's API key is (a JWT is not accepted on gRPC, as on the server); checked again on
        every message of a stream, so a revoked or expired key stops it at once."""
        key = self._key_of({k.lower(): v for k, v in context.invocation_metadata()})
        if not key:
            raise GrpcError(SC.UNAUTHENTICATED, "Missing x-api-key or authorization header", "UNAUTHENTICATED")
        try:
            return key_context(self.store, key, time.time())
        except HttpError as e:
            raise GrpcError(SC.UNAUTHENTICATED, e.body["message"], "UNAUTHENTICATED") from None

    @staticmethod
    def _key_of(md: dict) -> str | None:
        key = md.get("x-api-key")
        if key is None:
            auth = md.get("authorization", "")
            key = auth[7:].strip() if auth.lower().startswith("bearer ") else (auth.strip() or None)
        return key

    def check_scope(self, key: KeyContext, msg) -> None:
        """A queue-scoped key stays in its queues, as on REST: another queue is PERMISSION_DENIED; a job or
        worker of another queue is NOT_FOUND, as one that does not exist."""
        if key.unrestricted:
            return
        queue = getattr(msg, "queue_name", "")
        if queue and not key.can_access(queue):
            raise GrpcError(SC.PERMISSION_DENIED, f"API key does not have permission for queue '{queue}'",
                            "PERMISSION_DENIED")
        job_id = getattr(msg, "job_id", "")
        if job_id and not job_in_scope(self.store, key, key.org, job_id):
            raise GrpcError(SC.NOT_FOUND, NOT_OWNED if hasattr(msg, "lease_id") else "Job not found", "NOT_FOUND")
        worker_id = getattr(msg, "worker_id", "")
        if worker_id and not job_id and not queue and not worker_in_scope(self.store, key, key.org, worker_id):
            raise GrpcError(SC.NOT_FOUND, "Worker not found", "NOT_FOUND")

    def admit(self, org: str) -> bool:
        """Rate limit, then the delay and 503 faults; returns whether this answer is to be cut."""
        self.rate_limit(org)
        return self.admit_faults(org)

    def admit_faults(self, org: str) -> bool:
        """The delay and 503 faults; returns whether this answer is to be cut."""
        if not self.faults.active(org):
            return False
        try:
            self.faults.before(org, delayed=getattr(self._local, "delayed", False))
        except HttpError as e:
            raise GrpcError(SC.UNAVAILABLE, e.body["message"]) from None
        return self.faults.should_cut(org)

    # -- queue --
    def enqueue(self, org: str, req: pb.EnqueueRequest) -> pb.EnqueueResponse:
        check_queue_name(req.queue_name)
        if not -100 <= req.priority <= 100:
            raise _invalid("priority must be between -100 and 100")
        payload = json_from_struct(req, "payload") or "{}"
        if len(payload.encode()) > self.cfg.max_payload_bytes:
            raise _invalid(f"payload exceeds maximum ({self.cfg.max_payload_bytes} bytes)")
        j = {"queue_name": req.queue_name, "payload": payload, "priority": req.priority,
             "max_retries": max(0, min(100, req.max_retries)) if req.max_retries > 0 else None,
             "timeout_seconds": min(86400, req.timeout_seconds) if req.timeout_seconds > 0 else None,
             "scheduled_at": req.scheduled_at.ToNanoseconds() / 1e9 if req.HasField("scheduled_at") else None,
             "idempotency_key": req.idempotency_key or None, "tags": dumps(dict(req.tags)) if req.tags else None}
        jid, created = self.store.create_job(org, j)
        return pb.EnqueueResponse(job_id=jid, created=created)

    def claim(self, org: str, queue: str, worker_id: str, lease: int, limit: int) -> list[pb.Job]:
        """Unary Dequeue's claim: the queue name and worker id are checked first."""
        check_grpc_queue(queue)
        if not worker_id:
            raise _invalid("Worker ID is required")
        return self.claim_unchecked(org, queue, worker_id, lease, limit)

    def claim_unchecked(self, org: str, queue: str, worker_id: str, lease: int, limit: int) -> list[pb.Job]:
        rows = self.store.claim_raw(org, queue, worker_id, limit, clamp_lease(lease))
        return [job_message(r) for r in rows]

    def complete(self, org: str, req: pb.CompleteRequest) -> pb.CompleteResponse:
        _settlement_ids(req)
        result = json_from_struct(req, "result")
        if result is not None and len(result.encode()) > MAX_RESULT_BYTES:
            raise _invalid(f"Result too large: {len(result.encode())} bytes (max: {MAX_RESULT_BYTES} bytes)")
        self.store.complete(org, req.job_id, req.worker_id, req.lease_id, result)
        return pb.CompleteResponse(success=True)

    def fail(self, org: str, req: pb.FailRequest) -> pb.FailResponse:
        _settlement_ids(req)
        error = cut_error(req.error) or "Job failed"
        retry = req.retry if req.HasField("retry") else True
        will_retry, delay = self.store.fail_job(org, req.job_id, req.worker_id, req.lease_id, error, retry=retry,
                                                count_dead=True)
        return pb.FailResponse(success=True, will_retry=will_retry, next_retry_delay_secs=int(delay))

    def renew(self, org: str, req: pb.RenewLeaseRequest) -> pb.RenewLeaseResponse:
        _settlement_ids(req)
        secs = clamp_lease(req.extension_secs)
        self.store.renew_lease(org, req.job_id, req.worker_id, req.lease_id, secs)
        out = pb.RenewLeaseResponse(success=True)
        out.new_expires_at.FromNanoseconds(int((time.time() + secs) * 1e9))
        return out

    def get_job(self, org: str, req: pb.GetJobRequest) -> pb.GetJobResponse:
        return pb.GetJobResponse(job=job_message(self.store.job_raw(org, req.job_id)))

    def queue_stats(self, org: str, req: pb.GetQueueStatsRequest) -> pb.GetQueueStatsResponse:
        return pb.GetQueueStatsResponse(queue_name=req.queue_name, **self.store.grpc_queue_stats(org, req.queue_name))

    # -- workers --
    def register(self, org: str, req: pb.RegisterWorkerRequest) -> pb.RegisterWorkerResponse:
        check_queue_name(req.queue_name)
        hostname = check_hostname(req.hostname) if req.hostname else "unknown"
        wid = check_worker_id(req.worker_id) if req.HasField("worker_id") and req.worker_id else None
        conc = 5 if req.max_concurrency == 0 else max(1, min(1000, req.max_concurrency))
        w = {"worker_id": wid, "queue_name": req.queue_name, "hostname": hostname,
             "worker_type": req.worker_type[:50] or None, "version": req.version[:50] or None,
             "max_concurrency": conc, "metadata": dumps(dict(req.metadata))}
        wid = self.store.register_worker(org, w, self.cfg.max_workers)
        return pb.RegisterWorkerResponse(worker_id=wid, lease_duration_secs=self.cfg.lease_duration,
                                         heartbeat_interval_secs=self.cfg.heartbeat_interval)

    def heartbeat(self, org: str, req: pb.HeartbeatRequest) -> pb.HeartbeatResponse:
        status = req.status or "healthy"
        if status not in WORKER_STATUSES:
            raise _invalid("status must be one of healthy, degraded, draining, offline")
        meta = dumps(dict(req.metadata)) if req.metadata else None
        acked, drain = self.store.heartbeat_sticky(org, req.worker_id, max(0, req.current_jobs), status, meta)
        return pb.HeartbeatResponse(acknowledged=acked, should_drain=drain)

    def deregister(self, org: str, req: pb.DeregisterRequest) -> pb.DeregisterResponse:
        self.store.deregister_worker(org, req.worker_id)
        return pb.DeregisterResponse(success=True)


def _run(fn: Callable, job_route: bool = False):
    """Call `fn`, turning the store's outcomes into GrpcError."""
    try:
        return fn()
    except GrpcError:
        raise
    except HttpError as e:
        raise from_api_error(e, job_route) from None
    except sqlite3.Error as e:
        print(f"warning: database error on a gRPC call: {e}", file=sys.stderr, flush=True)
        raise GrpcError(SC.INTERNAL, "A database error occurred") from None


def unary(body: Callable, job_route: bool = False) -> Callable:
    """A servicer method: authenticate, admit, run `body(org, request)`, map errors to a status."""

    def method(self, request, context):
        try:
            key = self.backend.authenticate(context)
            org = key.org
            cut = self.backend.admit(org)
            self.backend.check_scope(key, request)
            answer = _run(lambda: body(self.backend, org, request), job_route)
            if cut:  # injected fault: the write happened, the client never sees the answer
                raise GrpcError(SC.UNAVAILABLE, "Injected fault: connection cut after handling")
            return answer
        except GrpcError as e:
            context.abort(e.code, e.message)
        except Exception as e:  # never a stack trace to the client
            print(f"warning: internal error on a gRPC call: {e!r}", file=sys.stderr, flush=True)
            context.abort(SC.INTERNAL, "An internal error occurred")

    return method


class QueueService(pb_grpc.QueueServiceServicer):
    def __init__(self, backend: Backend):
        self.backend = backend

    Enqueue = unary(Backend.enqueue)
    Complete = unary(Backend.complete, job_route=True)
    Fail = unary(Backend.fail, job_route=True)
    RenewLease = unary(Backend.renew, job_route=True)
    GetJob = unary(Backend.get_job)
    GetQueueStats = unary(Backend.queue_stats)
    Dequeue = unary(lambda b, org, r: pb.DequeueResponse(
        jobs=b.claim(org, r.queue_name, r.worker_id, r.lease_duration_secs, max(1, min(100, r.batch_size)))))

    def StreamJobs(self, request: pb.StreamJobsRequest, context) -> Iterator[pb.Job]:
        """Checked as the real server checks (key, rate limit, queue name, worker id), then counted
        against the organization's open streams; errors end the stream with their status."""
        try:
            key = self.backend.authenticate(context)
            self.backend.admit(key.org)
            check_grpc_queue(request.queue_name)
            if not request.worker_id:
                raise _invalid("Worker ID is required")
            self.backend.check_scope(key, request)
            self.backend.open_stream(key.org, context)
            yield from JobStream(self.backend, key.org, request, context).run()
        except GrpcError as e:
            context.abort(e.code, e.message)

    def ProcessJobs(self, request_iterator, context) -> Iterator[pb.ProcessResponse]:
        """Each message: the key re-checked (refused: in-band UNAUTHENTICATED, then the stream ends),
        the rate limit (in-band RATE_LIMIT_EXCEEDED, the stream goes on), then its one answer."""
        try:
            first = self.backend.authenticate(context)
            self.backend.open_stream(first.org, context)
        except GrpcError as e:
            context.abort(e.code, e.message)
        for msg in request_iterator:
            try:
                key = self.backend.key_still_valid(context)
                org = key.org
            except GrpcError as e:
                yield _inband(e.inband, e.message)
                return
            try:
                self.backend.rate_limit(org)
            except GrpcError as e:
                yield _inband("RATE_LIMIT_EXCEEDED", _status_text(e.code, e.message))
                continue
            try:
                cut = self.backend.admit_faults(org)
            except GrpcError as e:  # the injected 503 ends the stream, as a proxy would
                context.abort(e.code, e.message)
            try:
                which = msg.WhichOneof("request")
                if which is not None:
                    self.backend.check_scope(key, getattr(msg, which))
            except GrpcError as e:  # outside a scoped key's queues: this message's answer, the stream goes on
                yield _inband(e.inband, e.message)
                continue
            answer = self.process_one(org, msg)
            if cut:
                context.abort(SC.UNAVAILABLE, "Injected fault: connection cut after handling")
            yield answer

    def process_one(self, org: str, msg: pb.ProcessRequest) -> pb.ProcessResponse:
        """One ProcessJobs message -> its one answer (an ErrorResponse for any refusal)."""
        b = self.backend
        which = msg.WhichOneof("request")
        try:
            if which == "dequeue":
                d = msg.dequeue
                if not d.worker_id:
                    raise _invalid("Worker ID is required")
                jobs = _run(lambda: b.claim_unchecked(org, d.queue_name, d.worker_id, d.lease_duration_secs, 1))
                if not jobs:
                    return _inband("NO_JOBS", "No jobs available")
                return pb.ProcessResponse(job=jobs[0])
            if which == "complete":
                return pb.ProcessResponse(complete=_run(lambda: b.complete(org, _lenient(msg.complete)), True))
            if which == "fail":
                return pb.ProcessResponse(fail=_run(lambda: b.fail(org, _lenient(msg.fail)), True))
            if which == "renew_lease":
                return pb.ProcessResponse(renew_lease=_run(lambda: b.renew(org, _lenient(msg.renew_lease)), True))
            return _inband("INVALID_REQUEST", "Empty request")
        except GrpcError as e:
            return _inband(e.inband, e.message)
        except Exception as e:
            print(f"warning: internal error on ProcessJobs: {e!r}", file=sys.stderr, flush=True)
            return _inband("INTERNAL", "An internal error occurred")


def _lenient(req):
    """A ProcessJobs settlement: the real server checks only its lease_id up front; a missing job or
    worker id then matches no job (NOT_FOUND), so any such id is left to the store to miss."""
    if not req.lease_id:
        raise _invalid("lease_id is required for job settlement")
    if req.job_id and req.worker_id:
        return req
    out = type(req)()
    out.CopyFrom(req)
    out.job_id, out.worker_id = out.job_id or "-", out.worker_id or "-"
    return out


class JobStream:
    """One StreamJobs call, on the real server's clock: a turn every `stream_poll` seconds at most.

    Each turn re-checks the key (revoked: UNAUTHENTICATED) and the rate limit (RESOURCE_EXHAUSTED),
    then claims one job if the stream holds none, or else sleeps a full interval: while the queue is
    empty, and while the job it handed out is still processing under its lease. A settlement, an
    enqueue or a due retry is noticed at the next turn, never sooner. Only the client going away cuts a
    sleep short; a job claimed just as it went is not handed back and stays leased until it expires."""

    def __init__(self, backend: Backend, org: str, request: pb.StreamJobsRequest, context):
        self.backend, self.store, self.org, self.req, self.context = backend, backend.store, org, request, context
        self.gone = threading.Event()
        context.add_callback(self.gone.set)  # a cancelled stream wakes its sleeping thread
        self.held: tuple[str, str] | None = None  # (job id, lease id) of the job out with the client

    def run(self) -> Iterator[pb.Job]:
        while self.context.is_active() and not self.gone.is_set():
            self.backend.key_still_valid(self.context)
            self.backend.rate_limit(self.org)
            if self.held is not None and self._still_out(*self.held):
                self.gone.wait(self.backend.stream_poll)
                continue
            self.held = None
            jobs = _run(lambda: self.backend.claim_unchecked(self.org, self.req.queue_name, self.req.worker_id,
                                                             self.req.lease_duration_secs, 1))
            if not jobs:
                self.gone.wait(self.backend.stream_poll)
                continue
            self.held = (jobs[0].id, jobs[0].lease_id)
            yield jobs[0]

    def _still_out(self, job_id: str, lease_id: str) -> bool:
        state = self.store.lease_state(self.org, job_id)
        return (state is not None and state[0] == "processing" and state[1] == lease_id
                and (state[2] or 0) > time.time())


class WorkerService(pb_grpc.WorkerServiceServicer):
    def __init__(self, backend: Backend):
        self.backend = backend

    Register = unary(Backend.register)
    Heartbeat = unary(Backend.heartbeat)
    Deregister = unary(Backend.deregister)


def make_grpc_server(store: Store, cfg, faults, limiter, host: str, port: int, max_streams: int = 256,
                     events=None, stream_limit: int = STREAM_LIMIT,
                     stream_poll: float = STREAM_POLL_INTERVAL, implementation: str = "wire"):
    """A started gRPC server on host:port (0 = a free port); returns it and the port it got. Either way
    it has `stop(grace)` returning an event to wait on.

    `implementation`: "wire" (the default: our own HTTP/2, `grpc_wire`) or "grpcio" (grpcio's server).
    Every open stream holds one pool thread: at most `max_streams` streaming RPCs run at once (others wait),
    which must stay above `stream_limit` (open streams per organization); with grpcio its unary calls in
    flight take pool threads too (with "wire" they run on the I/O thread)."""
    backend = Backend(store, cfg, faults, limiter, events, stream_limit, stream_poll)
    if implementation == "wire":
        from .grpc_wire import WireGrpcServer

        wire = WireGrpcServer({"QueueService": QueueService(backend), "WorkerService": WorkerService(backend)},
                              backend, max_streams=max_streams)
        try:
            bound = wire.listen(host, port)
        except OSError as e:
            raise OSError(e.strerror or str(e)) from None
        wire.start()
        return wire, bound
    server = grpc.server(ThreadPoolExecutor(max_workers=max_streams, thread_name_prefix="devserver-grpc"),
                         options=[("grpc.max_receive_message_length", MAX_MESSAGE),
                                  ("grpc.max_send_message_length", MAX_MESSAGE),
                                  ("grpc.keepalive_time_ms", 10_000), ("grpc.keepalive_timeout_ms", 20_000),
                                  ("grpc.max_concurrent_streams", 200),
                                  ("grpc.http2.min_ping_interval_without_data_ms", 5_000)])
    pb_grpc.add_QueueServiceServicer_to_server(QueueService(backend), server)
    pb_grpc.add_WorkerServiceServicer_to_server(WorkerService(backend), server)
    bound = server.add_insecure_port(f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
    if bound == 0:
        raise OSError(f"cannot listen for gRPC on {host}:{port}")
    server.start()
    return server, bound
