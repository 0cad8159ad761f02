"""The KEDA autoscaling manifest and the run-to-empty Job: schemas, invariants, and the scaler's query end to end.

The KEDA objects are validated against KEDA's own published CRD schemas (tests/schemas/keda-<version>/, the
version the manifest names); the Job against the Kubernetes schemas, as tests/integration/test_deploy_manifests.py does.
"""

from __future__ import annotations

import copy
import re
from urllib.parse import urlsplit

import jsonschema
import kubernetes_validate
import pytest
import requests
import yaml
from conftest import ROOT
from kubernetes_validate.utils import latest_version
from support.k8s_manifests import K8S, env_of, flag, load_docs, one
from support.keda_scaler import desired_replicas, scaled_object, scaler_query, triggers

from supervisor import exitcodes
from supervisor.config import build_parser
from supervisor.ops.budget import stop_budget

SCHEMAS = ROOT / "tests" / "schemas"
K8S_VERSIONS = ["1.27.0", latest_version()]
KILL_GRACE = 3.0
CRD_FILES = {"ScaledObject": "keda.sh_scaledobjects.yaml",
             "TriggerAuthentication": "keda.sh_triggerauthentications.yaml"}


def by_kind(name: str) -> dict[str, dict]:
    return {d["kind"]: d for d in load_docs(name)}


def container_of(workload: dict) -> dict:
    (c,) = workload["spec"]["template"]["spec"]["containers"]
    return c




def drain_budget() -> float:
    """The longest a removed worker pod takes to go: the stop budget with the preStop drain request."""
    c = container_of(one("deployment.yaml", "Deployment"))
    assert c["lifecycle"]["preStop"]["exec"]["command"][-1] == "drain"
    return stop_budget(float(env_of(c)["SPOOLED_DRAIN_TIMEOUT"]["value"]), KILL_GRACE, 10.0, drain_request=True).total


# --- KEDA: the schema of the version the manifest names ------------------------------------------------

def keda_version() -> str:
    m = re.search(r"KEDA v(\d+\.\d+\.\d+)", (K8S / "keda-scaledobject.yaml").read_text())
    assert m, "keda-scaledobject.yaml must name the KEDA version it is written against"
    return m.group(1)


def strict(schema: dict) -> dict:
    """A structural CRD schema as the API server applies it with strict field validation: unknown fields fail."""
    schema = copy.deepcopy(schema)

    def walk(node):
        if isinstance(node, dict):
            if ("properties" in node and "additionalProperties" not in node
                    and not node.get("x-kubernetes-preserve-unknown-fields")):
                node["additionalProperties"] = False
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema)
    return schema


def crd_validator(kind: str, api_version: str) -> jsonschema.Draft7Validator:
    crd = yaml.safe_load((SCHEMAS / f"keda-{keda_version()}" / CRD_FILES[kind]).read_text())
    assert crd["spec"]["names"]["kind"] == kind
    group, _, version = api_version.partition("/")
    assert crd["spec"]["group"] == group
    (served,) = [v for v in crd["spec"]["versions"] if v["name"] == version and v["served"]]
    spec_schema = strict(served["schema"]["openAPIV3Schema"])
    spec_schema["properties"]["metadata"] = {"type": "object"}  # checked against Kubernetes' ObjectMeta instead
    return jsonschema.Draft7Validator(spec_schema)


def test_the_named_keda_version_has_its_schemas_under_tests():
    directory = SCHEMAS / f"keda-{keda_version()}"
    assert sorted(p.name for p in directory.iterdir()) == sorted(CRD_FILES.values())
    assert f"keda-{keda_version()}" in (SCHEMAS / "README.md").read_text()
    assert f"v{keda_version()}" in (SCHEMAS / "README.md").read_text()


@pytest.mark.parametrize("kind", sorted(CRD_FILES))
def test_keda_objects_validate_against_kedas_crd_schema(kind):
    doc = one("keda-scaledobject.yaml", kind)
    validator = crd_validator(kind, doc["apiVersion"])
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)]
    assert errors == []
    for version in K8S_VERSIONS:  # the object's metadata, as any Kubernetes object's
        kubernetes_validate.validate({"apiVersion": "v1", "kind": "ConfigMap", "metadata": doc["metadata"]},
                                     version, strict=True)


