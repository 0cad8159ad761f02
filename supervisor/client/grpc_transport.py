"""The daemon's gRPC `Transport` (supervisor.client.transport), beside REST's SpooledAPI + LoopHTTP.

`GrpcAPI` builds calls with the same methods and arguments as `SpooledAPI` (`register_call`,
`heartbeat_call`, `claim_call`, `complete_call`, `fail_call`, `renew_lease_call`, blocking
`deregister`); `LoopGrpc` runs them with the same interface as `LoopHTTP` (`submit`, `done`,
`expire`, `next_deadline`, `on_ready`, `close`, `has_answers`) and answers with the same results and
typed errors (`supervisor.client.calls`), so the parent stays transport-agnostic.

Design, for the parent's single select() loop:
- Two shapes (`mode`), measured by benchmarks/bench_grpc.py. `unary` (the default): every call is
  its own RPC (`future()`), concurrent on the one HTTP/2 connection; a claim for N idle children is
  one `Dequeue(batch_size=N)`. `stream`: claims, completes, fails and renewals go in-band on one
  `ProcessJobs` stream (a claim for N is N `dequeue` messages; answers matched to requests in
  order, an in-band error carries no job id). The server answers a stream's messages one after the
  other, so with API latency L one stream settles at most 1/L jobs per second whatever --procs is,
  and its per-job claims cost more CPU than one batched Dequeue: `stream` is only ahead for a single
  child on a fast link. Register and heartbeat are unary in both.
- Two clients (`engine`). `wire` (the default): unary calls are HTTP/2 frames the loop writes and reads
  itself on one non-blocking socket registered in its selector (`supervisor.client.h2grpc`; its events
  come back through `on_ready`); no thread, and a fraction of grpcio's CPU per call. `grpcio`: its
  channel and futures; gRPC's threads (the futures' callbacks, the stream's reader) only append events
  to a deque and write one byte to the loop's wake-up fd; all state changes happen on the loop thread
  in `expire` and `done`. The ProcessJobs stream always goes through grpcio.
- The channel is created on the first call, i.e. after the forkserver started: children never hold
  gRPC state and never import grpc (this module imports grpc only inside functions).
- Settlements whose answer was lost (UNAVAILABLE, a deadline, a broken stream) are remembered by job
  id: when one is sent again (by the parent's retry, or re-sent first on a reopened stream) and the
  server answers NOT_FOUND, that counts as done (the first copy was applied). A broken stream is
  reopened with back-off; its unanswered dequeues are not re-sent (they may have leased a job, which
  comes back when that lease runs out, as with a cut REST claim).
- Struct numbers arrive as doubles: whole numbers below 2**53 in a payload become `int` again
  before the handler sees them (so 5.0 sent by a producer also arrives as 5); integers of 2**53 or
  more were already rounded by the sender's Struct. A non-object payload arrives as None. A result
  that is not a JSON object cannot travel over gRPC: without a REST fallback the complete is refused
  (`Rejected`), which makes the parent fail the job with a clear error.
- With a REST API (`GrpcAPI(rest=SpooledAPI)`, which make_transport builds from cfg.api_url), a
  complete or fail that gRPC could not deliver (Unavailable) goes out once more over REST on a
  LoopHTTP of its own (a 409 "already completed" there, after a lost gRPC answer, counts as done),
  and a result gRPC cannot carry (not a JSON object) is delivered over REST, exactly.
- TLS unless the host is loopback; `ca_bundle` replaces the system roots.
"""

from __future__ import annotations

import collections
import math
import os
import queue
import selectors
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from supervisor import __version__
from supervisor.backoff import backoff
from supervisor.client.calls import (
    AlreadyFinished,
    ApiError,
    Conflict,
    LeaseLost,
    QuotaExceeded,
    RateLimited,
    Rejected,
    Secret,
    Unauthorized,
    Unavailable,
)
from supervisor.client.events import Resolver
from supervisor.client.hosts import is_loopback
from supervisor.client.rest import SpooledAPI
from supervisor.client.transport import EventsSource, LoopTransport
from supervisor.proto.structs import plain_struct

INSTALL_HINT = "--transport grpc needs the grpc extra: pip install 'spooled-supervisor[grpc]'"
DEFAULT_GRPC_URL = "grpc.spooled.cloud:443"
MAX_MESSAGE = 4 * 1024 * 1024
STREAM_KINDS = ("claim", "complete", "fail", "renew")
UNARY_ROUTES = {"register": "Register", "heartbeat": "Heartbeat"}
JOB_UNARY = {"claim": ("Dequeue", "dequeue"), "complete": ("Complete", "complete"), "fail": ("Fail", "fail"),
             "renew": ("RenewLease", "renew_lease")}
# the unary calls the loop makes on its own HTTP/2 connection: kind -> (path, answer message name)
WIRE_PATHS = {"claim": ("/spooled.v1.QueueService/Dequeue", "DequeueResponse"),
              "complete": ("/spooled.v1.QueueService/Complete", "CompleteResponse"),
              "fail": ("/spooled.v1.QueueService/Fail", "FailResponse"),
              "renew": ("/spooled.v1.QueueService/RenewLease", "RenewLeaseResponse"),
              "register": ("/spooled.v1.WorkerService/Register", "RegisterWorkerResponse"),
              "heartbeat": ("/spooled.v1.WorkerService/Heartbeat", "HeartbeatResponse")}
ENGINES = ("wire", "grpcio")
LAZY_KINDS = ("complete", "fail")  # calls whose answers may wait for the loop's next turn (see _pace_reads)
LAZY_READ = 0.1  # seconds such an answer waits unread at most
RESEND_UNPROCESSED = 3  # times a call the server never acted on is sent again before its error is the answer
MAX_DETAILS = 500  # characters of a server's grpc-message kept in an error
# a settlement ending so says nothing of what became of it (a reset, a proxy's error): it may have been applied
MAYBE_APPLIED = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED", "INTERNAL", "UNKNOWN", "CANCELLED", "DATA_LOSS"})


class GrpcMissing(ImportError):
    """grpcio / protobuf are not installed; str() is the one line to show."""


