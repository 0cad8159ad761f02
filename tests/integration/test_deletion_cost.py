"""Idle pods go first (`--k8s-deletion-cost`): the pod's deletion-cost annotation is kept current through the
Kubernetes API as the API documents it. A local HTTPS server with a CA made here stands in for the API
server and checks each request: PATCH /api/v1/namespaces/<ns>/pods/<name>, `Authorization: Bearer <the
service-account token>`, `Content-Type: application/merge-patch+json`, a merge patch of
metadata.annotations whose value is a string, over TLS verified against the service account's ca.crt."""

from __future__ import annotations

import json
import logging
import os
import ssl
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from conftest import ROOT, Daemon, wait_until

from supervisor.ops.deletion_cost import (
    ANNOTATION,
    PER_JOB,
    CostPolicy,
    PodAnnotator,
    PodRef,
    deletion_cost,
    in_cluster,
)

NAMESPACE, POD = "jobs-ns", "spooled-supervisor-7d9f-abcde"


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_ca(d: Path, name: str) -> tuple[Path, Path]:
    """A CA and a server certificate it signed for 127.0.0.1: (ca.crt, server.pem with key)."""
    d.mkdir(parents=True, exist_ok=True)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2", "-subj", f"/CN={name}",
            "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=d)
    openssl("req", *ec, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=kubernetes", cwd=d)
    (d / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:kubernetes.default.svc\n"
                               "basicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", "server.crt", "-days", "2", "-extfile", "ext.cnf", cwd=d)
    (d / "server.pem").write_text((d / "server.crt").read_text() + (d / "server.key").read_text())
    return d / "ca.crt", d / "server.pem"


class FakeKubeAPI:
    """An HTTPS server answering the pod PATCH as the API server does; records every request it was sent and
    every TLS handshake that failed. `status` sets the next answers' status."""

    def __init__(self, server_pem: Path):
        self.requests: list[dict] = []
        self.tls_failures = 0
        self.status = 200
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_PATCH(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                api.requests.append({"method": "PATCH", "path": self.path, "headers": dict(self.headers),
                                     "body": json.loads(body)})
                self.answer(api.status)

            def do_GET(self):
                api.requests.append({"method": "GET", "path": self.path, "headers": dict(self.headers)})
                self.answer(405)

            def answer(self, status: int):
                if status == 200:
                    payload = {"kind": "Pod", "apiVersion": "v1", "metadata": {"name": POD, "namespace": NAMESPACE}}
                else:
                    payload = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": status,
                               "message": f'pods "{POD}" is forbidden: User "system:serviceaccount:{NAMESPACE}:'
                                          f'default" cannot patch resource "pods"' if status == 403 else "boom"}
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request, client_address):
                api.tls_failures += 1

        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(server_pem)
        self.server = Server(("127.0.0.1", 0), Handler)
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True, do_handshake_on_connect=False)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def values(self) -> list[str]:
        return [r["body"]["metadata"]["annotations"][ANNOTATION] for r in self.requests if r["method"] == "PATCH"]

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    root = tmp_path_factory.mktemp("pki")
    return {"good": make_ca(root / "good", "cluster-ca"), "other": make_ca(root / "other", "another-ca")}


@pytest.fixture
def service_account(tmp_path, pki):
    sa = tmp_path / "serviceaccount"
    sa.mkdir()
    (sa / "token").write_text("eyJhbGciOiJSUzI1NiJ9.service-account-token.sig\n")
    (sa / "ca.crt").write_text(pki["good"][0].read_text())
    (sa / "namespace").write_text(NAMESPACE)
    return sa


def api_with(pki, which: str = "good"):
    return FakeKubeAPI(pki[which][1])


def pod_ref(sa: Path, port: int) -> PodRef:
    return in_cluster({"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(port),
                       "SPOOLED_K8S_SERVICEACCOUNT_DIR": str(sa), "POD_NAME": POD})


