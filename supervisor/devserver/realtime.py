"""Server-sent events for `GET /api/v1/events`, answered as the real server does since 0.1.114.

Contract:
- Each event is a named SSE event, `event: <name>` (`job.created`, `system.health`, ...), whose one
  `data:` line is the `{"type": "<Variant>", "data": {...}}` envelope; `JobCreated` carries `job_id`,
  `queue_name`, `priority` and `timestamp` (RFC 3339).
- A subscriber sees only its organization's events, and with `?queue=` only that queue's job events;
  `?events=a,b` keeps only those names (`*` keeps all). Every HEALTH_EVERY seconds the stream sends
  `system.health` if the filter keeps it, else a `:keepalive` comment, so a silent connection is a dead one.
- A stream ends after MAX_STREAM seconds, when the client goes, when the server stops, or on `drop_all`
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

from supervisor import exactjson

from .store import ts
from .transport import Streamed

BUFFER = 1000
HEALTH_EVERY = 10.0  # seconds between system.health events (or keep-alive comments)
MAX_STREAM = 1800.0  # seconds a stream lasts at most
TICK = 1.0  # seconds between checks that the client is still there
_END = object()


class Subscriber:
    """One open stream's filter and its buffer of encoded events."""

    def __init__(self, org: str, queue_name: str | None, names: set[str] | None):
        self.org, self.queue_name, self.names = org, queue_name, names
        self.buffer: queue.Queue = queue.Queue(maxsize=BUFFER)
        self.dropped = 0

    def wants(self, org: str, name: str, queue_name: str | None) -> bool:
        if org != self.org:
            return False
        if self.names is not None and name not in self.names and "*" not in self.names:
            return False
        return self.queue_name is None or queue_name is None or queue_name == self.queue_name

    def offer(self, item) -> None:
        try:
            self.buffer.put_nowait(item)
        except queue.Full:
            self.dropped += 1


class Broadcaster:
    """Hands each published event to the subscribers that want it (any thread)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._subs: set[Subscriber] = set()
        self.published = 0
        self._published: dict[str, int] = {}  # per organization
        self._refuse_until: dict[str, float] = {}  # per organization: new streams refused until then

    def subscribe(self, org: str, queue_name: str | None, names: set[str] | None) -> Subscriber:
        sub = Subscriber(org, queue_name, names)
        with self._lock:
            self._subs.add(sub)
        return sub

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
        queue_name = data.get("queue_name")
        with self._lock:
            subs = [s for s in self._subs if s.wants(org, name, queue_name)]
            self.published += 1
            self._published[org] = self._published.get(org, 0) + 1
        if subs:
            frame = encode(name, variant, data)
            for sub in subs:
                sub.offer(frame)

    def job_created(self, org: str, job_id: str, queue_name: str, priority: int) -> None:
        self.publish(org, "job.created", "JobCreated", {"job_id": job_id, "queue_name": queue_name,
                                                        "priority": priority, "timestamp": ts(time.time())})

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
            while not gone():
                now = time.monotonic()
                if now - started >= self.max_stream:
                    return
                if now >= next_health:
                    next_health = now + self.health_every
                    beat = (encode("system.health", "SystemHealth", {"database": True, "redis": False,
                                                                      "timestamp": ts(time.time())})
                            if self.sub.wants(self.sub.org, "system.health", None) else b":keepalive\n\n")
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
