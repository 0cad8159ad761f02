"""Deployment artefacts: Kubernetes manifests (schema + invariants), the Dockerfile, the systemd unit."""

from __future__ import annotations

import configparser
import re
import shlex
import shutil
import subprocess
import sys

import kubernetes_validate
import pytest
import yaml
from conftest import ROOT
from kubernetes_validate.utils import latest_version
from support.k8s_manifests import K8S, env_of, flag, load_docs

from supervisor import exitcodes

UNIT = ROOT / "systemd" / "spooled-supervisor.service"
DEFAULT_DRAIN_TIMEOUT = 25.0
KILL_GRACE = 3.0  # the daemon's default SIGTERM→SIGKILL gap for children
K8S_VERSIONS = ["1.27.0", latest_version()]  # oldest supported cluster, newest schemas shipped
MANIFESTS = ["deployment.yaml", "secret.example.yaml", "pdb.yaml", "hpa.yaml"]


def deployment() -> dict:
    (doc,) = load_docs("deployment.yaml")
    return doc


def container() -> dict:
    (c,) = deployment()["spec"]["template"]["spec"]["containers"]
    return c


def cpu_cores(quantity: str) -> float:
    quantity = str(quantity)
    return int(quantity[:-1]) / 1000 if quantity.endswith("m") else float(quantity)


# --- Kubernetes: schemas -------------------------------------------------------------------------

@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("name", MANIFESTS)
def test_manifest_validates_offline(name, version):
    docs = load_docs(name)
    assert docs
    for doc in docs:
        kubernetes_validate.validate(doc, version, strict=True)  # raises on any schema error


def test_strict_validation_rejects_unknown_fields():
    """Negative control: the validator really checks (a typo'd field must fail)."""
    doc = deployment()
    doc["spec"]["template"]["spec"]["containers"][0]["livenessProbes"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, latest_version(), strict=True)


def test_kustomization_lists_the_applied_manifests():
    k = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert k["kind"] == "Kustomization"
    assert sorted(k["resources"]) == ["deployment.yaml", "hpa.yaml", "pdb.yaml"]  # the Secret is applied by hand
    for res in k["resources"]:
        assert (K8S / res).is_file()
    image_names = {i["name"] for i in k.get("images", [])}
    assert container()["image"].split(":")[0] in image_names


# --- Kubernetes: the deployment's invariants ------------------------------------------------------

def test_prestop_drains_through_the_health_port():
    """The preStop hook does the drain (tests/unit/test_stop_budget.py checks the grace period covers it)."""
    c = container()
    assert c["lifecycle"]["preStop"]["exec"]["command"] == ["python", "-m", "supervisor", "drain"]
    assert "SPOOLED_HEALTH_PORT" in env_of(c)  # where the drain command finds the daemon


def test_procs_come_from_the_cpu_limit():
    """No hard-coded --procs: the daemon sizes its pool from the cgroup quota the CPU limit sets."""
    c = container()
    assert flag(c["args"], "--procs") is None and "SPOOLED_PROCS" not in env_of(c)
    assert cpu_cores(c["resources"]["limits"]["cpu"]) == cpu_cores(c["resources"]["requests"]["cpu"])


def test_worker_id_from_pod_name_and_key_from_secret():
    c = container()
    env = env_of(c)
    assert env["SPOOLED_WORKER_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert "SPOOLED_API_KEY" not in env or "secretKeyRef" in env["SPOOLED_API_KEY"].get("valueFrom", {})
    key_file = env["SPOOLED_API_KEY_FILE"]["value"]
    pod = deployment()["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mount = next(m for m in c["volumeMounts"] if key_file.startswith(m["mountPath"].rstrip("/") + "/"))
    secret = volumes[mount["name"]]["secret"]
    (secret_doc,) = load_docs("secret.example.yaml")
    assert secret["secretName"] == secret_doc["metadata"]["name"]
    item = next(i for i in secret["items"] if key_file.endswith("/" + i["path"]))
    assert item["key"] in secret_doc["stringData"]


def test_probes_on_the_health_port():
    c = container()
    port = int(env_of(c)["SPOOLED_HEALTH_PORT"]["value"])
    named = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert flag(c["args"], "--health-host") == "0.0.0.0"
    expected = {"livenessProbe": "/healthz", "readinessProbe": "/readyz", "startupProbe": "/healthz"}
    for probe, path in expected.items():
        get = c[probe]["httpGet"]
        assert get["path"] == path
        assert named.get(get["port"], get["port"]) == port


def test_security_context_locked_down():
    pod = deployment()["spec"]["template"]["spec"]
    sc = container()["securityContext"]
    assert sc["runAsNonRoot"] is True or pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"].get("runAsUser", 1) != 0
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"] and not sc["capabilities"].get("add")
    seccomp = sc.get("seccompProfile") or pod["securityContext"]["seccompProfile"]
    assert seccomp["type"] == "RuntimeDefault"
    tmp = next(m for m in container()["volumeMounts"] if m["mountPath"] == "/tmp")
    assert "emptyDir" in {v["name"]: v for v in pod["volumes"]}[tmp["name"]]


def test_selectors_pdb_and_hpa_target_the_deployment():
    dep = deployment()
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert dep["spec"]["selector"]["matchLabels"].items() <= labels.items()
    (pdb,) = load_docs("pdb.yaml")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    (hpa,) = load_docs("hpa.yaml")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": dep["metadata"]["name"],
    }
    assert [m["resource"]["name"] for m in hpa["spec"]["metrics"]] == ["cpu"]


def test_dockerfile_builds_the_named_image_as_non_root():
    text = (ROOT / "deploy" / "Dockerfile").read_text()
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]
    froms = [line.split()[1] for line in lines if line.upper().startswith("FROM ")]
    assert froms and all(f == "python:3.11-slim" for f in froms)
    user = [line.split()[1] for line in lines if line.upper().startswith("USER ")][-1]
    uid = user.split(":")[0]
    assert uid.isdigit() and int(uid) != 0
    assert int(uid) == deployment()["spec"]["template"]["spec"]["securityContext"]["runAsUser"]
    entry = next(line for line in lines if line.upper().startswith("ENTRYPOINT "))
    assert yaml.safe_load(entry.split(None, 1)[1]) == ["python", "-m", "supervisor"]
    assert any(re.search(r"pip install \.(\s|$|&)", line) for line in lines)
    image = container()["image"]
    assert f"-t {image} " in text  # the documented build command tags the image the Deployment runs


