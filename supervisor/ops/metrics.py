"""A small Prometheus registry (text format 0.0.4) and the daemon's metric set; stdlib only.

Metrics are updated from the daemon's loop thread and rendered from the health thread. Each metric
guards its samples with its own lock, held for a dict lookup and an add, so an update stays cheap
and a render never sees a half-written histogram.
"""

from __future__ import annotations

import math
import threading
from bisect import bisect_left
from collections.abc import Iterable, Sequence
from typing import Any, TypeVar

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# 1 ms ... 1 h: CPU-bound jobs range from trivial to long batch work.
JOB_DURATION_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
API_DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)

JOB_OUTCOMES = ("completed", "failed", "timed_out", "lease_lost", "crashed")
RESTART_REASONS = ("crashed", "timeout", "lease_lost", "max_jobs", "max_memory", "reload", "boot_failed", "resize",
                   "memory_pressure")
PRESSURE_STATES = ("ok", "high", "max")
RENEWAL_OUTCOMES = ("ok", "lost", "error")


def format_value(value: float) -> str:
    """A sample value as Prometheus writes it: integers bare, +Inf/-Inf/NaN spelled out."""
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer()):
        return str(int(value))
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def escape_label_value(value: str) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _label_text(names: Sequence[str], values: Sequence[str], extra: str = "") -> str:
    parts = [f'{n}="{escape_label_value(v)}"' for n, v in zip(names, values, strict=False)]
    if extra:
        parts.append(extra)
    return "{" + ",".join(parts) + "}" if parts else ""


class Metric:
    """A named metric family; samples are keyed by the tuple of label values, in `labelnames` order."""

    type_name = "untyped"

    def __init__(self, name: str, help_: str, labelnames: Sequence[str] = ()):
        self.name = name
        self.help = help_
        self.labelnames = tuple(labelnames)
        self._lock = threading.Lock()
        self._values: dict[tuple, Any] = {}  # label values -> a number, or a histogram's [counts, sum, count]

    def _key(self, labels: dict) -> tuple:
        """The label-value tuple; raises ValueError when the label names do not match exactly."""
        if len(labels) != len(self.labelnames):
            raise ValueError(f"{self.name}: expected labels {self.labelnames}, got {tuple(labels)}")
        try:
            return tuple([str(labels[n]) for n in self.labelnames])
        except KeyError:
            raise ValueError(f"{self.name}: expected labels {self.labelnames}, got {tuple(labels)}") from None

    def _snapshot(self) -> list[tuple[tuple, Any]]:
        with self._lock:
            return [(k, self._copy(v)) for k, v in self._values.items()]

    @staticmethod
    def _copy(value):
        return value

    def render(self) -> list[str]:
        lines = [f"# HELP {self.name} {escape_help(self.help)}", f"# TYPE {self.name} {self.type_name}"]
        for key, value in sorted(self._snapshot()):
            lines.extend(self._sample_lines(key, value))
        return lines

    def _sample_lines(self, key: tuple, value) -> Iterable[str]:
        return [f"{self.name}{_label_text(self.labelnames, key)} {format_value(value)}"]


class Counter(Metric):
    """Monotonic count. A counter without labels starts at 0 so it is exported before its first inc."""

    type_name = "counter"

    def __init__(self, name: str, help_: str, labelnames: Sequence[str] = ()):
        super().__init__(name, help_, labelnames)
        if not self.labelnames:
            self._values[()] = 0

    def inc(self, amount: float = 1, **labels) -> None:
        if amount < 0:
            raise ValueError(f"{self.name}: counters only go up (got {amount})")
        key = self._key(labels)
        with self._lock:
            self._values[key] = self._values.get(key, 0) + amount

    def inc_key(self, key: tuple, amount: float = 1) -> None:
        """`inc` for a caller that already holds the label values as a tuple of str, in declared order."""
        with self._lock:
            self._values[key] = self._values.get(key, 0) + amount

    def touch(self, **labels) -> None:
        """Export this label set at 0 before its first inc, so rate() sees the series from the start."""
        key = self._key(labels)
        with self._lock:
            self._values.setdefault(key, 0)

    def value(self, **labels) -> float:
        with self._lock:
            return self._values.get(self._key(labels), 0)