def require_grpc() -> None:
    """Raise GrpcMissing (with INSTALL_HINT) unless grpcio, hpack and the stubs import."""
    try:
        import grpc  # noqa: F401
        import hpack  # noqa: F401

        from supervisor.proto import spooled_pb2, spooled_pb2_grpc  # noqa: F401
    except ImportError as exc:
        raise GrpcMissing(f"{INSTALL_HINT} ({exc})") from None


def parse_grpc_url(url: str) -> tuple[str, str, bool]:
    """`host:port` (optionally with a grpc://, grpcs:// or https:// prefix) -> (target, host, tls).

    TLS unless the host is loopback. Without a port: 443 (50051 on loopback)."""
    text = url.strip()
    for prefix in ("grpcs://", "grpc://", "https://", "http://"):
        if text.startswith(prefix):
            text = text[len(prefix):]
    text = text.rstrip("/")
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    elif text.count(":") == 1:
        host, port = text.split(":")
    else:
        host, port = text, ""
    if not host or (port and not port.isdigit()):
        raise ValueError(f"gRPC URL must be host:port, got {url!r}")
    local = is_loopback(host)
    port = port or ("50051" if local else "443")
    target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return target, host, not local


# ------------------------------------------------------------------ conversions
_SECONDS: dict[int, str] = {}  # whole seconds -> "YYYY-MM-DDTHH:MM:SS." (a job's times repeat a few seconds)


def _rfc3339(ts: Any) -> str | None:
    seconds, nanos = ts.seconds, ts.nanos
    if seconds == 0 and nanos == 0:
        return None
    head = _SECONDS.get(seconds)
    if head is None:
        if len(_SECONDS) >= 256:
            _SECONDS.clear()
        g = time.gmtime(seconds)
        head = _SECONDS[seconds] = (f"{g.tm_year:04d}-{g.tm_mon:02d}-{g.tm_mday:02d}T{g.tm_hour:02d}:{g.tm_min:02d}:"
                                    f"{g.tm_sec:02d}.")
    return f"{head}{nanos // 1000:06d}Z"


def job_dict(job: Any) -> dict:
    """A Job message shaped like a REST claim answer (payload a dict with ints restored, or None)."""
    payload = plain_struct(job.payload, ints=True) if job.HasField("payload") else None
    return {"id": job.id, "queue_name": job.queue_name, "payload": payload, "retry_count": job.retry_count,
            "max_retries": job.max_retries, "timeout_seconds": job.timeout_seconds, "lease_id": job.lease_id,
            "lease_expires_at": _rfc3339(job.lease_expires_at), "priority": job.priority,
            "created_at": _rfc3339(job.created_at)}


def _str_map(metadata: dict | None) -> dict[str, str]:
    """gRPC metadata maps hold strings: other values go as their JSON text (3 -> "3", {..} -> "{..}")."""
    import orjson

    return {str(k): v if isinstance(v, str) else orjson.dumps(v, default=str).decode()
            for k, v in (metadata or {}).items()}


# ------------------------------------------------------------------ errors
def map_status(code: Any, message: str, job_route: bool) -> ApiError:
    """A gRPC status -> the typed error the parent acts on (as `rest.classify` does for HTTP)."""
    import grpc

    sc = grpc.StatusCode
    name = code.name if code is not None else "UNKNOWN"
    if code == sc.UNAUTHENTICATED:
        return Unauthorized(401, name, message)
    if code == sc.RESOURCE_EXHAUSTED:
        if "limit reached" in message.lower():
            return QuotaExceeded(429, name, message)
        return RateLimited(429, name, message)
    if code in (sc.INVALID_ARGUMENT, sc.OUT_OF_RANGE):
        return Rejected(400, name, message)
    if code == sc.PERMISSION_DENIED:
        return Rejected(403, name, message)
    if code == sc.UNIMPLEMENTED:
        return Rejected(501, name, message)
    if code == sc.NOT_FOUND:
        return LeaseLost(404, name, message) if job_route else Rejected(404, name, message)
    if code == sc.FAILED_PRECONDITION and job_route:
        if message.startswith("Job is already"):
            return AlreadyFinished(409, name, message)
        return LeaseLost(409, "LEASE_EXPIRED", message)
    if code in (sc.ALREADY_EXISTS, sc.FAILED_PRECONDITION, sc.ABORTED):
        return Conflict(409, name, message)
    return Unavailable(503 if code == sc.UNAVAILABLE else 0, name, message or "gRPC call failed")


_INBAND = {"UNAUTHENTICATED": (Unauthorized, 401), "RATE_LIMIT_EXCEEDED": (RateLimited, 429),
           "LEASE_EXPIRED": (LeaseLost, 409), "NOT_FOUND": (LeaseLost, 404), "INVALID_ARGUMENT": (Rejected, 400),
           "INVALID_REQUEST": (Rejected, 400), "PERMISSION_DENIED": (Rejected, 403)}


def map_inband(code: str, message: str) -> ApiError:
    """A ProcessJobs ErrorResponse -> typed error (INTERNAL and unknown codes are worth a retry)."""
    cls, status = _INBAND.get(code, (Unavailable, 500))
    return cls(status, code, message)


# ------------------------------------------------------------------ calls
@dataclass
class GrpcCall:
    """One API request for the loop: a unary RPC, or `count` ProcessJobs messages of one kind."""

    kind: str  # register, heartbeat, claim, complete, fail, renew
    route: str  # the REST route name, for metrics
    message: object = None  # the request proto (wrapped in a ProcessRequest on the ProcessJobs stream)
    count: int = 1
    job_id: str = ""
    job_route: bool = False
    error: ApiError | None = None  # refused before sending
    answer: Callable | None = None  # the proto answer -> the result the parent sees
    rest_call: Callable[[], object] | None = None  # the same settlement as a REST Call (the fallback)
    rest_only: bool = False  # cannot travel over gRPC (a non-object result): send it over REST
    fell_back: bool = False


