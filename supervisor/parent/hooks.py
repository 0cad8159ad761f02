"""What the arbiter reports to the outside: metrics, systemd notify, process title, health port."""

from __future__ import annotations

import logging
from collections.abc import Callable
from logging import INFO

from supervisor.config import Config
from supervisor.ops.deletion_cost import PodAnnotator, deletion_cost
from supervisor.ops.health import HealthServer
from supervisor.ops.logs import log_event
from supervisor.ops.metrics import DaemonMetrics
from supervisor.ops.notify import Notifier
from supervisor.ops.nullhooks import NullHooks
from supervisor.ops.title import set_title

STATUS_EVERY = 2.0  # seconds between systemd STATUS= lines
EXTEND_EVERY = 5.0  # seconds between EXTEND_TIMEOUT_USEC messages while reloading or draining


log = logging.getLogger("supervisor")


class DaemonHooks(NullHooks):
    """Turns arbiter events into metrics, notify messages and titles; serves the health port if asked."""

    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.metrics = DaemonMetrics(queues=cfg.queues)
        self.notifier = Notifier.from_env()
        self.notifier.unset_env()  # children must not inherit NOTIFY_SOCKET
        self.health: HealthServer | None = None
        self.annotator = PodAnnotator(cfg.k8s_pod) if cfg.k8s_pod is not None else None
        self._snapshot: Callable[[], dict] | None = None
        self._status_text = ""
        self._status_sent_at = 0.0
        self._gauges_at = 0.0
        self._extended_at: float | None = None
        self._extended_until = 0.0

    def start(self, snapshot: Callable[[], dict], drain: Callable[[], None] | None = None) -> None:
        """Serve the health port if asked; `drain` (thread-safe) is called for POST /drain."""
        self._snapshot = snapshot
        if self.cfg.health_port is not None:
            self.health = HealthServer(self.cfg.health_host, self.cfg.health_port, snapshot, self.metrics,
                                       max_api_silence=self.cfg.ready_api_silence, drain=drain)
            self.health.start()
            log_event(log, INFO, "serving the health port", host=self.cfg.health_host, port=self.health.port)
        if self.annotator is not None:
            self.annotator.start()

    def stop(self) -> None:
        if self.health is not None:
            self.health.stop()
        if self.annotator is not None:
            self.annotator.stop()

    # -- arbiter events --
    def job_settled(self, queue: str, outcome: str, duration: float | None) -> None:
        self.metrics.job_settled(queue, outcome, duration)

    def child_restarted(self, reason: str) -> None:
        self.metrics.child_restarts.inc(reason=reason)

    def child_oom_killed(self) -> None:
        self.metrics.oom_kills.inc()

    def lease_renewed(self, outcome: str) -> None:
        self.metrics.lease_renewals.inc(outcome=outcome)

    def claimed(self, count: int) -> None:
        self.metrics.claims.inc()
        self.metrics.jobs_claimed.inc(count)

    def api_request(self, route: str, status: int | None, seconds: float) -> None:
        self.metrics.api_request(route, status or "error", seconds)

    def ready(self, status: str) -> None:
        self.notifier.ready(status)

    def reloading(self, now: float) -> None:
        self.notifier.reloading(now)

    def stopping(self) -> None:
        self.notifier.stopping()

    def extend_timeout(self, now: float, seconds: float) -> None:
        """Keep systemd's reload or stop timeout from firing while the daemon is still at it: EXTEND_TIMEOUT_USEC
        every EXTEND_EVERY, or at once when the end moves later by more than that (a drain after a reload)."""
        due = self._extended_at is None or now - self._extended_at >= EXTEND_EVERY
        if due or now + seconds > self._extended_until + EXTEND_EVERY:
            self._extended_at, self._extended_until = now, now + seconds
            self.notifier.extend_timeout(seconds)

    def status(self, text: str) -> None:
        set_title(text)
        self._status_text = text

    def tick(self, now: float) -> None:
        if self.notifier.enabled:
            if self._status_text and now - self._status_sent_at >= STATUS_EVERY:
                self._status_sent_at = now
                self.notifier.status(self._status_text.replace("spooled-supervisor: parent ", ""))
            self.notifier.watchdog_if_due(now)
        if self._snapshot is not None and now - self._gauges_at >= 1.0:
            self._gauges_at = now
            snap = self._snapshot()
            self.metrics.inflight.set(snap["inflight"])
            self.metrics.children_alive.set(len(snap["children"]))
            self.metrics.busy_children.set(snap.get("busy", 0))
            self.metrics.reserved.set(snap.get("reserved", 0))
            self.metrics.api_silence.set(snap.get("api_silence_secs", 0.0))
            self.metrics.memory(snap.get("memory") or {}, snap["children"])
            if self.annotator is not None:
                self.annotator.offer(deletion_cost(snap))
