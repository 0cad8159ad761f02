"""Realtime events: the job lifecycle as the real server names and shapes them, for `GET /api/v1/events`
(server-sent events, answered as the real server does since 0.1.114) and the WebSocket (websocket.py).

Contract:
- `Broadcaster.on_fact` is a Store listener: each committed state change becomes the real server's event
  (docs/events.md has the table): `job.created` (JobCreated), `job.status` (JobStatusChange: claimed,
  failed, retried, cancelled, released), `job.completed` (JobCompleted), `job.failed` (JobFailed),
  `worker.registered` (WorkerRegistered) and `worker.deregistered` (WorkerDeregistered).
- Each event is a named SSE event, `event: <name>`, whose one `data:` line is the
  `{"type": "<Variant>", "data": {...}}` envelope; `timestamp` is RFC 3339.
- A subscriber sees only its organization's events; with `?queue=` only events of that queue (an event
  without a queue, such as `worker.deregistered`, is then left out), with `?job_id=` only that job's;
  `?events=a,b` keeps only those names (`*` keeps all). The stream opens with a `:connected` comment.
  Every HEALTH_EVERY seconds it sends `system.health` if the filter keeps it, else a `:keepalive`
  comment, so a silent connection is a dead one.
- A stream ends after MAX_STREAM seconds, when its key is revoked (`drop_key`) or expires, when the
  client goes, when the server stops, or on `drop_all`
  (the dev route `POST /_dev/events/drop`, for tests of reconnecting, which may also refuse new streams
  with 503 for a while): one organization's streams, never another's.
- A subscriber that falls BUFFER events behind loses the newest ones, as the real broadcast channel
  drops for a lagging receiver: events are a hint to claim, never the only way to find a job.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable

import orjson

from supervisor import exactjson

from .store import ts
from .transport import Streamed

BUFFER = 1000
HEALTH_EVERY = 10.0  # seconds between system.health events (or keep-alive comments)
MAX_STREAM = 1800.0  # seconds a stream lasts at most
TICK = 1.0  # seconds between checks that the client is still there
_END = object()
Fragment = orjson.Fragment


class Subscriber:
    """One open stream's (or WebSocket's) filter and its buffer of events: encoded SSE frames, or with
    `raw` the (name, variant, data) triples. `wake`, if set, is called after each item is buffered.

    `scope` (a queue-scoped key's queues) bounds what the filter can ever see: only events of those queues,
    whatever `queue_name` the client narrows or widens to. `key_id` is the key the stream was opened with
    (its revocation ends the stream), `expires_at` (epoch seconds) when that key or token expires (the
    stream ends then)."""

    def __init__(self, org: str, queue_name: str | None, names: set[str] | None, job_id: str | None = None,
                 raw: bool = False, wake: Callable[[], None] | None = None, key_id: str | None = None,
                 scope: frozenset[str] | None = None, expires_at: float | None = None):
        self.org, self.queue_name, self.names, self.job_id = org, queue_name, names, job_id
        self.raw, self.wake = raw, wake
        self.buffer: queue.Queue = queue.Queue(maxsize=BUFFER)
        self.dropped = 0
        self.key_id, self.scope, self.expires_at = key_id, scope, expires_at

    def expired(self, now: float) -> bool:
        """Whether the stream's key (or token) has expired at wall-clock `now`."""
        return self.expires_at is not None and now >= self.expires_at

    def wants_name(self, name: str) -> bool:
        return self.names is None or name in self.names or "*" in self.names

    def wants(self, org: str, name: str, queue_name: str | None, job_id: str | None = None) -> bool:
        if org != self.org or not self.wants_name(name):
            return False
        if self.queue_name is not None and queue_name != self.queue_name:
            return False
        if self.scope is not None and queue_name not in self.scope:
            return False
        return self.job_id is None or job_id == self.job_id

    def offer(self, item) -> None:
        try:
            self.buffer.put_nowait(item)
        except queue.Full:
            self.dropped += 1
            return
        if self.wake is not None:
            self.wake()


class Broadcaster:
    """Hands each published event to the subscribers that want it (any thread)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._subs: set[Subscriber] = set()
        self.published = 0
        self._published: dict[str, int] = {}  # per organization
        self._refuse_until: dict[str, float] = {}  # per organization: new streams refused until then

    def subscribe(self, org: str, queue_name: str | None, names: set[str] | None, job_id: str | None = None,
                  raw: bool = False, wake: Callable[[], None] | None = None) -> Subscriber:
        sub = Subscriber(org, queue_name, names, job_id, raw, wake)
        with self._lock:
            self._subs.add(sub)
        return sub

    def subscribe_capped(self, org: str, queue_name: str | None, names: set[str] | None, job_id: str | None,
                         raw: bool, cap: int, key_id: str | None = None, scope: frozenset[str] | None = None,
                         expires_at: float | None = None) -> Subscriber | None:
        """A new subscriber, unless the organization already has `cap` of this kind (`raw`: WebSockets, else
        event streams) open: counted and added under one lock, so parallel opens cannot pass the cap."""
        sub = Subscriber(org, queue_name, names, job_id, raw, key_id=key_id, scope=scope, expires_at=expires_at)
        with self._lock:
            if sum(1 for s in self._subs if s.org == org and s.raw == raw) >= cap:
                return None
            self._subs.add(sub)
        return sub

    def add(self, sub: Subscriber) -> None:
        with self._lock:
            self._subs.add(sub)

    def count_for(self, org: str, raw: bool) -> int:
        """How many of the organization's subscribers are WebSockets (`raw`) or event streams."""
        with self._lock:
            return sum(1 for s in self._subs if s.org == org and s.raw == raw)

    def unsubscribe(self, sub: Subscriber) -> None:
        with self._lock:
            self._subs.discard(sub)

    def count(self, org: str | None = None) -> int:
        """Open streams (of `org`, when given)."""
        with self._lock:
            return sum(1 for s in self._subs if org is None or s.org == org)

    def published_to(self, org: str) -> int:
        with self._lock:
            return self._published.get(org, 0)

    def publish(self, org: str, name: str, variant: str, data: dict) -> None:
        queue_name, job_id = data.get("queue_name"), data.get("job_id")
        with self._lock:
            subs = [s for s in self._subs if s.wants(org, name, queue_name, job_id)]
            self.published += 1
            self._published[org] = self._published.get(org, 0) + 1
        if subs:
            frame = None
            for sub in subs:
                if sub.raw:
                    sub.offer((name, variant, data))
                else:
                    frame = frame or encode(name, variant, data)
                    sub.offer(frame)

    def on_fact(self, org: str, fact: str, data: dict) -> None:
        """A Store listener: publish the realtime events of one committed state change (the module's table).
        With no subscriber nothing is built: a claim or a completion costs one length check here."""
        if not self._subs:
            self.published += 1
            return
        for name, variant, event in realtime_events(fact, data, ts(time.time()) or ""):
            self.publish(org, name, variant, event)

    def refusing(self, org: str | None) -> bool:
        return org is not None and time.monotonic() < self._refuse_until.get(org, 0.0)

    def drop_all(self, org: str, refuse_secs: float = 0.0) -> int:
        """End `org`'s open streams (the clients see the connection close) and refuse its new ones for
        `refuse_secs`; how many there were."""
        with self._lock:
            subs = [s for s in self._subs if s.org == org]
            self._refuse_until[org] = time.monotonic() + refuse_secs
        for sub in subs:
            sub.offer(_END)
        return len(subs)

    def drop_key(self, key_id: str) -> int:
        """End the open streams of one API key (revoked or deactivated); how many there were."""
        with self._lock:
            subs = [s for s in self._subs if s.key_id == key_id]
        for sub in subs:
            sub.offer(_END)
        return len(subs)


def _status(job_id: str, queue: str, old: str, new: str, now: str) -> tuple[str, str, dict]:
    return "job.status", "JobStatusChange", {"job_id": job_id, "queue_name": queue, "old_status": old,
                                             "new_status": new, "timestamp": now}


def realtime_events(fact: str, d: dict, now: str) -> list[tuple[str, str, dict]]:
    """The (name, variant, data) realtime events of one Store fact, fields in the real server's order.

    `job.started` (a claim), `job.released` (a lease lost to expiry, an offline or deregistered worker) and
    `job.dependency_failed` have no event of their own on the real server: they are told as `job.status`.
    Queue pauses and schedule fires have no realtime event (only webhooks).
    """
    if fact == "job.created":
        return [("job.created", "JobCreated", {"job_id": d["job_id"], "queue_name": d["queue_name"],
                                                "priority": d["priority"], "timestamp": now})]
    if fact == "job.started":
        return [_status(d["job_id"], d["queue_name"], "pending", "processing", now)]
    if fact == "job.completed":
        done = {"job_id": d["job_id"], "queue_name": d["queue_name"], "duration_ms": d["duration_ms"],
                "timestamp": now}
        if d.get("result") is not None:
            done["result"] = Fragment(d["result"])
        return [("job.completed", "JobCompleted", done)]
    if fact == "job.failed":
        return [_status(d["job_id"], d["queue_name"], "processing", d["new_status"], now),
                ("job.failed", "JobFailed", {"job_id": d["job_id"], "queue_name": d["queue_name"],
                                             "error": d["error"], "retry_count": d["retry_count"],
                                             "timestamp": now})]
    if fact == "job.released":
        return [_status(d["job_id"], d["queue_name"], "processing", d["new_status"], now)]
    if fact in ("job.cancelled", "job.retried", "job.dependency_failed"):
        new = {"job.cancelled": "cancelled", "job.retried": "pending"}.get(fact) or d["new_status"]
        return [_status(d["job_id"], d["queue_name"], d["old_status"], new, now)]
    if fact == "worker.registered":
        return [("worker.registered", "WorkerRegistered", {"worker_id": d["worker_id"],
                                                           "queue_name": d["queue_name"], "timestamp": now})]
    if fact == "worker.deregistered":
        return [("worker.deregistered", "WorkerDeregistered", {"worker_id": d["worker_id"], "timestamp": now})]
    return []


def encode(name: str, variant: str, data: dict) -> bytes:
    """One SSE event: its name and the enveloped JSON on one data line."""
    payload = exactjson.dumps({"type": variant, "data": data})
    return b"event: " + name.encode() + b"\ndata: " + payload + b"\n\n"


def chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


class EventStream(Streamed):
    """The body of a 200 `text/event-stream` answer, written by the transport's thread through `pump`."""

    def __init__(self, broadcaster: Broadcaster, sub: Subscriber, health_every: float = HEALTH_EVERY,
                 max_stream: float = MAX_STREAM):
        self.broadcaster, self.sub = broadcaster, sub
        self.health_every, self.max_stream = health_every, max_stream

    def pump(self, send: Callable[[bytes], bool], gone: Callable[[], bool]) -> None:
        """Write events as chunks until the client is `gone`, a write fails, the stream is dropped or too old."""
        started = time.monotonic()
        next_health = started + self.health_every
        try:
            if not send(chunk(b":connected\n\n")):
                return
            while not gone():
                now = time.monotonic()
                if now - started >= self.max_stream or self.sub.expired(time.time()):
                    return
                if now >= next_health:
                    next_health = now + self.health_every
                    beat = (encode("system.health", "SystemHealth", {"database": True, "redis": False,
                                                                      "timestamp": ts(time.time())})
                            if self.sub.wants_name("system.health") else b":keepalive\n\n")
                    if not send(chunk(beat)):
                        return
                try:
                    item = self.sub.buffer.get(timeout=min(TICK, max(0.0, next_health - now)))
                except queue.Empty:
                    continue
                if item is _END:
                    return
                frames = [item]
                while len(frames) < 64:  # what else is waiting goes out in the same write
                    try:
                        more = self.sub.buffer.get_nowait()
                    except queue.Empty:
                        break
                    if more is _END:
                        send(chunk(b"".join(frames)))
                        return
                    frames.append(more)
                if not send(chunk(b"".join(frames))):
                    return
        finally:
            self.broadcaster.unsubscribe(self.sub)


TERMINAL = frozenset(("completed", "failed", "deadletter", "cancelled"))
JOB_POLL = 2.0  # seconds between reads of a watched job's status with no event for it (the server's poll)
QUEUE_EVERY = 5.0  # seconds between a queue stream's stats (the server's poll)
_NOTHING = frozenset(("",))  # an event filter no event passes: the subscriber is only counted and droppable


class JobStream(Streamed):
    """`GET /api/v1/events/jobs/{id}`, as the real server answers it: a `job.status` event (JobStatusChange,
    `old_status` "" the first time) whenever the job's status differs from the last one sent, a `:keepalive`
    comment on a read that finds no change, and the end of the stream after a terminal status (completed,
    failed, deadletter, cancelled). A job the organization does not have gets one `error` event ("Job not
    found") and the end. Where the server polls every 2 s, the dev server reads the status at once, on every
    event of the job, and every JOB_POLL seconds."""

    def __init__(self, broadcaster: Broadcaster, sub: Subscriber, status: Callable[[], tuple[str, str] | None],
                 poll: float = JOB_POLL, max_stream: float = MAX_STREAM):
        self.broadcaster, self.sub, self.status = broadcaster, sub, status
        self.poll, self.max_stream = poll, max_stream

    def pump(self, send: Callable[[bytes], bool], gone: Callable[[], bool]) -> None:
        started, last = time.monotonic(), None
        try:
            while not gone() and time.monotonic() - started < self.max_stream:
                found = self.status()
                if found is None:
                    send(chunk(encode("error", "Error", {"message": "Job not found", "timestamp": ts(time.time())})))
                    return
                status, queue_name = found
                if status != last:
                    frame = encode("job.status", "JobStatusChange", {
                        "job_id": self.sub.job_id, "queue_name": queue_name, "old_status": last or "",
                        "new_status": status, "timestamp": ts(time.time())})
                    if not send(chunk(frame)) or status in TERMINAL:
                        return
                    last = status
                elif not send(chunk(b":keepalive\n\n")):
                    return
                if self._wait(started) is _END:
                    return
        finally:
            self.broadcaster.unsubscribe(self.sub)

    def _wait(self, started: float):
        """Until an event of the job arrives (all waiting ones taken), JOB_POLL passes or the stream is dropped."""
        deadline = min(time.monotonic() + self.poll, started + self.max_stream)
        while True:
            try:
                item = self.sub.buffer.get(timeout=max(0.0, min(TICK, deadline - time.monotonic())))
            except queue.Empty:
                if time.monotonic() >= deadline:
                    return None
                continue
            while item is not _END:
                try:
                    item = self.sub.buffer.get_nowait()
                except queue.Empty:
                    return None
            return _END


class QueueStream(Streamed):
    """`GET /api/v1/events/queues/{name}`, as the real server answers it: a `queue.stats` event (QueueStats:
    `queue_name`, `pending` with scheduled jobs, `processing`, `completed`, `failed` with dead-lettered ones,
    `timestamp`) every QUEUE_EVERY seconds, the first at once (the server waits 5 s for its first)."""

    def __init__(self, broadcaster: Broadcaster, sub: Subscriber, queue_name: str,
                 counts: Callable[[], dict[str, int]], every: float = QUEUE_EVERY, max_stream: float = MAX_STREAM):
        self.broadcaster, self.sub, self.queue_name, self.counts = broadcaster, sub, queue_name, counts
        self.every, self.max_stream = every, max_stream

    def pump(self, send: Callable[[bytes], bool], gone: Callable[[], bool]) -> None:
        started = time.monotonic()
        try:
            while not gone() and time.monotonic() - started < self.max_stream:
                stats = {"queue_name": self.queue_name, **self.counts(), "timestamp": ts(time.time())}
                if not send(chunk(encode("queue.stats", "QueueStats", stats))):
                    return
                next_at = time.monotonic() + self.every
                while (left := next_at - time.monotonic()) > 0:
                    try:
                        if self.sub.buffer.get(timeout=min(TICK, left)) is _END:
                            return
                    except queue.Empty:
                        if gone():
                            return
        finally:
            self.broadcaster.unsubscribe(self.sub)