class GrpcAPI:
    """The gRPC `Transport`: builds `GrpcCall`s with SpooledAPI's signatures; owns the (lazy) channel. The key
    lives only in the call metadata; it never appears in a repr, a log line or an exception."""

    def __init__(self, url: str, api_key: Secret, timeout: float = 10.0, ca_bundle: str | None = None,
                 on_request: Callable[[str, int, float], None] | None = None, rest: SpooledAPI | None = None,
                 engine: str = "wire"):
        self.target, self.host, self.tls = parse_grpc_url(url)
        self.rest = rest  # REST for settlements gRPC cannot carry or deliver right now (None: no fallback)
        self.base_url = f"grpc{'s' if self.tls else ''}://{self.target}"
        self.timeout = timeout
        self.ca_bundle = ca_bundle
        self.on_request = on_request
        self._key = api_key
        self.engine = engine  # how LoopGrpc sends unary calls (ENGINES)
        self._channel: Any = None
        self.queue_stub: Any = None
        self.worker_stub: Any = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"GrpcAPI({self.base_url!r})"

    @property
    def metadata(self) -> tuple:
        return (("x-api-key", self._key.value),)

    def connect(self) -> None:
        """Create the channel and stubs once (first use: after the forkserver started)."""
        with self._lock:
            if self._channel is not None:
                return
            import grpc

            from supervisor.proto import spooled_pb2_grpc as pb_grpc

            options = [("grpc.max_receive_message_length", MAX_MESSAGE), ("grpc.max_send_message_length", MAX_MESSAGE),
                       ("grpc.keepalive_time_ms", 20_000), ("grpc.keepalive_timeout_ms", 10_000),
                       # reconnect soon after an outage (grpc's default back-off grows to 120 s); the parent
                       # paces its own retries
                       ("grpc.initial_reconnect_backoff_ms", 250), ("grpc.min_reconnect_backoff_ms", 250),
                       ("grpc.max_reconnect_backoff_ms", 5_000),
                       ("grpc.primary_user_agent", f"spooled-supervisor/{__version__}")]
            if self.tls:
                roots = None
                if self.ca_bundle:
                    with open(self.ca_bundle, "rb") as f:
                        roots = f.read()
                creds = grpc.ssl_channel_credentials(root_certificates=roots)
                self._channel = grpc.secure_channel(self.target, creds, options=options)
            else:
                self._channel = grpc.insecure_channel(self.target, options=options)
            self.queue_stub = pb_grpc.QueueServiceStub(self._channel)
            self.worker_stub = pb_grpc.WorkerServiceStub(self._channel)

    def wire_tls(self) -> Any:
        """The TLS context for the loop's own connection (ALPN h2; `ca_bundle` replaces the system roots),
        or None on loopback."""
        if not self.tls:
            return None
        import ssl

        ctx = ssl.create_default_context(cafile=self.ca_bundle) if self.ca_bundle else ssl.create_default_context()
        ctx.set_alpn_protocols(["h2"])
        return ctx

    def loop_client(self, sel: selectors.BaseSelector, wake_fd: int, max_connections: int = 4,
                    mode: str = "unary", engine: str | None = None) -> LoopGrpc:
        """The parent loop's transport for these calls (see supervisor.client.transport); with `self.rest`,
        REST settlements go out on a LoopHTTP registered in `sel` (pass its events to on_ready). gRPC
        multiplexes every call on one connection, so `max_connections` does not apply."""
        return LoopGrpc(self, sel, wake_fd, mode=mode, engine=engine or self.engine)

    def events_source(self, loop: LoopTransport, wake_fd: int) -> EventsSource | None:
        """gRPC has no events stream: listen over the REST API beside it (`self.rest`, from --api-url), whose
        addresses a `Resolver` looks up on a helper thread; None without one."""
        if self.rest is None:
            return None
        return EventsSource(self.rest, Resolver(self.rest.host, self.rest.port, wake_fd))

    def close(self) -> None:
        with self._lock:
            if self._channel is not None:
                self._channel.close()
                self._channel = None

    # -- worker calls --
    def register_call(self, queue: str, worker_id: str, hostname: str, max_concurrency: int,
                      metadata: dict, queue_names: list[str] | None = None) -> GrpcCall:
        """Register takes one queue over gRPC: further queues travel in metadata["queue_names"] (JSON)."""
        from supervisor.proto import spooled_pb2 as pb

        meta = dict(metadata or {})
        if queue_names:
            meta["queue_names"] = list(queue_names)
        msg = pb.RegisterWorkerRequest(queue_name=queue, hostname=hostname, worker_type="spooled-supervisor",
                                       max_concurrency=max(1, min(1000, max_concurrency)), version=__version__,
                                       metadata=_str_map(meta), worker_id=worker_id)
        return GrpcCall("register", "register", msg, answer=lambda r: {
            "id": r.worker_id, "worker_id": r.worker_id, "lease_duration_secs": r.lease_duration_secs,
            "heartbeat_interval_secs": r.heartbeat_interval_secs})

    def heartbeat_call(self, worker_id: str, current_jobs: int, status: str, metadata: dict | None = None,
                       cpu_percent: float | None = None, memory_percent: float | None = None) -> GrpcCall:
        """Answers {"acknowledged": True, "should_drain": bool}; an unknown worker is Rejected(404), as on REST."""
        from supervisor.proto import spooled_pb2 as pb

        meta = _str_map(metadata)
        for name, value in (("cpu_percent", cpu_percent), ("memory_percent", memory_percent)):
            if value is not None:
                meta[name] = str(value)
        msg = pb.HeartbeatRequest(worker_id=worker_id, current_jobs=max(0, min(1000, current_jobs)), status=status,
                                  metadata=meta)
        return GrpcCall("heartbeat", "worker_heartbeat", msg, answer=_heartbeat_answer)

    def get_worker_call(self, worker_id: str) -> GrpcCall:
        """The worker row (no gRPC RPC reads it): over the REST fallback, else an Unavailable answer."""
        rest = self.rest
        missing = Unavailable(0, "NO_REST", "reading a worker row needs the REST API (--api-url)")
        if rest is None:
            return GrpcCall("get_worker", "get_worker", error=missing)
        return GrpcCall("get_worker", "get_worker", error=missing, rest_only=True,
                        rest_call=lambda: rest.get_worker_call(worker_id))

    def queue_stats_call(self, queue: str) -> GrpcCall:
        """The queue's statistics with its mean processing time (gRPC's carry none): over the REST fallback,
        else an Unavailable answer."""
        rest = self.rest
        missing = Unavailable(0, "NO_REST", "reading a queue's processing time needs the REST API (--api-url)")
        if rest is None:
            return GrpcCall("queue_stats", "queue_stats", error=missing)
        return GrpcCall("queue_stats", "queue_stats", error=missing, rest_only=True,
                        rest_call=lambda: rest.queue_stats_call(queue))

    def deregister(self, worker_id: str, timeout: float | None = None) -> None:
        """Blocking and bounded by `timeout` (else the API timeout); raises the typed ApiError."""
        import grpc

        from supervisor.proto import spooled_pb2 as pb

        self.connect()
        started = time.monotonic()
        status = 0
        try:
            self.worker_stub.Deregister(pb.DeregisterRequest(worker_id=worker_id), metadata=self.metadata,
                                        timeout=timeout or self.timeout)
            status = 200
        except grpc.RpcError as exc:
            err = map_status(exc.code(), exc.details() or "", False)
            status = err.status
            raise err from None
        finally:
            if self.on_request is not None:
                self.on_request("deregister", status, time.monotonic() - started)

    # -- job calls (in-band on the ProcessJobs stream) --
    def claim_call(self, queue: str, worker_id: str, limit: int, lease_secs: int) -> GrpcCall:
        from supervisor.proto import spooled_pb2 as pb

        msg = pb.DequeueRequest(queue_name=queue, worker_id=worker_id, lease_duration_secs=lease_secs, batch_size=1)
        return GrpcCall("claim", "claim", msg, count=max(1, min(100, limit)))

    def complete_call(self, job_id: str, worker_id: str, lease_id: str, result: Any) -> GrpcCall:
        from supervisor.proto import spooled_pb2 as pb

        req = pb.CompleteRequest(job_id=job_id, worker_id=worker_id, lease_id=lease_id)
        error = None
        if result is not None and not isinstance(result, dict):
            error = Rejected(0, "RESULT_NOT_AN_OBJECT", f"gRPC carries only JSON objects as results "
                             f"(google.protobuf.Struct); this one is a {type(result).__name__}: return a dict, "
                             "or run with --transport rest")
        elif result is not None:
            try:
                req.result.update(result)
            except (ValueError, TypeError) as exc:
                error = Rejected(0, "RESULT_NOT_STRUCT", f"the result does not fit a google.protobuf.Struct: {exc}")
        rest = self.rest
        rest_call = None if rest is None else (lambda: rest.complete_call(job_id, worker_id, lease_id, result))
        return GrpcCall("complete", "complete", req, job_id=job_id, job_route=True,
                        error=error, rest_call=rest_call, rest_only=error is not None and rest_call is not None)

    def fail_call(self, job_id: str, worker_id: str, lease_id: str, error: str) -> GrpcCall:
        from supervisor.proto import spooled_pb2 as pb

        text = self._key.scrub(error or "Job failed").encode()[:4096].decode("utf-8", "ignore")  # scrub, then cut
        # retry=True explicitly: "retry per max_retries" on every server version (on <= 0.1.115 an unset
        # retry read as false and dead-lettered)
        req = pb.FailRequest(job_id=job_id, worker_id=worker_id, error=text, lease_id=lease_id, retry=True)
        rest = self.rest
        rest_call = None if rest is None else (lambda: rest.fail_call(job_id, worker_id, lease_id, error))
        return GrpcCall("fail", "fail", req, job_id=job_id, job_route=True,
                        rest_call=rest_call)

    def renew_lease_call(self, job_id: str, worker_id: str, lease_id: str, lease_secs: int) -> GrpcCall:
        from supervisor.proto import spooled_pb2 as pb

        req = pb.RenewLeaseRequest(job_id=job_id, worker_id=worker_id, lease_id=lease_id, extension_secs=lease_secs)
        return GrpcCall("renew", "job_heartbeat", req, job_id=job_id, job_route=True)