def test_the_crd_schema_check_catches_mistakes():
    """Negative controls: a misspelt field, a missing required field and a bad enum value all fail."""
    doc = one("keda-scaledobject.yaml", "ScaledObject")
    validator = crd_validator("ScaledObject", doc["apiVersion"])
    typo = copy.deepcopy(doc)
    typo["spec"]["minReplicas"] = typo["spec"].pop("minReplicaCount")
    missing = copy.deepcopy(doc)
    del missing["spec"]["triggers"][0]["metadata"]
    bad_enum = copy.deepcopy(doc)
    bad_enum["spec"]["fallback"]["behavior"] = "sometimes"
    for broken in (typo, missing, bad_enum):
        assert list(validator.iter_errors(broken)), broken["spec"]


# --- KEDA: what the objects mean ----------------------------------------------------------------------

def test_scales_the_deployment_on_the_queue_stats_route():
    deployment = one("deployment.yaml", "Deployment")
    spec = scaled_object()["spec"]
    assert spec["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                      "name": deployment["metadata"]["name"]}
    env = env_of(container_of(deployment))
    stats_url = f"{env['SPOOLED_API_URL']['value'].rstrip('/')}/api/v1/queues/{env['SPOOLED_QUEUE']['value']}/stats"
    assert "pending_jobs" in triggers()
    for trigger in spec["triggers"]:
        meta = trigger["metadata"]
        assert trigger["type"] == "metrics-api" and trigger["metricType"] == "AverageValue"
        assert (meta["url"], meta["format"], meta["authMode"]) == (stats_url, "json", "bearer")
        assert float(meta["targetValue"]) > 0
    # never on processing_jobs: the stats route counts claimed-ahead jobs there (tests/integration/test_keda_scaling.py)
    assert set(triggers()) == {"pending_jobs"}


def test_bearer_token_comes_from_the_existing_secret():
    auth = one("keda-scaledobject.yaml", "TriggerAuthentication")
    (secret,) = load_docs("secret.example.yaml")
    (ref,) = auth["spec"]["secretTargetRef"]
    assert ref["parameter"] in ("token", "bearerToken")  # KEDA's names for the bearer token
    assert ref["name"] == secret["metadata"]["name"] and ref["key"] in secret["stringData"]
    pod = one("deployment.yaml", "Deployment")["spec"]["template"]["spec"]
    mounted = {v["secret"]["secretName"]: [i["key"] for i in v["secret"]["items"]]
               for v in pod["volumes"] if "secret" in v}
    assert ref["key"] in mounted[ref["name"]]  # the very key the workers use
    for trigger in scaled_object()["spec"]["triggers"]:
        assert trigger["authenticationRef"] == {"name": auth["metadata"]["name"]}


def test_replica_bounds_and_scale_down_outlast_a_drain():
    spec = scaled_object()["spec"]
    pod = one("deployment.yaml", "Deployment")["spec"]["template"]["spec"]
    assert 1 <= spec["minReplicaCount"] < spec["maxReplicaCount"] <= 50
    assert spec["minReplicaCount"] <= spec["fallback"]["replicas"] <= spec["maxReplicaCount"]
    longest_exit = max(drain_budget(), pod["terminationGracePeriodSeconds"])
    assert spec["cooldownPeriod"] > longest_exit
    scale_down = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"]
    assert scale_down["stabilizationWindowSeconds"] > longest_exit
    assert all(p["periodSeconds"] > longest_exit for p in scale_down["policies"])


def test_kustomization_keeps_the_hpa_and_leaves_keda_and_the_job_out():
    """KEDA and the HPA must not scale the same Deployment, and the Job is a one-off: both are applied by hand."""
    k = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert "hpa.yaml" in k["resources"] and (K8S / "hpa.yaml").is_file()
    assert "keda-scaledobject.yaml" not in k["resources"] and "job.yaml" not in k["resources"]
    assert "kubectl delete hpa" in (K8S / "keda-scaledobject.yaml").read_text()


# --- KEDA: the scaler's query against the real dev server ---------------------------------------------

def test_the_scalers_query_reads_the_pending_count_from_the_dev_server(dev_server):
    queue = urlsplit(triggers()["pending_jobs"]["metadata"]["url"]).path.split("/")[-2]
    for i in range(27):
        dev_server.enqueue(queue, {"n": i})
    dev_server.enqueue("another-queue", {"n": 0})
    r = dev_server.request("POST", "/api/v1/workers/register", json={"queue_name": queue, "hostname": "h",
                                                                      "worker_id": "keda-w"})
    assert r.status_code == 201
    claimed = dev_server.request("POST", "/api/v1/jobs/claim", json={"queue_name": queue, "worker_id": "keda-w",
                                                                      "limit": 5}).json()["jobs"]
    assert len(claimed) == 5

    values = {loc: scaler_query(t, dev_server.url, dev_server.api_key) for loc, t in triggers().items()}
    assert values == {"pending_jobs": 22.0}  # the 5 claimed jobs are not counted
    assert desired_replicas(values) == 3  # ceil(22 / 10)
    assert desired_replicas({"pending_jobs": 0.0}) == scaled_object()["spec"]["minReplicaCount"]
    denied = requests.get(dev_server.url + urlsplit(triggers()["pending_jobs"]["metadata"]["url"]).path, timeout=10)
    assert denied.status_code == 401  # without the TriggerAuthentication's token the scaler gets nothing


# --- The run-to-empty Job ------------------------------------------------------------------------------

def job() -> dict:
    (doc,) = load_docs("job.yaml")
    return doc


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_job_validates_offline(version):
    kubernetes_validate.validate(job(), version, strict=True)


def test_job_runs_the_daemon_until_the_queue_is_empty():
    c = container_of(job())
    args = c["args"]
    assert args[0] == "run"
    assert "--until-empty" in args or env_of(c).get("SPOOLED_UNTIL_EMPTY", {}).get("value") in ("1", "true")
    build_parser({}).parse_args(args[1:])  # every flag is one the daemon knows (argparse exits 2 otherwise)
    assert int(flag(args, "--procs")) == float(c["resources"]["requests"]["cpu"])


def test_job_does_not_retry_configuration_errors():
    spec = job()["spec"]
    assert spec["template"]["spec"]["restartPolicy"] == "Never"  # podFailurePolicy needs it; retries are new pods
    fail_job = [r for r in spec["podFailurePolicy"]["rules"] if r["action"] == "FailJob"]
    codes = {code for rule in fail_job for code in rule["onExitCodes"]["values"]}
    assert codes == {exitcodes.CONFIG, exitcodes.HANDLER_IMPORT, exitcodes.AUTH, exitcodes.WORKER_ID_CONFLICT}
    assert all(r["onExitCodes"]["containerName"] == container_of(job())["name"] for r in fail_job)
    assert spec["backoffLimit"] >= 1 and spec["activeDeadlineSeconds"] > 0


def test_job_uses_the_workers_image_key_and_hardening():
    deployment = one("deployment.yaml", "Deployment")
    worker, batch = container_of(deployment), container_of(job())
    assert batch["image"] == worker["image"]
    for name in ("SPOOLED_API_URL", "SPOOLED_QUEUE", "SPOOLED_HANDLER", "SPOOLED_API_KEY_FILE", "SPOOLED_WORKER_ID"):
        assert env_of(batch)[name] == env_of(worker)[name], name
    assert "SPOOLED_API_KEY" not in env_of(batch)
    assert batch["securityContext"] == worker["securityContext"]
    assert batch["volumeMounts"] == worker["volumeMounts"]
    pod, worker_pod = job()["spec"]["template"]["spec"], deployment["spec"]["template"]["spec"]
    assert pod["volumes"] == worker_pod["volumes"] and pod["securityContext"] == worker_pod["securityContext"]
    assert pod["terminationGracePeriodSeconds"] > float(env_of(batch)["SPOOLED_DRAIN_TIMEOUT"]["value"]) + KILL_GRACE


def test_job_pods_are_not_counted_as_worker_pods():
    """The Deployment's selector and the PDB must not match the Job's pods (the PDB would count them)."""
    labels = job()["spec"]["template"]["metadata"]["labels"]
    selectors = [one("deployment.yaml", "Deployment")["spec"]["selector"]["matchLabels"]]
    selectors += [one("pdb.yaml", "PodDisruptionBudget")["spec"]["selector"]["matchLabels"]]
    for selector in selectors:
        assert not selector.items() <= labels.items()