class Gauge(Counter):
    """A value that goes up and down."""

    type_name = "gauge"

    def inc(self, amount: float = 1, **labels) -> None:
        key = self._key(labels)
        with self._lock:
            self._values[key] = self._values.get(key, 0) + amount

    def dec(self, amount: float = 1, **labels) -> None:
        self.inc(-amount, **labels)

    def set(self, value: float, **labels) -> None:
        key = self._key(labels)
        with self._lock:
            self._values[key] = value

    def set_all(self, samples: dict[tuple, float]) -> None:
        """Replace every sample at once (label-value tuples in declared order): series not given disappear."""
        with self._lock:
            self._values = dict(samples)


class Histogram(Metric):
    """Observations counted into cumulative `le` buckets, plus `_sum` and `_count`."""

    type_name = "histogram"

    def __init__(self, name: str, help_: str, labelnames: Sequence[str] = (),
                 buckets: Sequence[float] = JOB_DURATION_BUCKETS):
        if "le" in labelnames:
            raise ValueError("'le' is reserved for histogram buckets")
        super().__init__(name, help_, labelnames)
        self.buckets = tuple(sorted(float(b) for b in buckets if not math.isinf(b)))

    def observe(self, value: float, **labels) -> None:
        self.observe_key(self._key(labels), value)

    def observe_key(self, key: tuple, value: float) -> None:
        """`observe` for a caller that already holds the label values as a tuple of str, in declared order."""
        index = bisect_left(self.buckets, value)  # first bucket with le >= value; len() means +Inf
        with self._lock:
            state = self._values.get(key)
            if state is None:
                state = self._values[key] = [[0] * (len(self.buckets) + 1), 0.0, 0]
            state[0][index] += 1
            state[1] += value
            state[2] += 1

    @staticmethod
    def _copy(state):
        return [list(state[0]), state[1], state[2]]

    def _sample_lines(self, key: tuple, state) -> Iterable[str]:
        counts, total, count = state
        lines, cumulative = [], 0
        for bound, n in zip((*self.buckets, math.inf), counts, strict=True):  # counts has one slot per bucket + Inf
            cumulative += n
            le = 'le="' + format_value(bound) + '"'
            lines.append(f"{self.name}_bucket{_label_text(self.labelnames, key, le)} {cumulative}")
        labels = _label_text(self.labelnames, key)
        lines.append(f"{self.name}_sum{labels} {format_value(total)}")
        lines.append(f"{self.name}_count{labels} {count}")
        return lines


M = TypeVar("M", bound=Metric)


class Registry:
    """An ordered set of metrics rendered together."""

    def __init__(self):
        self._metrics: dict[str, Metric] = {}

    def register(self, metric: M) -> M:
        if metric.name in self._metrics:
            raise ValueError(f"metric {metric.name} registered twice")
        self._metrics[metric.name] = metric
        return metric

    def counter(self, name: str, help_: str, labelnames: Sequence[str] = ()) -> Counter:
        return self.register(Counter(name, help_, labelnames))

    def gauge(self, name: str, help_: str, labelnames: Sequence[str] = ()) -> Gauge:
        return self.register(Gauge(name, help_, labelnames))

    def histogram(self, name: str, help_: str, labelnames: Sequence[str] = (),
                  buckets: Sequence[float] = JOB_DURATION_BUCKETS) -> Histogram:
        return self.register(Histogram(name, help_, labelnames, buckets))

    def render(self) -> str:
        """The whole registry in Prometheus text format 0.0.4 (ends with a newline)."""
        lines: list[str] = []
        for metric in list(self._metrics.values()):
            lines.extend(metric.render())
        return "\n".join(lines) + "\n"


