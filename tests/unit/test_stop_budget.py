"""The grace budget holds: every shipped Kubernetes workload and systemd unit gives the daemon at least its
worst-case stop time (supervisor/ops/budget.py) plus a margin, read from the files themselves. A value the
check cannot read fails naming the file and the field."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml
from conftest import ROOT

from supervisor.config import OPTION_BY_DEST
from supervisor.ops.budget import STOP_MARGIN_SECS, StopBudget, stop_budget

K8S_WORKLOADS = [ROOT / "deploy" / "k8s" / "deployment.yaml", ROOT / "deploy" / "k8s" / "job.yaml"]
UNITS = sorted((ROOT / "systemd").glob("*.service"))
TIMINGS = {"drain_timeout": "--drain-timeout", "kill_grace": "--kill-grace", "api_timeout": "--api-timeout"}
_SPAN_UNITS = {"us": 1e-6, "usec": 1e-6, "ms": 1e-3, "msec": 1e-3, "s": 1, "sec": 1, "second": 1, "seconds": 1,
               "m": 60, "min": 60, "minute": 60, "minutes": 60, "h": 3600, "hr": 3600, "hour": 3600, "hours": 3600}


class Malformed(AssertionError):
    """A value in a shipped file the budget check cannot read; the message names the file and the field."""


def timing(path: Path, field: str, dest: str, raw) -> float:
    """A daemon timing setting as the daemon parses it."""
    try:
        return float(OPTION_BY_DEST[dest].parse(str(raw)))
    except ValueError as exc:
        raise Malformed(f"{path.name}: {field} {exc}, got {raw!r}") from None


def workload_budget(path: Path) -> tuple[float, float]:
    """(terminationGracePeriodSeconds, the stop budget) of the one workload in a manifest."""
    (doc,) = [d for d in yaml.safe_load_all(path.read_text()) if d]
    pod = doc["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in c.get("env", [])}
    args = c.get("args", [])
    values = {}
    for dest, flag in TIMINGS.items():
        var = OPTION_BY_DEST[dest].env
        if flag in args:
            values[dest] = timing(path, f"args {flag}", dest, args[args.index(flag) + 1])
        elif env.get(var) is not None:
            values[dest] = timing(path, f"env {var}", dest, env[var])
        else:
            values[dest] = float(OPTION_BY_DEST[dest].default)
    prestop = (c.get("lifecycle") or {}).get("preStop")
    budget = stop_budget(**values, drain_request=prestop is not None).total
    if prestop is not None:
        command = prestop.get("exec", {}).get("command", [])
        if command[-1:] != ["drain"]:
            raise Malformed(f"{path.name}: lifecycle.preStop.exec.command {command!r} is not the drain command")
    grace = pod.get("terminationGracePeriodSeconds", 30)
    if not isinstance(grace, int) or isinstance(grace, bool) or grace < 0:
        raise Malformed(f"{path.name}: spec.template.spec.terminationGracePeriodSeconds must be a whole number of "
                        f"seconds, got {grace!r}")
    return float(grace), budget


def span(path: Path, key: str, text: str) -> float:
    """A systemd time span (`45`, `45s`, `1min 30s`, `infinity`) in seconds."""
    text = text.strip()
    if text == "infinity":
        return float("inf")
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", text)
    if not parts or re.sub(r"(\d+(?:\.\d+)?)\s*([a-z]*)", "", text).strip() or \
            any(unit and unit not in _SPAN_UNITS for _, unit in parts):
        raise Malformed(f"{path.name}: {key}= is not a systemd time span, got {text!r}")
    return sum(float(n) * _SPAN_UNITS[unit or "s"] for n, unit in parts)


def unit_budget(path: Path) -> tuple[float, float]:
    """(TimeoutStopSec, the stop budget) of a unit, with the settings of its Environment= lines."""
    service: dict[str, str] = {}
    env: dict[str, str] = {}
    section = None
    for line in path.read_text().splitlines():
        line = line.strip()
        if line.startswith("["):
            section = line
        elif section == "[Service]" and "=" in line and not line.startswith("#"):
            key, value = line.split("=", 1)
            service[key.strip()] = value.strip()
            if key.strip() == "Environment":
                env.update(item.split("=", 1) for item in shlex.split(value) if "=" in item)
    values = {dest: timing(path, f"Environment= {OPTION_BY_DEST[dest].env}", dest, env[OPTION_BY_DEST[dest].env])
              if OPTION_BY_DEST[dest].env in env else float(OPTION_BY_DEST[dest].default) for dest in TIMINGS}
    stop = service.get("TimeoutStopSec", service.get("TimeoutSec"))
    if stop is None:
        raise Malformed(f"{path.name}: [Service] has no TimeoutStopSec= (systemd's default of 90 s would not be "
                        "checked)")
    return span(path, "TimeoutStopSec", stop), stop_budget(**values).total


def wanted(budget: float) -> float:
    return StopBudget(0.0, budget, 0.0, 0.0, 0.0).wanted  # the margin rule of supervisor/ops/budget.py


@pytest.mark.parametrize("path", K8S_WORKLOADS, ids=lambda p: p.name)
def test_kubernetes_grace_period_covers_the_stop_budget(path):
    grace, budget = workload_budget(path)
    assert grace >= wanted(budget) >= budget + STOP_MARGIN_SECS, \
        f"{path.name}: terminationGracePeriodSeconds {grace:g} does not cover the stop budget {budget:g} s with margin"


@pytest.mark.parametrize("path", UNITS, ids=lambda p: p.name)
def test_systemd_stop_timeout_covers_the_stop_budget(path):
    stop, budget = unit_budget(path)
    assert stop >= wanted(budget), f"{path.name}: TimeoutStopSec {stop:g} does not cover the stop budget {budget:g} s"


def test_the_units_are_all_checked():
    assert {p.name for p in UNITS} >= {"spooled-supervisor.service", "spooled-supervisor@.service"}


def test_the_formula():
    budget = stop_budget(25, 3, 10, drain_request=True)
    assert (budget.drain_request, budget.deregister, budget.total) == (3.0, 10.0, 43.0)
    assert stop_budget(25, 3, 2).total == 25 + 3 + 2 * 2 + 2  # a deregister attempt waits the API timeout at most
    assert not budget.covers(47.9) and budget.covers(48.0)  # 5 s margin: 10% of 43 s is less


def test_a_shorter_grace_period_fails(tmp_path):
    path = tmp_path / "deployment.yaml"
    path.write_text(K8S_WORKLOADS[0].read_text().replace("terminationGracePeriodSeconds: 60",
                                                         "terminationGracePeriodSeconds: 45"))
    grace, budget = workload_budget(path)
    assert grace < wanted(budget)


@pytest.mark.parametrize("old,new,named", [
    ("terminationGracePeriodSeconds: 60", "terminationGracePeriodSeconds: soon",
     "deployment.yaml: spec.template.spec.terminationGracePeriodSeconds must be a whole number"),
    ('value: "25"', 'value: "25 s"', "deployment.yaml: env SPOOLED_DRAIN_TIMEOUT must be between 0 and 86400, got '"),
    ('["python", "-m", "supervisor", "drain"]', '["sleep", "5"]', "deployment.yaml: lifecycle.preStop.exec.command"),
])
def test_a_malformed_manifest_value_names_file_and_field(tmp_path, old, new, named):
    path = tmp_path / "deployment.yaml"
    text = K8S_WORKLOADS[0].read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))
    with pytest.raises(Malformed, match=re.escape(named)):
        workload_budget(path)


@pytest.mark.parametrize("old,new,named", [
    ("TimeoutStopSec=45", "TimeoutStopSec=45 parsecs", "spooled-supervisor.service: TimeoutStopSec= is not"),
    ("SPOOLED_DRAIN_TIMEOUT=25", "SPOOLED_DRAIN_TIMEOUT=-4",
     "spooled-supervisor.service: Environment= SPOOLED_DRAIN_TIMEOUT must be between 0 and 86400"),
])
def test_a_malformed_unit_value_names_file_and_field(tmp_path, old, new, named):
    path = tmp_path / "spooled-supervisor.service"
    text = (ROOT / "systemd" / "spooled-supervisor.service").read_text()
    assert old in text
    path.write_text(text.replace(old, new))
    with pytest.raises(Malformed, match=re.escape(named)):
        unit_budget(path)


def test_spans():
    p = Path("x.service")
    assert span(p, "T", "45") == 45 and span(p, "T", "1min 30s") == 90 and span(p, "T", "500ms") == 0.5