def check_request(request: dict, token: str, value: str) -> None:
    """One request exactly as the Kubernetes API documents a pod merge patch."""
    assert request["method"] == "PATCH"
    assert request["path"] == f"/api/v1/namespaces/{NAMESPACE}/pods/{POD}"
    headers = {k.lower(): v for k, v in request["headers"].items()}
    assert headers["authorization"] == f"Bearer {token}"
    assert headers["content-type"] == "application/merge-patch+json"
    assert headers["accept"] == "application/json"
    assert request["body"] == {"metadata": {"annotations": {ANNOTATION: value}}}


@pytest.mark.timeout(30)
def test_the_annotation_follows_the_figure_as_a_documented_merge_patch(pki, service_account):
    api = api_with(pki)
    annotator = PodAnnotator(pod_ref(service_account, api.port), min_interval=0.1).start()
    try:
        annotator.offer(0)
        wait_until(lambda: api.values() == ["0"], timeout=10, what="the first patch")
        check_request(api.requests[0], "eyJhbGciOiJSUzI1NiJ9.service-account-token.sig", "0")
        annotator.offer(2001)
        annotator.offer(2001)  # the same figure again: no second patch for it
        wait_until(lambda: api.values() == ["0", "2001"], timeout=10, what="the busy figure")
        (service_account / "token").write_text("rotated-token")  # projected tokens rotate: read for every request
        annotator.offer(0)
        wait_until(lambda: api.values() == ["0", "2001", "0"], timeout=10, what="idle again")
        check_request(api.requests[-1], "rotated-token", "0")
    finally:
        annotator.stop()
        api.stop()
    assert len(api.requests) == 3


@pytest.mark.timeout(30)
def test_a_403_is_logged_once_with_the_role_and_turns_the_feature_off(pki, service_account, caplog):
    api = api_with(pki)
    api.status = 403
    annotator = PodAnnotator(pod_ref(service_account, api.port), min_interval=0.05).start()
    try:
        with caplog.at_level(logging.DEBUG, logger="supervisor"):
            annotator.offer(1000)
            wait_until(lambda: annotator.policy.off, timeout=10, what="the feature off")
            for cost in (0, 1000, 2000):
                annotator.offer(cost)
            annotator.stop()
    finally:
        api.stop()
    assert len(api.requests) == 1
    lines = [r.getMessage() for r in caplog.records if "deletion cost" in r.getMessage()]
    assert len(lines) == 1 and "403" in lines[0] and "components/deletion-cost" in lines[0]


@pytest.mark.timeout(30)
def test_a_server_the_service_account_ca_did_not_sign_is_refused(pki, service_account, caplog):
    api = api_with(pki, "other")
    annotator = PodAnnotator(pod_ref(service_account, api.port), min_interval=0.05).start()
    try:
        with caplog.at_level(logging.DEBUG, logger="supervisor"):
            annotator.offer(1000)
            wait_until(lambda: annotator.policy.failures >= 3, timeout=15, what="three refused attempts")
    finally:
        annotator.stop()
        api.stop()
    assert api.requests == []  # nothing, the token included, was sent to an unverified server
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "CERTIFICATE_VERIFY_FAILED" in warnings[0].fields["error"]  # type: ignore[attr-defined]


@pytest.mark.timeout(30)
def test_failures_are_logged_once_retried_and_recovery_is_said(pki, service_account, caplog):
    api = api_with(pki)
    api.status = 500
    annotator = PodAnnotator(pod_ref(service_account, api.port), min_interval=0.05).start()
    try:
        with caplog.at_level(logging.DEBUG, logger="supervisor"):
            annotator.offer(1000)
            wait_until(lambda: len(api.requests) >= 2, timeout=15, what="a retry")
            api.status = 200
            wait_until(lambda: annotator.policy.sent == 1000, timeout=15, what="the retry to succeed")
    finally:
        annotator.stop()
        api.stop()
    messages = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    assert messages.count("pod deletion cost: the annotation could not be set; retrying with back-off") == 1
    assert messages[-1] == "pod deletion cost: the Kubernetes API takes the annotation again"