def _unary_job_answer(kind: str, answer: Any) -> Any:
    if kind == "claim":
        return [job_dict(j) for j in answer.jobs]
    if kind == "fail":
        return {"will_retry": answer.will_retry, "next_retry_delay_secs": answer.next_retry_delay_secs}
    return None


def _heartbeat_answer(r: Any) -> dict:
    if not r.acknowledged:
        raise Rejected(404, "NOT_FOUND", "the API does not know this worker (heartbeat not acknowledged)")
    return {"acknowledged": True, "should_drain": bool(r.should_drain)}


# ------------------------------------------------------------------ the loop client
@dataclass(eq=False)
class _Pending:
    """A submitted stream call until its last answer: `left` answers still due, `jobs` got so far."""

    tag: object
    call: GrpcCall
    started: float
    deadline: float
    left: int = 0
    jobs: list = field(default_factory=list)
    error: ApiError | None = None
    resent: bool = False
    finished: bool = False


def _process_request(call: GrpcCall) -> Any:
    """A job call's request as a ProcessJobs message (batch_size 1: one dequeue message per job)."""
    from supervisor.proto import spooled_pb2 as pb

    fields: dict[str, Any] = {JOB_UNARY[call.kind][1]: call.message}
    return pb.ProcessRequest(**fields)


@dataclass(eq=False)
class _WireCall:
    """A unary call out on the loop's own HTTP/2 connection."""

    tag: object
    call: GrpcCall
    started: float
    deadline: float
    answer_type: str
    handle: Any = None
    path: str = ""
    body: bytes = b""
    resent: int = 0  # times sent again after the server said it never acted on it
    client: Any = None  # the H2Client it went out on


_CODES: dict[int, Any] = {}
_TYPES: dict[str, Any] = {}


def _answer_types() -> dict[str, Any]:
    """The answer message classes of WIRE_PATHS by name (imported once, on first use)."""
    if not _TYPES:
        from supervisor.proto import spooled_pb2 as pb

        _TYPES.update({name: getattr(pb, name) for _, name in WIRE_PATHS.values()})
    return _TYPES