class DaemonMetrics:
    """The supervisor's metric set (`spooled_supervisor_*`), fed by the daemon's loop.

    Route labels must be templates (e.g. "POST /api/v1/jobs/{id}/complete"), never raw ids.
    """

    PREFIX = "spooled_supervisor_"

    def __init__(self, queues: Iterable[str] = ()):
        p = self.PREFIX
        r = self.registry = Registry()
        self.jobs = r.counter(p + "jobs_total", "Jobs finished, by queue and outcome.", ("queue", "outcome"))
        self.job_duration = r.histogram(p + "job_duration_seconds", "Time a child spent running a job.", ("queue",),
                                        JOB_DURATION_BUCKETS)
        self.inflight = r.gauge(p + "inflight_jobs", "Jobs this daemon holds: running, reserved or being reported.")
        self.children_alive = r.gauge(p + "children_alive", "Child processes currently alive.")
        self.busy_children = r.gauge(p + "busy_children", "Children running a job now (the reserve not counted).")
        self.reserved = r.gauge(p + "reserved_jobs",
                                "Jobs claimed ahead and not yet started (the claim-ahead reserve).")
        self.api_silence = r.gauge(p + "api_last_answer_age_seconds",
                                   "Seconds since the Spooled API last answered (since start if it never has).")
        self.child_restarts = r.counter(p + "child_restarts_total", "Children replaced, by reason.", ("reason",))
        self.lease_renewals = r.counter(p + "lease_renewals_total", "Lease renewals, by outcome.", ("outcome",))
        self.api_requests = r.counter(p + "api_requests_total", "Spooled API requests, by route and HTTP status.",
                                      ("route", "status"))
        self.api_duration = r.histogram(p + "api_request_duration_seconds", "Spooled API request latency.", ("route",),
                                        API_DURATION_BUCKETS)
        self.claims = r.counter(p + "claims_total", "Claim requests sent.")
        self.jobs_claimed = r.counter(p + "jobs_claimed_total", "Jobs received from claim requests.")
        self.oom_kills = r.counter(p + "oom_kills_total", "Children killed by the kernel OOM killer.")
        self.memory_used = r.gauge(p + "memory_used_bytes", "Memory in use where the daemon runs: its cgroup's, "
                                   "else the host's.")
        self.memory_limit = r.gauge(p + "memory_limit_bytes", "The memory limit that usage counts against.")
        self.memory_pressure = r.gauge(p + "memory_pressure", "1 for the current memory pressure state (ok: "
                                       "working; high: claims paused; max: shedding running jobs).", ("state",))
        self.child_memory = r.gauge(p + "child_memory_bytes", "Memory of each child's process tree (PSS, else "
                                    "RSS), at the last sample.", ("slot",))
        for state in PRESSURE_STATES:
            self.memory_pressure.set(1 if state == "ok" else 0, state=state)
        for reason in RESTART_REASONS:
            self.child_restarts.touch(reason=reason)
        for outcome in RENEWAL_OUTCOMES:
            self.lease_renewals.touch(outcome=outcome)
        for queue in queues:
            self.add_queue(queue)

    def add_queue(self, queue: str) -> None:
        """Export every outcome of `queue` at 0 before its first job."""
        for outcome in JOB_OUTCOMES:
            self.jobs.touch(queue=queue, outcome=outcome)

    def job_settled(self, queue: str, outcome: str, duration_secs: float | None) -> None:
        """One job settled: count its outcome and, when known, its run time."""
        if outcome not in JOB_OUTCOMES:
            raise ValueError(f"unknown job outcome {outcome!r}")
        self.jobs.inc_key((queue, outcome))  # label order as declared: queue, outcome
        if duration_secs is not None:
            self.job_duration.observe_key((queue,), duration_secs)

    def api_request(self, route: str, status: int | str, duration_secs: float) -> None:
        """One API call finished; `status` is the HTTP code, or a word like "error" for no response."""
        self.api_requests.inc_key((route, str(status)))  # label order as declared: route, status
        self.api_duration.observe_key((route,), duration_secs)

    def memory(self, status: dict, children: list[dict]) -> None:
        """Set the memory gauges from /status's `memory` part and its children."""
        for state in PRESSURE_STATES:
            self.memory_pressure.set(1 if status.get("state") == state else 0, state=state)
        if "used_bytes" in status:
            self.memory_used.set(status["used_bytes"])
            self.memory_limit.set(status["limit_bytes"])
        self.child_memory.set_all({(str(c["slot"]),): c["memory_bytes"] for c in children
                                   if c.get("memory_bytes") is not None})

    def render(self) -> str:
        return self.registry.render()