def test_the_figure_and_when_to_send_it():
    idle = {"children": [{"state": "idle", "job_runtime_secs": None}, {"state": "starting"}]}
    assert deletion_cost(idle) == 0
    busy = {"children": [{"state": "busy", "job_runtime_secs": 30.0}, {"state": "busy", "job_runtime_secs": 610.0}]}
    assert deletion_cost(busy) == 2 * PER_JOB + 10  # two jobs, the oldest ten minutes old
    assert deletion_cost({"children": [{"state": "busy", "job_runtime_secs": 1e9}]}) == 2 * PER_JOB - 1
    policy = CostPolicy(min_interval=5.0)
    assert policy.wait(0, 100.0) == 0.0 and policy.wait(None, 100.0) is None  # nothing offered yet
    policy.succeeded(0, 100.0)
    assert policy.wait(0, 200.0) is None  # unchanged: nothing to send
    assert policy.wait(1000, 104.0) == pytest.approx(1.0) and policy.wait(1000, 105.0) == 0.0  # at most every 5 s
    policy.failed(105.0)
    assert policy.wait(1000, 105.0) >= 5.0  # back-off, never shorter than the interval
    policy.forbid()
    assert policy.wait(1000, 1e9) is None


def run_daemon_config(env: dict) -> subprocess.CompletedProcess:
    base = {"PATH": os.environ["PATH"], "SPOOLED_API_KEY": "sp_test_" + "1" * 40, "HOME": "/nonexistent"}
    return subprocess.run([sys.executable, "-m", "supervisor", "run", "--queue", "q", "--handler",
                           "supervisor.demo_handlers:noop", "--k8s-deletion-cost", "--api-url", "http://127.0.0.1:9"],
                          cwd=ROOT, capture_output=True, text=True, timeout=30, env={**base, **env})


def test_outside_a_pod_it_exits_2_naming_what_is_missing(tmp_path):
    out = run_daemon_config({"SPOOLED_K8S_SERVICEACCOUNT_DIR": str(tmp_path / "none")})
    assert out.returncode == 2
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith("error: --k8s-deletion-cost needs a Kubernetes pod")
    for missing in ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT", str(tmp_path / "none" / "token"),
                    str(tmp_path / "none" / "ca.crt"), "POD_NAMESPACE"):
        assert missing in line


@pytest.mark.timeout(60)
def test_a_daemon_marks_its_pod_busy_while_it_runs_a_job_and_idle_after(dev_server, pki, service_account):
    api = api_with(pki)
    env = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(api.port), "POD_NAME": POD,
           "SPOOLED_K8S_SERVICEACCOUNT_DIR": str(service_account)}
    d = Daemon(dev_server, "q-cost", procs=2, worker_id="w-cost", args=["--k8s-deletion-cost"], env=env).start()
    try:
        d.wait_ready()
        wait_until(lambda: api.values()[:1] == ["0"], timeout=15, what="the idle figure")
        job = dev_server.enqueue("q-cost", {"do": "sleep", "secs": 7})
        wait_until(lambda: str(PER_JOB) in api.values(), timeout=20, what="the busy figure")
        wait_until(lambda: dev_server.job(job)["status"] == "completed", timeout=20, what="the job done")
        wait_until(lambda: api.values()[-1] == "0", timeout=20, what="idle again")
        for request in api.requests:
            check_request(request, "eyJhbGciOiJSUzI1NiJ9.service-account-token.sig", request["body"]["metadata"]
                          ["annotations"][ANNOTATION])
        assert api.values() == ["0", str(PER_JOB), "0"]  # each figure once: patched only on a change
    finally:
        d.stop()
        api.stop()
