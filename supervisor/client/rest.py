"""The Spooled REST client: one method per route, typed errors.

Two transports send the same `Call`s. The parent's loop sends them on non-blocking sockets
(supervisor.client.loophttp) and schedules every retry itself, so no thread sleeps in a back-off.
`execute` blocks, for the command-line paths (`enqueue`, `demo`) and the parent's final deregister;
it uses `requests` (supervisor.client.blocking, imported on first use, so the daemon's parent loads it
only for that deregister) with one Session (a kept-alive connection pool) per SpooledAPI:

- every attempt has a timeout: connecting and each read within `timeout` seconds;
- with `attempts=N` (the commands use 3; the daemon keeps the default 1, so its one blocking read at
  start-up, the worker-row check, stays a single bounded attempt), idempotent calls (GET, and calls
  marked `retry_safe`: deregister, a create with an idempotency key) are tried up to N times on a
  network error, 408 or 502/503/504, with a short back-off; others (a claim, a bulk create without a
  key) are sent once, never resent blindly;
- `execute(call, timeout=t)` (the final deregister) is one attempt on a fresh connection that returns
  or raises Unavailable within `t` seconds whatever the server does (a connect that hangs, an answer
  trickled a byte at a time): it runs on a helper daemon thread joined for `t` (one given up on never
  delays the process's exit, and its late result is dropped). The parent makes two such attempts of at most
  5 s, after its loop has stopped, so the blocking is bounded and off the loop;
- an answer whose framing is wrong (an interim status as the answer, a Content-Length that is not digits
  only or stands beside Transfer-Encoding, ...) fails as Unavailable BAD_FRAMING, its connections dropped;
- environment proxies, .netrc and REQUESTS_CA_BUNDLE are ignored (trust_env off), as in the loop's
  client: the key goes only to the API URL, checked against the same CAs (`--ca-bundle` or the system's).

The API key lives only in the Authorization header; it never appears in an exception (ours carry text
only, never a requests exception or the request it holds), a repr or a log line.
"""

from __future__ import annotations

import selectors
import ssl
from collections.abc import Callable
from typing import Any
from urllib.parse import quote, urlsplit

from supervisor import __version__, exactjson
from supervisor.client.calls import (
    AlreadyFinished,
    ApiError,
    Call,
    Conflict,
    LeaseLost,
    QuotaExceeded,
    RateLimited,
    Rejected,
    Secret,
    Unauthorized,
    Unavailable,
    classify,
    decode,
    network_error,
    scrub_secret,
)
from supervisor.client.httpconn import Response
from supervisor.client.loophttp import LoopHTTP
from supervisor.client.transport import EventsSource, LoopTransport

USER_AGENT = f"spooled-supervisor/{__version__}"

# The shared call and error types, here too for the many callers that know them as rest.X.
__all__ = ["USER_AGENT", "AlreadyFinished", "ApiError", "Call", "Conflict", "LeaseLost", "QuotaExceeded", "RateLimited",
           "Rejected", "Secret", "SpooledAPI", "Unauthorized", "Unavailable", "classify", "network_error"]


