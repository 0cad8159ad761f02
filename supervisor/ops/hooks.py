"""What the arbiter reports to the outside: metrics, systemd notify, process title, health port."""

from __future__ import annotations

from supervisor.child.main import set_title
from supervisor.config import Config
from supervisor.ops.health import HealthServer
from supervisor.ops.metrics import DaemonMetrics
from supervisor.ops.notify import Notifier
from supervisor.parent.events import NullHooks

STATUS_EVERY = 2.0  # seconds between systemd STATUS= lines
API_SILENCE_UNHEALTHY = 300.0  # /healthz fails when the API has not answered for this long


class DaemonHooks(NullHooks):
    """Turns arbiter events into metrics, notify messages and titles; serves the health port if asked."""

    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.metrics = DaemonMetrics(queues=cfg.queues)
        self.notifier = Notifier.from_env()
        self.notifier.unset_env()  # children must not inherit NOTIFY_SOCKET
        self.health: HealthServer | None = None
        self._snapshot = None
        self._status_text = ""
        self._status_sent_at = 0.0
        self._gauges_at = 0.0

    def start(self, snapshot) -> None:
        self._snapshot = snapshot
        if self.cfg.health_port is not None:
            self.health = HealthServer(self.cfg.health_host, self.cfg.health_port, snapshot, self.metrics,
                                       max_api_age=API_SILENCE_UNHEALTHY)
            self.health.start()

    def stop(self) -> None:
        if self.health is not None:
            self.health.stop()

    # -- arbiter events --
    def job_finished(self, queue, outcome, duration):
        self.metrics.job_finished(queue, outcome, duration)

    def child_restarted(self, reason):
        self.metrics.child_restarts.inc(reason=reason)

    def child_oom_killed(self):
        self.metrics.oom_kills.inc()

    def lease_renewed(self, outcome):
        self.metrics.lease_renewals.inc(outcome=outcome)

    def claimed(self, count):
        self.metrics.claims.inc()
        self.metrics.jobs_claimed.inc(count)

    def api_request(self, route, status, seconds):
        self.metrics.api_request(route, status or "error", seconds)

    def ready(self, status):
        self.notifier.ready(status)

    def stopping(self):
        self.notifier.stopping()

    def status(self, text):
        set_title(text)
        self._status_text = text

    def tick(self, now):
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
            self.metrics.reserved.set(snap.get("reserved", 0))
            self.metrics.memory(snap.get("memory") or {}, snap["children"])
