"""The Prometheus registry: render the text format, parse it back and check values."""

from __future__ import annotations

import re
import threading

import pytest

from supervisor.ops.metrics import JOB_OUTCOMES, RESTART_REASONS, Counter, DaemonMetrics, Gauge, Histogram, Registry

SAMPLE_RX = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$')
LABEL_RX = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def unescape(value: str) -> str:
    return re.sub(r"\\(.)", lambda m: {"n": "\n"}.get(m.group(1), m.group(1)), value)


def parse(text: str) -> tuple[dict, dict, dict]:
    """Text format 0.0.4 -> ({(name, frozenset(labels)): value}, {name: type}, {name: help})."""
    samples, types, helps = {}, {}, {}
    assert text.endswith("\n")
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name, _, help_ = line[7:].partition(" ")
            helps[name] = help_
        elif line.startswith("# TYPE "):
            name, _, type_ = line[7:].partition(" ")
            types[name] = type_
        else:
            m = SAMPLE_RX.match(line)
            assert m, f"bad sample line: {line!r}"
            labels = {k: unescape(v) for k, v in LABEL_RX.findall(m.group(3) or "")}
            if m.group(3):
                # every character of the label block must be accounted for by well-formed pairs
                rebuilt = ",".join(f'{k}="{v}"' for k, v in LABEL_RX.findall(m.group(3)))
                assert rebuilt == m.group(3), line
            samples[(m.group(1), frozenset(labels.items()))] = float(m.group(4))
    return samples, types, helps


def val(samples: dict, name: str, **labels) -> float:
    return samples[(name, frozenset({k: str(v) for k, v in labels.items()}.items()))]


def test_counter_gauge_and_escaping():
    reg = Registry()
    c = reg.counter("t_requests_total", "Requests.\nSecond line \\ here.", ("route", "status"))
    g = reg.gauge("t_temperature", "Temp.")
    c.inc(route='GET /a"b\\c\nd', status=200)
    c.inc(2, route='GET /a"b\\c\nd', status=200)
    c.inc(route="GET /x", status=503)
    g.set(2.5)
    g.dec(1)
    text = reg.render()
    samples, types, helps = parse(text)
    assert val(samples, "t_requests_total", route='GET /a"b\\c\nd', status=200) == 3
    assert val(samples, "t_requests_total", route="GET /x", status=503) == 1
    assert val(samples, "t_temperature") == 1.5
    assert types == {"t_requests_total": "counter", "t_temperature": "gauge"}
    assert helps["t_requests_total"] == "Requests.\\nSecond line \\\\ here."
    assert '\\"' in text and "\\n" in text


def test_counter_rejects_bad_use():
    c = Counter("t_total", "x", ("a",))
    with pytest.raises(ValueError):
        c.inc(-1, a="1")
    with pytest.raises(ValueError):
        c.inc(b="1")
    with pytest.raises(ValueError):
        c.inc(a="1", b="2")
    with pytest.raises(ValueError):
        Histogram("t_h", "x", ("le",))


def test_unlabelled_metrics_are_exported_at_zero():
    reg = Registry()
    reg.counter("t_claims_total", "x")
    reg.gauge("t_alive", "x")
    samples, _, _ = parse(reg.render())
    assert val(samples, "t_claims_total") == 0
    assert val(samples, "t_alive") == 0


def test_histogram_buckets_sum_count():
    reg = Registry()
    h = reg.histogram("t_seconds", "x", ("queue",), buckets=(0.1, 1, 10))
    for v in (0.05, 0.1, 0.5, 5, 50):
        h.observe(v, queue="q")
    samples, types, _ = parse(reg.render())
    assert types["t_seconds"] == "histogram"
    assert val(samples, "t_seconds_bucket", queue="q", le="0.1") == 2  # le is inclusive
    assert val(samples, "t_seconds_bucket", queue="q", le="1") == 3
    assert val(samples, "t_seconds_bucket", queue="q", le="10") == 4
    assert val(samples, "t_seconds_bucket", queue="q", le="+Inf") == 5
    assert val(samples, "t_seconds_count", queue="q") == 5
    assert val(samples, "t_seconds_sum", queue="q") == pytest.approx(55.65)