# --- systemd -------------------------------------------------------------------------------------


def unit() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None, empty_lines_in_values=False)
    parser.optionxform = str  # systemd keys are case-sensitive
    parser.read_string(UNIT.read_text())
    return parser


def unit_env(service) -> dict:
    return dict(item.split("=", 1) for item in shlex.split(service.get("Environment", "")))


def test_unit_notify_and_stop_semantics():
    s = unit()["Service"]
    assert s["Type"] == "notify"
    assert s["NotifyAccess"] == "exec"  # the daemon and ExecReload's command, never the handler's children
    assert s["ExecReload"].split()[:4] == ["/opt/spooled-supervisor/venv/bin/python", "-m", "supervisor", "reload"]
    assert s["KillMode"] == "mixed"
    assert s.get("KillSignal", "SIGTERM") == "SIGTERM"
    drain = float(unit_env(s).get("SPOOLED_DRAIN_TIMEOUT", DEFAULT_DRAIN_TIMEOUT))
    assert float(s["TimeoutStopSec"]) > drain + KILL_GRACE
    assert s["Restart"] == "on-failure"
    prevented = {int(code) for code in s["RestartPreventExitStatus"].split()}
    assert prevented >= {exitcodes.CONFIG, exitcodes.HANDLER_IMPORT, exitcodes.AUTH, exitcodes.WORKER_ID_CONFLICT}
    assert exitcodes.FAILURE not in prevented
    assert s["ExecStart"].split()[:3] == ["/opt/spooled-supervisor/venv/bin/python", "-m", "supervisor"]
    assert s["LoadCredential"].split(":")[0] == "spooled-api-key"
    assert "--api-key" not in s["ExecStart"]


def test_unit_hardening():
    s = unit()["Service"]
    expected = {
        "DynamicUser": "yes",
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "CapabilityBoundingSet": "",
        "AmbientCapabilities": "",
        "ProtectKernelTunables": "yes",
        "ProtectKernelModules": "yes",
        "ProtectKernelLogs": "yes",
        "ProtectControlGroups": "yes",
        "LockPersonality": "yes",
        "RestrictRealtime": "yes",
        "RestrictSUIDSGID": "yes",
        "SystemCallArchitectures": "native",
    }
    for key, value in expected.items():
        assert s.get(key) == value, key
    assert set(s["RestrictAddressFamilies"].split()) == {"AF_UNIX", "AF_INET", "AF_INET6"}
    assert "MemoryDenyWriteExecute" not in s  # would break ctypes callbacks (libffi closures) and JITs


def verify_copy(tmp_path, extra: str = ""):
    """The unit with ExecStart pointed at an existing interpreter (verify checks it exists)."""
    text = UNIT.read_text().replace("/opt/spooled-supervisor/venv/bin/python", sys.executable)
    if extra:
        text = text.replace("[Service]\n", "[Service]\n" + extra + "\n", 1)
    path = tmp_path / UNIT.name
    path.write_text(text)
    return path


SYSTEMD_ANALYZE = shutil.which("systemd-analyze")
needs_systemd_analyze = pytest.mark.skipif(SYSTEMD_ANALYZE is None, reason="systemd-analyze not installed")


@needs_systemd_analyze
def test_systemd_analyze_verify_passes_cleanly(tmp_path):
    path = verify_copy(tmp_path)
    out = subprocess.run([SYSTEMD_ANALYZE, "verify", "--man=no", str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    complaints = [line for line in (out.stdout + out.stderr).splitlines() if UNIT.name in line]
    assert complaints == []  # verify only warns (rc 0) about unknown keys or bad values


@needs_systemd_analyze
def test_systemd_analyze_verify_would_catch_a_bad_key(tmp_path):
    """Negative control for the test above: a typo'd key is reported against the unit."""
    path = verify_copy(tmp_path, extra="KillMod=mixed")
    out = subprocess.run([SYSTEMD_ANALYZE, "verify", "--man=no", str(path)], capture_output=True, text=True, timeout=60)
    assert any(UNIT.name in line and "KillMod" in line for line in (out.stdout + out.stderr).splitlines())


@needs_systemd_analyze
def test_systemd_security_exposure_stays_low(tmp_path):
    path = verify_copy(tmp_path)
    out = subprocess.run(
        [SYSTEMD_ANALYZE, "security", "--offline=yes", "--threshold=20", "--no-pager", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr  # exposure <= 2.0 ("OK")