class SpooledAPI:
    """The REST `Transport` (supervisor.client.transport): builds `Call`s for every route and runs them.
    `execute` blocks (requests, see the module's docstring); the parent loop sends the same calls on
    non-blocking sockets instead (`loop_client`: supervisor.client.loophttp)."""

    def __init__(self, base_url: str, api_key: Secret, timeout: float = 10.0, ca_bundle: str | None = None,
                 on_request: Callable[[str, int, float], None] | None = None, attempts: int = 1):
        parts = urlsplit(base_url.rstrip("/"))
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"API URL must be http:// or https:// with a host, got {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self.https = parts.scheme == "https"
        self.host = parts.hostname
        self.port = parts.port or (443 if self.https else 80)
        self.prefix = parts.path.rstrip("/")
        self.origin = f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}"
        self.timeout = timeout
        self.attempts = max(1, attempts)  # the blocking path's tries of an idempotent call
        self.ca_bundle = ca_bundle
        self.ssl_context = ssl.create_default_context(cafile=ca_bundle) if self.https else None
        self.headers = {"Authorization": f"Bearer {api_key.value}", "Content-Type": "application/json",
                        "Accept": "application/json", "User-Agent": USER_AGENT}
        self._key = api_key.value
        self._blocking: Any = None
        self.on_request = on_request

    def __repr__(self) -> str:
        return f"SpooledAPI({self.base_url!r})"

    def call(self, method: str, path: str, body: Any = None, route: str | None = None, job_route: bool = False,
             resend_on_stale: bool = True, answer: Callable | None = None, retry_safe: bool = False) -> Call:
        data = b"" if body is None else (body if isinstance(body, bytes) else exactjson.dumps(body))
        return Call(method, self.prefix + path, data, route or path, job_route, resend_on_stale, answer, retry_safe)

    def result(self, call: Call, response: Response) -> Any:
        """The decoded answer of a 2xx reply, or raise the typed ApiError (see calls.decode)."""
        return decode(call, response)

    # ------------------------------------------------------------ blocking transport
    def execute(self, call: Call, timeout: float | None = None) -> Any:
        """Send `call` and return its result; raise ApiError otherwise (see the module's docstring).
        Without `timeout`: the shared session, the API timeout, idempotent calls retried. With `timeout`:
        one attempt on a fresh connection, over within `timeout` seconds."""
        if self._blocking is None:
            from supervisor.client.blocking import BlockingTransport  # requests: ~7 MiB the loop never needs

            self._blocking = BlockingTransport(self, self._key)
        return self._blocking.execute(call, timeout)

    def loop_client(self, sel: selectors.BaseSelector, wake_fd: int, max_connections: int = 4) -> LoopHTTP:
        """The parent loop's transport for these calls (see supervisor.client.transport)."""
        return LoopHTTP(self, sel, wake_fd, max_connections=max_connections)

    def events_source(self, loop: LoopTransport, wake_fd: int) -> EventsSource:
        """The events stream of this API itself, at the addresses its loop client (`loop`) resolved."""
        return EventsSource(self, lambda: loop.addrs if isinstance(loop, LoopHTTP) else None)

    def close(self) -> None:
        """Close the blocking path's kept-alive connections."""
        if self._blocking is not None:
            self._blocking.close()

    def request(self, method: str, path: str, body: Any = None, route: str | None = None, job_route: bool = False,
                resend_on_stale: bool = True, retry_safe: bool = False) -> Any:
        return self.execute(self.call(method, path, body, route, job_route, resend_on_stale, retry_safe=retry_safe))

    # -- worker routes --
    def register_call(self, queue: str, worker_id: str, hostname: str, max_concurrency: int, metadata: dict,
                      queue_names: list[str] | None = None) -> Call:
        body = {"queue_name": queue, "worker_id": worker_id, "hostname": hostname, "worker_type": "spooled-supervisor",
                "max_concurrency": max(1, min(100, max_concurrency)), "metadata": metadata, "version": __version__}
        if queue_names:
            body["queue_names"] = list(queue_names)
        return self.call("POST", "/api/v1/workers/register", body, route="register", resend_on_stale=False)

    def get_worker_call(self, worker_id: str) -> Call:
        return self.call("GET", f"/api/v1/workers/{quote(worker_id, safe='')}", None, route="get_worker")

    def heartbeat_call(self, worker_id: str, current_jobs: int, status: str, metadata: dict | None = None,
                       cpu_percent: float | None = None, memory_percent: float | None = None) -> Call:
        body = {"current_jobs": max(0, min(1000, current_jobs)), "status": status}
        if metadata is not None:
            body["metadata"] = metadata
        if cpu_percent is not None:
            body["cpu_percent"] = cpu_percent
        if memory_percent is not None:
            body["memory_percent"] = memory_percent
        return self.call("POST", f"/api/v1/workers/{quote(worker_id, safe='')}/heartbeat", body,
                         route="worker_heartbeat")

    def deregister(self, worker_id: str, timeout: float | None = None) -> None:
        """Blocking; with `timeout`, one attempt bounded by it (see the module's docstring). Safe to repeat."""
        self.execute(self.call("POST", f"/api/v1/workers/{quote(worker_id, safe='')}/deregister", None,
                               route="deregister", retry_safe=True), timeout)

    # -- job routes --
    def claim_call(self, queue: str, worker_id: str, limit: int, lease_secs: int) -> Call:
        body = {"queue_name": queue, "worker_id": worker_id, "limit": max(1, min(100, limit)),
                "lease_duration_secs": lease_secs}
        return self.call("POST", "/api/v1/jobs/claim", body, route="claim", resend_on_stale=False,
                         answer=lambda a: list((a or {}).get("jobs") or []))

    def claim(self, queue: str, worker_id: str, limit: int, lease_secs: int) -> list[dict]:
        return self.execute(self.claim_call(queue, worker_id, limit, lease_secs))

    def complete_call(self, job_id: str, worker_id: str, lease_id: str, result: Any) -> Call:
        body = {"worker_id": worker_id, "lease_id": lease_id}
        if result is not None:
            body["result"] = result
        return self.call("POST", f"/api/v1/jobs/{quote(job_id, safe='')}/complete", body, route="complete",
                         job_route=True)

    def fail_call(self, job_id: str, worker_id: str, lease_id: str, error: str) -> Call:
        body = {"worker_id": worker_id, "lease_id": lease_id,
                "error": scrub_secret(error or "Job failed", self._key)[:2048]}  # scrubbed before it is cut
        return self.call("POST", f"/api/v1/jobs/{quote(job_id, safe='')}/fail", body, route="fail", job_route=True)

    def renew_lease_call(self, job_id: str, worker_id: str, lease_id: str, lease_secs: int) -> Call:
        body = {"worker_id": worker_id, "lease_id": lease_id, "lease_duration_secs": lease_secs}
        return self.call("POST", f"/api/v1/jobs/{quote(job_id, safe='')}/heartbeat", body, route="job_heartbeat",
                         job_route=True)

    def queue_stats_call(self, queue: str) -> Call:
        """The queue's statistics: its jobs of the last 24 h and their mean processing time among them."""
        return self.call("GET", f"/api/v1/queues/{quote(queue, safe='')}/stats", None, route="queue_stats",
                         retry_safe=True)

    def bulk_create(self, queue: str, payloads: list, **defaults: Any) -> dict:
        body = {"queue_name": queue, "jobs": [{"payload": p} for p in payloads],
                **{k: v for k, v in defaults.items() if v is not None}}
        return self.request("POST", "/api/v1/jobs/bulk", body, route="bulk_create", resend_on_stale=False)

    def get(self, path: str) -> Any:
        return self.request("GET", path, None, route="get")

    def create_job(self, queue: str, payload: Any, **fields: Any) -> dict:
        body = {"queue_name": queue, "payload": payload, **{k: v for k, v in fields.items() if v is not None}}
        keyed = fields.get("idempotency_key") is not None
        return self.request("POST", "/api/v1/jobs", body, route="create_job", resend_on_stale=keyed, retry_safe=keyed)