def _status_code(number: int) -> Any:
    """A gRPC status number -> grpc.StatusCode (UNKNOWN for a number it does not know)."""
    if not _CODES:
        import grpc

        _CODES.update({sc.value[0]: sc for sc in grpc.StatusCode})
    return _CODES.get(number, _CODES[2])


class _Stream:
    """One ProcessJobs call: requests go through a queue the call's iterator reads; a reader thread
    turns every answer and the end into events for the loop. `sent` (loop thread only) holds the
    unanswered requests in order."""

    def __init__(self, api: GrpcAPI, emit: Callable[[tuple], None]):
        self.requests: queue.SimpleQueue = queue.SimpleQueue()
        self.sent: collections.deque = collections.deque()
        self.answered = 0
        self._emit = emit
        self.call = api.queue_stub.ProcessJobs(self._iterate(), metadata=api.metadata)
        threading.Thread(target=self._read, name="grpc-stream", daemon=True).start()

    def _iterate(self) -> Iterator[Any]:
        while True:
            msg = self.requests.get()
            if msg is None:
                return
            yield msg

    def _read(self) -> None:
        import grpc

        try:
            for answer in self.call:
                self._emit(("answer", self, answer))
            self._emit(("end", self, None))
        except grpc.RpcError as exc:
            self._emit(("end", self, exc))
        except Exception as exc:  # never lose the end of a stream
            self._emit(("end", self, exc))

    def send(self, slot: _Pending, msg: Any) -> None:
        self.sent.append(slot)
        self.requests.put(msg)

    def close(self) -> None:
        self.requests.put(None)
        self.call.cancel()


