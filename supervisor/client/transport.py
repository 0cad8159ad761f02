"""The one interface the parent talks to the API through; REST and gRPC both implement it.

A `Transport` builds the daemon's calls (one method per route, the same arguments for both) and makes the
`LoopTransport` that sends them from the parent's select loop. `supervisor.commands.run` picks one from
--transport and hands it to the arbiter, which never asks which it got:

- REST: `supervisor.client.rest.SpooledAPI` builds `Call`s, `supervisor.client.loophttp.LoopHTTP` sends them;
- gRPC: `supervisor.client.grpc_transport.GrpcAPI` builds `GrpcCall`s, `LoopGrpc` sends them.

A call is opaque outside the transport that built it: only its own loop transport sends it. Answers come
back from `done()` as `(tag, result, error)` with the results and the typed errors of
supervisor.client.calls, whichever transport carried them.
"""

from __future__ import annotations

import selectors
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

# A call built by a Transport (a calls.Call for REST, a GrpcCall for gRPC): hand it to that transport's loop.
BuiltCall = Any


@dataclass(frozen=True)
class EventsSource:
    """Where the parent listens for new jobs: `api` (a `SpooledAPI`) serves the events stream, at the addresses
    `addresses()` answers (None until they are known; never looked up on the loop)."""

    api: Any
    addresses: Callable[[], list | None]


class LoopTransport(Protocol):
    """Sends built calls from the parent's loop without blocking it; only the loop thread calls it."""

    def has_answers(self) -> bool:
        """Answers wait to be taken by done(): the loop must not sleep while they do."""
        ...

    def submit(self, tag: Any, call: BuiltCall, first: bool = False) -> None:
        """Send `call` (ahead of the others waiting with `first`); its answer comes back with `tag`."""

    def done(self) -> list[tuple]:
        """The calls answered since the last time, as (tag, result, error-or-None)."""
        ...

    def next_deadline(self) -> float | None:
        """The monotonic time `expire` has something to do at, or None."""

    def expire(self, now: float) -> None:
        """Fail the calls past their deadline and send what waits."""

    def on_ready(self, conn: Any, mask: int, now: float) -> None:
        """A selector event for a key this transport registered (data `("http", conn)`)."""

    def close(self) -> None:
        """Drop every connection; calls still out are not answered."""


class Transport(Protocol):
    """Builds the daemon's API calls and the loop transport that sends them; `deregister` blocks."""

    base_url: str  # where it talks to, for log lines (never holds the key)

    def loop_client(self, sel: selectors.BaseSelector, wake_fd: int, max_connections: int = 4) -> LoopTransport:
        """The loop transport for these calls: it registers its sockets in `sel` and writes a byte to
        `wake_fd` when another thread has an answer; at most `max_connections` HTTP connections."""
        ...

    def register_call(self, queue: str, worker_id: str, hostname: str, max_concurrency: int, metadata: dict,
                      queue_names: list[str] | None = None) -> BuiltCall: ...

    def get_worker_call(self, worker_id: str) -> BuiltCall: ...

    def heartbeat_call(self, worker_id: str, current_jobs: int, status: str, metadata: dict | None = None,
                       cpu_percent: float | None = None, memory_percent: float | None = None) -> BuiltCall: ...

    def claim_call(self, queue: str, worker_id: str, limit: int, lease_secs: int) -> BuiltCall: ...

    def queue_stats_call(self, queue: str) -> BuiltCall: ...

    def complete_call(self, job_id: str, worker_id: str, lease_id: str, result: Any) -> BuiltCall: ...

    def fail_call(self, job_id: str, worker_id: str, lease_id: str, error: str) -> BuiltCall: ...

    def renew_lease_call(self, job_id: str, worker_id: str, lease_id: str, lease_secs: int) -> BuiltCall: ...

    def events_source(self, loop: LoopTransport, wake_fd: int) -> EventsSource | None:
        """Where to listen for new jobs while the loop runs `loop` (this transport's loop client); None: no REST
        API to listen to. `wake_fd` is written when addresses looked up on a helper thread are known."""
        ...

    def deregister(self, worker_id: str, timeout: float | None = None) -> None:
        """Blocking; with `timeout`, over within it. Raises the typed ApiError. Safe to repeat."""
