"""What KEDA does with the shipped ScaledObject: its metrics-api scaler's query against a server, and the
replica count the HPA then asks for."""

from __future__ import annotations

import math
from urllib.parse import urlsplit

import requests
from support.k8s_manifests import one


def scaled_object() -> dict:
    return one("keda-scaledobject.yaml", "ScaledObject")


def triggers() -> dict[str, dict]:
    return {t["metadata"]["valueLocation"]: t for t in scaled_object()["spec"]["triggers"]}


def json_value(body: dict, location: str) -> float:
    """What KEDA's metrics-api scaler reads at `valueLocation` (a gjson dot path) in a JSON answer."""
    value = body
    for part in location.split("."):
        value = value[int(part)] if isinstance(value, list) else value[part]
    assert isinstance(value, int | float) and not isinstance(value, bool), f"{location} is {value!r}, not a number"
    return float(value)


def scaler_query(trigger: dict, base_url: str, token: str) -> float:
    """The scaler's request (metrics_api_scaler.go at v2.20.2): GET the url, `Authorization: Bearer <token>`
    for authMode bearer, any status but 200 an error, then the number at valueLocation."""
    url = urlsplit(trigger["metadata"]["url"])
    assert trigger["metadata"]["authMode"] == "bearer"
    answer = requests.get(base_url + url.path, headers={"Authorization": f"Bearer {token}"}, timeout=10)
    assert answer.status_code == 200, answer.text
    return json_value(answer.json(), trigger["metadata"]["valueLocation"])


def desired_replicas(values: dict[str, float]) -> int:
    """The HPA's answer for AverageValue targets: the largest ceil(value / target), within min and max."""
    spec = scaled_object()["spec"]
    wanted = max(math.ceil(values[loc] / float(t["metadata"]["targetValue"])) for loc, t in triggers().items())
    return min(max(wanted, spec["minReplicaCount"]), spec["maxReplicaCount"])