class LoopGrpc:
    """`LoopHTTP`'s interface over gRPC (see the module docstring). Only the loop thread calls it."""

    def __init__(self, api: GrpcAPI, sel: selectors.BaseSelector, wake_fd: int = -1, mode: str = "unary",
                 engine: str = "wire") -> None:
        if mode not in ("stream", "unary"):
            raise ValueError("mode must be 'stream' or 'unary'")
        if engine not in ENGINES:
            raise ValueError(f"engine must be one of {ENGINES}")
        self.mode = mode  # unary: job calls as separate RPCs (concurrent on the one HTTP/2 connection)
        # wire: unary calls on the loop's own HTTP/2 connection (supervisor.client.h2grpc); grpcio: its futures
        self.engine = engine
        self.wire: Any = None  # the H2Client new calls go on, made on the first call
        self.wire_retiring: list[Any] = []  # spent H2Clients (GOAWAY) finishing the calls still out on them
        self.resolver: Resolver | None = None  # the server's addresses, shared by every connection in turn
        self.wire_calls: dict[int, _WireCall] = {}  # id(context) -> the calls out on it
        self.wire_due = math.inf  # no wire call's deadline is before this (a lower bound: exact after a scan)
        self.api = api
        self.sel = sel
        self.wake_fd = wake_fd
        self.results: list[tuple] = []
        self.waiting: collections.deque[_Pending] = collections.deque()  # stream calls not sent yet
        self.stream: _Stream | None = None
        self.failures = 0  # stream breaks since the last answer
        self.reconnect_at = 0.0
        self.last_error = ""
        self.maybe_applied: set[str] = set()  # jobs whose complete/fail went out on a stream that broke
        self._events: collections.deque = collections.deque()
        self._woken = False
        self._closed = False
        self.rest: Any = None  # a LoopHTTP for the REST fallback, made on first use
        self.lazy_reads = engine == "wire"  # settlements' answers read at the loop's pace (_pace_reads)
        self.urgent = 0  # wire calls out whose answers someone waits for (all but settlements)
        self.read_due = math.inf  # while the wire is lazy with calls out: read it by then

    # ------------------------------------------------------------- interface
    def submit(self, tag: Any, call: GrpcCall, first: bool = False) -> None:
        now = time.monotonic()
        if call.rest_only and call.error is not None:
            return self._fall_back(tag, call, call.error)
        if call.error is not None:
            self._result(tag, call, now, error=call.error)
            return
        if self.engine == "wire" and call.kind in WIRE_PATHS and (self.mode == "unary" or
                                                                 call.kind not in STREAM_KINDS):
            return self._submit_wire(tag, call, now)
        self.api.connect()
        if call.kind in STREAM_KINDS and self.mode == "unary":
            return self._submit_unary_job(tag, call, now)
        if call.kind in STREAM_KINDS:
            item = _Pending(tag, call, now, now + self.api.timeout)
            if first:
                self.waiting.appendleft(item)
            else:
                self.waiting.append(item)
            self._pump(now)
            return
        method = getattr(self.api.worker_stub, UNARY_ROUTES[call.kind])
        future = method.future(call.message, metadata=self.api.metadata, timeout=self.api.timeout)
        future.add_done_callback(lambda f: self._emit(("unary", tag, call, now, f)))

    def _submit_unary_job(self, tag: Any, call: GrpcCall, now: float) -> None:
        rpc, _ = JOB_UNARY[call.kind]
        request: Any = call.message
        if call.kind == "claim":
            request.batch_size = call.count
        future = getattr(self.api.queue_stub, rpc).future(request, metadata=self.api.metadata,
                                                          timeout=self.api.timeout)
        future.add_done_callback(lambda f: self._emit(("unary", tag, call, now, f)))

    def _submit_wire(self, tag: Any, call: GrpcCall, now: float) -> None:
        message: Any = call.message
        if call.kind == "claim":
            message.batch_size = call.count
        path, answer_type = WIRE_PATHS[call.kind]
        ctx = _WireCall(tag, call, now, now + self.api.timeout, answer_type, path=path,
                        body=message.SerializeToString())
        self._send_wire(ctx)
        self._finish_wire()
        self._pace_reads(now)

    def _send_wire(self, ctx: _WireCall) -> None:
        """Put a call on the current connection: a new one when there is none, or when the current one is
        spent (GOAWAY, its stream ids used up) while calls still out on it finish there."""
        if self.wire is not None and self.wire.spent() and self.wire.contexts:
            self.wire.set_lazy(False)  # a retiring connection is never polled: its answers wake the loop
            self.wire_retiring.append(self.wire)
            self.wire = None
        if self.wire is None:
            from supervisor.client.h2grpc import H2Client

            api = self.api
            self.wire = H2Client(self.sel, self._addresses(), api.target, api.host, api.wire_tls(),
                                 lambda: api.metadata, f"spooled-supervisor/{__version__}")
        handle = self.wire.call(ctx.path, ctx.body, ctx)
        if handle is None:
            why = f"{self.api.base_url}: {self.wire.last_error}"
            self._result(ctx.tag, ctx.call, ctx.started, error=Unavailable(0, "CONNECT", why))
            return
        ctx.handle, ctx.client = handle, self.wire
        self.wire_calls[id(ctx)] = ctx
        self.wire_due = min(self.wire_due, ctx.deadline)
        if ctx.call.kind not in LAZY_KINDS:
            self.urgent += 1

    def _forget(self, ctx: _WireCall) -> None:
        if self.wire_calls.pop(id(ctx), None) is not None and ctx.call.kind not in LAZY_KINDS:
            self.urgent -= 1

    def _pace_reads(self, now: float) -> None:
        """While only settlements are out, their answers do not wake the loop: they wait for its next turn
        (a child's report, a timer), LAZY_READ at the latest, so each job costs the parent one turn, not two.
        A claim, worker call or renewal out, or no call at all (a GOAWAY or hang-up of an idle connection is
        seen at once), and the connection wakes the loop again."""
        wire = self.wire
        if wire is None:
            return
        lazy = self.lazy_reads and self.urgent == 0 and bool(self.wire_calls) and not self._closed
        wire.set_lazy(lazy)
        if not lazy:
            self.read_due = math.inf
        elif self.read_due == math.inf:
            self.read_due = now + LAZY_READ

    def _addresses(self) -> Callable[[], list | None]:
        """One lookup for all connections: a new one after a GOAWAY connects at once, its calls not failed
        while a new lookup would run on its thread."""
        if self.resolver is None:
            host, _, port = self.api.target.rpartition(":")
            self.resolver = Resolver(host.strip("[]"), int(port), self.wake_fd)
        return self.resolver

    def _finish_wire(self) -> None:
        """Turn the wire's answers into results, as grpcio's would be (and forget their deadlines); close a
        retiring connection once its last call is answered. A call sent again may be answered at once (its
        connection broke): those answers are taken too, a bounded number of rounds."""
        if self.wire is None or not (self.wire.answers or self.wire_retiring):
            return  # (every turn asks: most have nothing)
        for _ in range(RESEND_UNPROCESSED + 2):
            if not self._finish_wire_round():
                break
        self._pace_reads(time.monotonic())

    def _finish_wire_round(self) -> bool:
        if self.wire is None or not (self.wire.answers or self.wire_retiring):
            return False
        taken: list[tuple[Any, Any]] = []
        for client in (self.wire, *self.wire_retiring):
            if client.answers:
                taken += client.answers
                client.answers = []
        if self.wire_retiring:
            for client in [c for c in self.wire_retiring if not c.contexts]:
                self.wire_retiring.remove(client)
                client.close()
        for ctx, _ in taken:
            self._forget(ctx)
        for ctx, answer in taken:
            if answer.unprocessed and ctx.resent < RESEND_UNPROCESSED and not self._closed:
                ctx.resent += 1  # the server never acted on it (a refused stream, GOAWAY): sent again at once
                self._send_wire(ctx)
                continue
            if answer.status != 0:
                # what the server said, as a server said it: never the key, never more than a line's worth
                details = self.api._key.scrub(answer.details)[:MAX_DETAILS]
                self._unary_done(ctx.tag, ctx.call, ctx.started, _status_code(answer.status), details, None)
                continue
            try:
                reply = _answer_types()[ctx.answer_type].FromString(answer.message or b"")
            except Exception:  # a message that does not parse: as a broken answer
                self._unary_done(ctx.tag, ctx.call, ctx.started, _status_code(13),
                                 f"an answer that is not a {ctx.answer_type}", None)
                continue
            self._unary_done(ctx.tag, ctx.call, ctx.started, None, "", reply)
        return bool(taken)

    def done(self) -> list[tuple]:
        self._drain(time.monotonic())
        if self.rest is not None:
            for (_, tag, call, grpc_error), result, error in self.rest.done():
                if isinstance(error, AlreadyFinished) and call.job_id in self.maybe_applied:
                    result, error = None, None  # the gRPC copy whose answer was lost had been applied
                elif isinstance(error, (Unauthorized, Rejected, Conflict, QuotaExceeded, Unavailable)):
                    # the fallback cannot help (e.g. --api-url is not this deployment): answer as gRPC did,
                    # so a REST refusal never stops the daemon
                    error = grpc_error if not call.rest_only else Rejected(
                        0, grpc_error.code, f"{grpc_error.message}; the REST fallback failed too: {error}")
                self.maybe_applied.discard(call.job_id)
                self.results.append((tag, result, error))
        out, self.results = self.results, []
        return out

    def has_answers(self) -> bool:
        return bool(self.results) or (self.rest is not None and self.rest.has_answers())

    def next_deadline(self) -> float | None:
        times = [item.deadline for item in self.waiting]
        if self.wire_calls:
            times.append(min(self.wire_due, self.read_due))
        rest = self.rest.next_deadline() if self.rest is not None else None
        if rest is not None:
            times.append(rest)
        if self.stream is not None and self.stream.sent:
            times.append(self.stream.sent[0].deadline)
        if self.stream is None and self.waiting:
            times.append(self.reconnect_at)
        return min(times) if times else None

    def expire(self, now: float) -> None:
        """Take what gRPC's threads handed over, fail calls past their deadline, (re)open the stream."""
        self._drain(now)
        self._expire_wire(now)
        if self.rest is not None:
            self.rest.expire(now)
        if self.stream is not None and self.stream.sent and now >= self.stream.sent[0].deadline:
            stuck = self.stream.sent.popleft()
            self._finish(stuck, now, Unavailable(0, "TIMEOUT", f"no answer from {self.api.base_url} within "
                                                              f"{self.api.timeout:g} s"), lost=True)
            self._break(now, "a call timed out")
        for item in [i for i in self.waiting if now >= i.deadline]:
            self.waiting.remove(item)
            self._finish(item, now, Unavailable(0, "TIMEOUT", f"no ProcessJobs stream to {self.api.base_url}: "
                                                              f"{self.last_error or 'connecting'}"), lost=True)
        self._pump(now)

    def _expire_wire(self, now: float) -> None:
        if self.wire is not None and self.wire.lazy and self.wire_calls:
            self.wire.poll(now)  # a lazy connection is read every turn (and by read_due at the latest)
            self.read_due = now + LAZY_READ  # (_pace_reads forgets it once nothing is out)
        if now < self.wire_due:  # no call is late: no scan (a turn per answer would cost one each)
            return self._finish_wire()
        late = [c for c in self.wire_calls.values() if now >= c.deadline]
        self.wire_due = min((c.deadline for c in self.wire_calls.values() if now < c.deadline), default=math.inf)
        for ctx in late:
            self._forget(ctx)
            ctx.client.cancel(ctx.handle)
            if ctx.call.kind in ("complete", "fail"):
                self.maybe_applied.add(ctx.call.job_id)  # it may have been applied: a NOT_FOUND later means done
            self._result(ctx.tag, ctx.call, ctx.started, error=Unavailable(
                0, "TIMEOUT", f"no answer from {self.api.base_url} within {self.api.timeout:g} s"))
        for client in {id(c.client): c.client for c in late}.values():
            if client.silent_since(min(c.started for c in late if c.client is client)):
                client.drop("the server finished no call since this one started: the connection is presumed dead")
        self._finish_wire()
        self._pace_reads(now)  # (the late calls are gone: perhaps nothing is out any more)

    def on_ready(self, conn: Any, mask: int, now: float) -> None:
        """A selector event of this transport's connection, or of the REST fallback's sockets."""
        if self.wire is not None and (conn is self.wire or conn in self.wire_retiring):
            conn.on_ready(mask, now)
            return self._finish_wire()
        if self.rest is not None:
            self.rest.on_ready(conn, mask, now)

    def close(self) -> None:
        self._closed = True
        if self.wire is not None:
            for client in (self.wire, *self.wire_retiring):
                client.close()
            self.wire_retiring.clear()
            self.wire_calls.clear()
        if self.rest is not None:
            self.rest.close()
        if self.stream is not None:
            self.stream.close()
            self.stream = None
        self.api.close()

    # ------------------------------------------------------------ the stream
    def _pump(self, now: float) -> None:
        if not self.waiting or self._closed:
            return
        if self.stream is None:
            if now < self.reconnect_at:
                return
            self.stream = _Stream(self.api, self._emit)
        while self.waiting:
            item = self.waiting.popleft()
            item.left = item.call.count
            wrapped = _process_request(item.call)
            for _ in range(item.call.count):
                self.stream.send(item, wrapped)

    def _break(self, now: float, why: str) -> None:
        """Drop the stream; re-send its unanswered settlements first on the next one."""
        stream, self.stream = self.stream, None
        if stream is None:
            return
        stream.close()
        self.failures += 1
        self.last_error = why
        self.reconnect_at = now + backoff(self.failures, 0.2, 5.0)
        resend: list[_Pending] = []
        for slot in stream.sent:
            if slot.finished:
                continue
            if slot.call.kind == "claim":
                slot.left -= 1
                if slot.left == 0:
                    self._finish(slot, now, Unavailable(0, "STREAM_BROKEN", f"ProcessJobs stream broke: {why}"))
            elif slot not in resend:
                if slot.call.kind in ("complete", "fail"):
                    self.maybe_applied.add(slot.call.job_id)
                slot.resent = True
                resend.append(slot)
        self.waiting.extendleft(reversed(resend))

    def _on_answer(self, stream: _Stream, answer: Any, now: float) -> None:
        if stream is not self.stream or not stream.sent:
            return  # from a stream already given up
        self.failures = 0
        slot = stream.sent.popleft()
        if slot.finished:
            return
        which = answer.WhichOneof("response")
        call = slot.call
        if call.kind == "claim":
            slot.left -= 1
            if which == "job":
                slot.jobs.append(job_dict(answer.job))
            elif which == "error" and answer.error.code != "NO_JOBS" and slot.error is None:
                slot.error = map_inband(answer.error.code, answer.error.message)
            if slot.left == 0:
                self._finish(slot, now)
            return
        if which == "error":
            code, message = answer.error.code, answer.error.message
            if code == "NOT_FOUND" and call.kind in ("complete", "fail") and call.job_id in self.maybe_applied:
                self.maybe_applied.discard(call.job_id)
                return self._finish(slot, now)  # a re-sent settlement: the first copy was applied
            self.maybe_applied.discard(call.job_id)
            if code == "UNAUTHENTICATED":
                self._finish(slot, now, map_inband(code, message))
                return self._break(now, "UNAUTHENTICATED")
            return self._finish(slot, now, map_inband(code, message))
        self.maybe_applied.discard(call.job_id)
        if which == "fail":
            slot.jobs = [{"will_retry": answer.fail.will_retry,
                          "next_retry_delay_secs": answer.fail.next_retry_delay_secs}]
        self._finish(slot, now)

    def _on_end(self, stream: _Stream, exc: BaseException | None, now: float) -> None:
        if stream is not self.stream:
            return
        import grpc

        if isinstance(exc, grpc.RpcError) and exc.code() in (grpc.StatusCode.UNAUTHENTICATED,
                                                             grpc.StatusCode.PERMISSION_DENIED):
            err = map_status(exc.code(), exc.details() or "", False)
            self.stream = None
            stream.close()
            for slot in list(dict.fromkeys(stream.sent)) + list(self.waiting):
                self._finish(slot, now, err)
            self.waiting.clear()
            return
        if isinstance(exc, grpc.RpcError):
            why = f"{exc.code().name}: {exc.details() or ''}"
        else:
            why = "the server ended the stream" if exc is None else f"{type(exc).__name__}: {exc}"
        self._break(now, why)

    # --------------------------------------------------------------- results
    def _finish(self, slot: _Pending, now: float, error: ApiError | None = None, lost: bool = False) -> None:
        """Hand a stream call's outcome to the parent (once; later answers for it are dropped)."""
        if slot.finished:
            return
        slot.finished = True
        call = slot.call
        if lost and call.kind in ("complete", "fail"):
            self.maybe_applied.add(call.job_id)  # the parent may send it again: a NOT_FOUND then means done
        if call.kind == "claim":
            if slot.jobs or (error is None and slot.error is None):
                return self._result(slot.tag, call, slot.started, list(slot.jobs))
            return self._result(slot.tag, call, slot.started, error=error or slot.error)
        if error is not None:
            return self._result(slot.tag, call, slot.started, error=error)
        self._result(slot.tag, call, slot.started, slot.jobs[0] if slot.jobs else None)

    def _on_unary(self, tag: Any, call: GrpcCall, started: float, future: Any) -> None:
        import grpc

        try:
            answer = future.result()
        except grpc.RpcError as exc:
            return self._unary_done(tag, call, started, exc.code(), exc.details() or "", None)
        except grpc.FutureCancelledError:
            return self._result(tag, call, started, error=Unavailable(0, "CANCELLED", "call cancelled"))
        self._unary_done(tag, call, started, None, "", answer)

    def _unary_done(self, tag: Any, call: GrpcCall, started: float, code: Any, details: str, answer: Any) -> None:
        """A unary call's outcome (`code` None: `answer` is the reply) -> the parent's result or typed error."""
        import grpc

        if code is not None:
            if call.kind in ("complete", "fail"):
                if code == grpc.StatusCode.NOT_FOUND and call.job_id in self.maybe_applied:
                    self.maybe_applied.discard(call.job_id)
                    return self._result(tag, call, started)  # a retried settlement: the first copy was applied
                if code.name in MAYBE_APPLIED:
                    self.maybe_applied.add(call.job_id)
            return self._result(tag, call, started, error=map_status(code, details, call.job_route))
        self.maybe_applied.discard(call.job_id)
        try:
            result = call.answer(answer) if call.answer else _unary_job_answer(call.kind, answer)
        except ApiError as exc:
            return self._result(tag, call, started, error=exc)
        except Exception as exc:  # an answer we cannot read is the call's error, never the loop's: the call's
            # followup must still run (a claim left unanswered would stop all claiming)
            return self._result(tag, call, started, error=Unavailable(
                0, "BAD_ANSWER", f"an answer from {self.api.base_url} that could not be read: {type(exc).__name__}"))
        self._result(tag, call, started, result)

    def _fall_back(self, tag: Any, call: GrpcCall, grpc_error: ApiError) -> None:
        """Send a settlement over REST instead; its answer comes back through done() (a REST failure as
        `grpc_error`, the answer gRPC gave)."""
        from supervisor.client.loophttp import LoopHTTP

        rest_api, build = self.api.rest, call.rest_call
        if rest_api is None or build is None:  # (rest_call is only set when there is a REST API)
            return self.results.append((tag, None, Unavailable(0, "NO_FALLBACK", "no REST API to fall back to")))
        if self.rest is None:
            self.rest = LoopHTTP(rest_api, self.sel, self.wake_fd)
        call.fell_back = True
        self.rest.submit(("grpc-fallback", tag, call, grpc_error), build())

    def _result(self, tag: Any, call: GrpcCall, started: float, result: Any = None, error: ApiError | None = None
                ) -> None:
        if self.api.on_request is not None:
            status = 200 if error is None else error.status
            self.api.on_request(call.route, status, time.monotonic() - started)
        if isinstance(error, Unavailable) and call.rest_call is not None and not call.fell_back:
            return self._fall_back(tag, call, error)  # gRPC could not deliver it: REST may
        self.results.append((tag, result, error))

    # ---------------------------------------------------- thread hand-over
    def _emit(self, event: tuple) -> None:
        """Called on gRPC's threads: queue the event and wake the loop (one byte per wake-up)."""
        self._events.append(event)
        if not self._woken:
            self._woken = True
            if self.wake_fd >= 0:
                try:
                    os.write(self.wake_fd, b"\0")
                except OSError:  # a full pipe is already readable
                    pass

    def _drain(self, now: float) -> None:
        self._woken = False
        events = self._events
        while events:
            kind, a, b, *rest = events.popleft()
            if kind == "answer":
                self._on_answer(a, b, now)
            elif kind == "end":
                self._on_end(a, b, now)
            else:
                self._on_unary(a, b, rest[0], rest[1])


