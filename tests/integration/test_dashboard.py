"""deploy/grafana/spooled-supervisor.json: a well-formed Grafana dashboard whose every query names metrics and
labels a real daemon exports, read from the `/metrics` answer of a daemon that has just run jobs."""

from __future__ import annotations

import json
import re

import pytest
import requests
from conftest import ROOT, wait_for_status, wait_until

pytestmark = pytest.mark.timeout(90)

DASHBOARD = ROOT / "deploy" / "grafana" / "spooled-supervisor.json"
METRIC_RX = re.compile(r"\b(spooled_supervisor_[a-z_]+)\b")
SELECTOR_RX = re.compile(r"\b(spooled_supervisor_[a-z_]+)\{([^}]*)\}")
MATCHER_RX = re.compile(r'([a-zA-Z_]\w*)\s*(?:=~|!~|!=|=)\s*"')
BY_RX = re.compile(r"\bby\s*\(([^)]*)\)")
LABEL_VALUES_RX = re.compile(r"label_values\((\w+),\s*(\w+)\)")
HISTOGRAM_PARTS = ("_bucket", "_sum", "_count")
TARGET_LABELS = {"instance", "job"}  # added by the Prometheus scrape, not by the daemon
PANEL_TYPES = {"row", "timeseries", "stat", "gauge", "bargauge", "table", "heatmap", "text"}


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def query_panels() -> list[dict]:
    return [p for p in dashboard()["panels"] if p["type"] != "row"]


def exprs() -> list[str]:
    return [t["expr"] for p in query_panels() for t in p["targets"]]


def test_it_is_a_grafana_dashboard_with_queries_in_every_panel():
    d = dashboard()
    assert d["title"] and d["uid"] and isinstance(d["schemaVersion"], int) and d["schemaVersion"] >= 36
    panels = d["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    cells = set()
    for p in panels:
        assert p["type"] in PANEL_TYPES and p["title"]
        pos = p["gridPos"]
        assert pos["x"] >= 0 and pos["w"] > 0 and pos["x"] + pos["w"] <= 24 and pos["h"] > 0
        here = {(x, y) for x in range(pos["x"], pos["x"] + pos["w"]) for y in range(pos["y"], pos["y"] + pos["h"])}
        assert not cells & here, f"panel {p['title']!r} overlaps another"
        cells |= here
        if p["type"] == "row":
            continue
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert p["targets"] and len({t["refId"] for t in p["targets"]}) == len(p["targets"])
        for t in p["targets"]:
            assert METRIC_RX.search(t["expr"]) and t["expr"].count("(") == t["expr"].count(")"), t["expr"]
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    used = " ".join(exprs())
    assert all(f"${name}" in used for name in variables if name != "datasource")  # no unused variable


def test_it_covers_what_an_operator_asks():
    titles = {p["title"] for p in query_panels()}
    for wanted in ("Throughput by outcome", "Job duration percentiles", "Busy vs total children",
                   "Child restarts by reason", "Lease renewals by outcome", "API errors by route",
                   "API latency by route (p50 / p99)", "Reserved jobs (claim-ahead)"):
        assert wanted in titles
    text = " ".join(exprs())
    for q in ("0.5", "0.9", "0.99"):
        assert f"histogram_quantile({q}, sum by (le) (rate(spooled_supervisor_job_duration_seconds_bucket" in text


def scrape(text: str) -> tuple[dict[str, str], dict[str, set[str]]]:
    """/metrics text -> ({family: type}, {family: label names seen on its samples})."""
    types = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            name, kind = line[7:].split()
            types[name] = kind
    labels: dict[str, set[str]] = {name: set() for name in types}
    for line in text.splitlines():
        sample = re.match(r"([a-z_:]+)(?:\{(.*)\})? ", line)
        family = sample and family_of(sample.group(1), types)
        if family:
            labels[family].update(re.findall(r'(\w+)="', sample.group(2) or ""))
    return types, labels


def family_of(name: str, types: dict[str, str]) -> str | None:
    if name in types:
        return name
    for suffix in HISTOGRAM_PARTS:
        base = name[: -len(suffix)]
        if name.endswith(suffix) and types.get(base) == "histogram":
            return base
    return None


@pytest.fixture
def live_metrics(dev_server, daemon_factory) -> str:
    """The /metrics answer of a real daemon after it completed jobs, failed one and renewed nothing yet."""
    ids = [dev_server.enqueue("dash", {"do": "cpu", "ms": 20}) for _ in range(4)]
    ids.append(dev_server.enqueue("dash", {"do": "raise"}, max_retries=0))
    daemon = daemon_factory("dash", procs=2, worker_id="dash-worker", args=["--health-port", "0"]).wait_ready()
    port = daemon.health_port
    wait_for_status(dev_server, ids, statuses=("completed", "deadletter"), timeout=30)
    url = f"http://127.0.0.1:{port}/metrics"

    def settled_metrics():
        text = requests.get(url, timeout=5).text
        return text if 'outcome="failed"} 1' in text and 'outcome="completed"} 4' in text else None

    return wait_until(settled_metrics, timeout=15, interval=0.2, what="the five jobs in /metrics")


def test_every_metric_the_dashboard_queries_is_exported_by_a_live_daemon(live_metrics):
    types, _ = scrape(live_metrics)
    queried = set(METRIC_RX.findall(" ".join(exprs())))
    for v in dashboard()["templating"]["list"]:
        queried.update(name for name, _ in LABEL_VALUES_RX.findall(v.get("definition", "")))
    missing = sorted(name for name in queried if family_of(name, types) is None)
    assert missing == [], f"not exported by the daemon: {missing}"
    for name in queried:  # histogram parts only of histograms; rate() never of a gauge
        family = family_of(name, types)
        if name != family:
            assert types[family] == "histogram", name
        if types[family] == "gauge":
            assert not re.search(rf"(rate|increase)\({name}\b", " ".join(exprs())), name


def test_every_label_the_dashboard_uses_is_on_the_metrics_it_queries(live_metrics):
    types, labels = scrape(live_metrics)
    for expr in exprs():
        families = {family_of(n, types) for n in METRIC_RX.findall(expr)} - {None}
        known = set().union(*(labels[f] for f in families)) | TARGET_LABELS | {"le"}
        used = {name for _, inner in SELECTOR_RX.findall(expr) for name in MATCHER_RX.findall(inner)}
        used |= {name.strip() for group in BY_RX.findall(expr) for name in group.split(",") if name.strip()}
        assert used <= known, f"{expr}: labels {sorted(used - known)} are not on {sorted(families)}"
    for v in dashboard()["templating"]["list"]:
        for name, label in LABEL_VALUES_RX.findall(v.get("definition", "")):
            assert label in labels.get(name, set()) | TARGET_LABELS, (name, label)