def test_daemon_metrics_names_and_preset_series():
    m = DaemonMetrics(queues=["emails"])
    m.job_settled("emails", "completed", 0.25)
    m.job_settled("emails", "timed_out", 3600.0)
    m.job_settled("emails", "lease_lost", None)
    m.inflight.set(3)
    m.children_alive.set(4)
    m.child_restarts.inc(reason="max_memory")
    m.lease_renewals.inc(outcome="ok")
    m.api_request("POST /api/v1/jobs/claim", 200, 0.02)
    m.api_request("POST /api/v1/jobs/claim", "error", 10.0)
    m.claims.inc()
    m.jobs_claimed.inc(3)
    samples, types, _ = parse(m.render())
    p = "spooled_supervisor_"
    assert all(name.startswith(p) for name in types)
    assert val(samples, p + "jobs_total", queue="emails", outcome="completed") == 1
    assert val(samples, p + "jobs_total", queue="emails", outcome="timed_out") == 1
    assert val(samples, p + "jobs_total", queue="emails", outcome="lease_lost") == 1
    for outcome in JOB_OUTCOMES:  # every outcome exported from the start
        assert (p + "jobs_total", frozenset({"queue": "emails", "outcome": outcome}.items())) in samples
    for reason in RESTART_REASONS:
        assert (p + "child_restarts_total", frozenset({"reason": reason}.items())) in samples
    assert val(samples, p + "child_restarts_total", reason="max_memory") == 1
    assert val(samples, p + "job_duration_seconds_count", queue="emails") == 2
    assert val(samples, p + "job_duration_seconds_bucket", queue="emails", le="0.001") == 0
    assert val(samples, p + "job_duration_seconds_bucket", queue="emails", le="3600") == 2
    assert val(samples, p + "inflight_jobs") == 3
    assert val(samples, p + "children_alive") == 4
    assert val(samples, p + "lease_renewals_total", outcome="ok") == 1
    assert val(samples, p + "lease_renewals_total", outcome="lost") == 0
    assert val(samples, p + "api_requests_total", route="POST /api/v1/jobs/claim", status="200") == 1
    assert val(samples, p + "api_requests_total", route="POST /api/v1/jobs/claim", status="error") == 1
    assert val(samples, p + "api_request_duration_seconds_count", route="POST /api/v1/jobs/claim") == 2
    assert val(samples, p + "claims_total") == 1
    assert val(samples, p + "jobs_claimed_total") == 3
    with pytest.raises(ValueError):
        m.job_settled("emails", "exploded", 1.0)


def test_render_while_updating_from_another_thread():
    """Updates on one thread, renders on another: every render parses and histograms stay consistent."""
    m = DaemonMetrics(queues=["q"])
    stop = threading.Event()

    def writer():
        i = 0
        while not stop.is_set():
            m.job_settled("q", "completed", (i % 100) / 10)
            m.api_request(f"route-{i % 50}", 200, 0.01)
            i += 1

    t = threading.Thread(target=writer)
    t.start()
    try:
        for _ in range(50):
            samples, _, _ = parse(m.render())
            count = val(samples, "spooled_supervisor_job_duration_seconds_count", queue="q")
            inf = val(samples, "spooled_supervisor_job_duration_seconds_bucket", queue="q", le="+Inf")
            assert count == inf
    finally:
        stop.set()
        t.join()
    assert val(parse(m.render())[0], "spooled_supervisor_jobs_total", queue="q", outcome="completed") > 0


def test_gauge_is_not_a_counter():
    g = Gauge("t_g", "x")
    g.inc(5)
    g.dec(7)
    assert g.value() == -2