def make_api(cfg: Any, on_request: Callable[[str, int, float], None] | None = None) -> GrpcAPI:
    """The GrpcAPI for `cfg.transport == 'grpc'`, from cfg.grpc_url, cfg.api_key, cfg.api_timeout and
    cfg.ca_bundle, with cfg.api_url (if set) as the REST fallback for settlements. Raises GrpcMissing
    (one line to print, exit 2) without the grpc extra, ValueError for a malformed URL. Creates no
    channel and no thread."""
    require_grpc()
    timeout, ca_bundle = getattr(cfg, "api_timeout", 10.0), getattr(cfg, "ca_bundle", None)
    rest = None
    if getattr(cfg, "api_url", None):
        rest = SpooledAPI(cfg.api_url, cfg.api_key, timeout=timeout, ca_bundle=ca_bundle, on_request=on_request)
    return GrpcAPI(getattr(cfg, "grpc_url", None) or DEFAULT_GRPC_URL, cfg.api_key, timeout=timeout,
                   ca_bundle=ca_bundle, on_request=on_request, rest=rest,
                   engine=getattr(cfg, "grpc_client", None) or "wire")


def make_transport(cfg: Any, wake_fd: int, selector: selectors.BaseSelector,
                   on_request: Callable[[str, int, float], None] | None = None,
                   mode: str = "unary") -> tuple[GrpcAPI, LoopGrpc]:
    """(api, client): `make_api(cfg)` and its loop client on `selector` / `wake_fd`; the shape comes from
    cfg.grpc_mode if present ('unary' or 'stream'), else `mode`."""
    api = make_api(cfg, on_request)
    return api, LoopGrpc(api, selector, wake_fd, mode=getattr(cfg, "grpc_mode", None) or mode, engine=api.engine)
