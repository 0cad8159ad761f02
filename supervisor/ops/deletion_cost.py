"""Idle pods go first: keep this pod's `controller.kubernetes.io/pod-deletion-cost` annotation current
(`--k8s-deletion-cost`), so that a ReplicaSet scaling down removes idle pods before busy ones.

The figure (`deletion_cost`) is 0 for an idle daemon and grows with the jobs it runs and their age. A
background thread (`PodAnnotator`) sends it to the Kubernetes API as a JSON merge patch of the pod's
metadata, only when it changed and at most every MIN_INTERVAL seconds; the loop only hands it the latest
figure (`offer`), so the API's speed never touches the job path. Failures are logged once and retried with
back-off; a 403 (no RBAC) is logged once with the Role to apply and turns the feature off.

In a pod the API is reached as client-go's in-cluster config does: https://$KUBERNETES_SERVICE_HOST:
$KUBERNETES_SERVICE_PORT, the service account's token as a bearer token (read again for every request:
projected tokens rotate), its ca.crt to verify the server, and the namespace file; the pod's name from
POD_NAME (downward API) or HOSTNAME.
"""

from __future__ import annotations

import http.client
import json
import logging
import socket
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from logging import DEBUG, INFO, WARNING
from pathlib import Path
from urllib.parse import quote

from supervisor import __version__
from supervisor.backoff import backoff
from supervisor.ops.logs import log_event

log = logging.getLogger("supervisor")

ANNOTATION = "controller.kubernetes.io/pod-deletion-cost"
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
SERVICE_ACCOUNT_DIR_ENV = "SPOOLED_K8S_SERVICEACCOUNT_DIR"  # another mount point for the files above (tests)
MIN_INTERVAL = 5.0  # seconds between two patches at least
REQUEST_TIMEOUT = 10.0
RETRY_CAP = 120.0
PER_JOB = 1000  # cost of each running job; the oldest job's age in minutes (up to PER_JOB - 1) is added
ROLE_HINT = ("give this pod's service account a Role to get and patch pods in its namespace: add the kustomize "
             "component deploy/k8s/components/deletion-cost (kubectl apply -k deploy/k8s-deletion-cost)")


class NotInPod(Exception):
    """--k8s-deletion-cost outside a pod; str() names what is missing."""


@dataclass(frozen=True)
class PodRef:
    """Where this pod's object lives in the Kubernetes API, and how to authenticate there."""

    host: str
    port: int
    namespace: str
    name: str
    token_path: str
    ca_path: str

    @property
    def path(self) -> str:
        return f"/api/v1/namespaces/{quote(self.namespace, safe='')}/pods/{quote(self.name, safe='')}"


def in_cluster(environ: Mapping[str, str]) -> PodRef:
    """The pod's API coordinates from the environment and the service-account mount; raises NotInPod
    naming everything that is missing."""
    sa = Path(environ.get(SERVICE_ACCOUNT_DIR_ENV) or SERVICE_ACCOUNT_DIR)
    missing = [name for name in ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT") if not environ.get(name)]
    missing += [str(sa / f) for f in ("token", "ca.crt") if not (sa / f).is_file()]
    namespace = environ.get("POD_NAMESPACE", "").strip()
    if not namespace:
        try:
            namespace = (sa / "namespace").read_text().strip()
        except OSError:
            missing.append(f"POD_NAMESPACE or {sa / 'namespace'}")
    name = (environ.get("POD_NAME") or environ.get("HOSTNAME") or socket.gethostname()).strip()
    if missing:
        raise NotInPod("--k8s-deletion-cost needs a Kubernetes pod with a service account token; missing: "
                       + ", ".join(missing))
    try:
        port = int(environ["KUBERNETES_SERVICE_PORT"])
    except ValueError:
        raise NotInPod(f"KUBERNETES_SERVICE_PORT is not a port number: {environ['KUBERNETES_SERVICE_PORT']!r}") \
            from None
    return PodRef(environ["KUBERNETES_SERVICE_HOST"].strip("[]"), port, namespace, name, str(sa / "token"),
                  str(sa / "ca.crt"))


def deletion_cost(snap: dict) -> int:
    """0 when no child runs a job; else PER_JOB per running job plus the oldest one's age in whole minutes
    (capped below PER_JOB): a pod with more work, or older work, costs more to delete."""
    ages = [c.get("job_runtime_secs") or 0.0 for c in snap.get("children", []) if c.get("state") == "busy"]
    if not ages:
        return 0
    return PER_JOB * len(ages) + min(PER_JOB - 1, int(max(ages) // 60))


class CostPolicy:
    """When to send the figure: on a change, at most every `min_interval`; after failures, on back-off; never
    again once forbidden. Pure decisions on the times it is given."""

    def __init__(self, min_interval: float = MIN_INTERVAL):
        self.min_interval = min_interval
        self.sent: int | None = None  # the figure the API holds
        self.next_at = 0.0  # send nothing before this
        self.failures = 0  # failed patches in a row
        self.off = False

    def wait(self, cost: int | None, now: float) -> float | None:
        """Seconds until `cost` may be sent (None: nothing to send)."""
        if self.off or cost is None or cost == self.sent:
            return None
        return max(0.0, self.next_at - now)

    def succeeded(self, cost: int, now: float) -> None:
        self.sent, self.failures, self.next_at = cost, 0, now + self.min_interval

    def failed(self, now: float) -> None:
        self.failures += 1
        self.next_at = now + max(self.min_interval, backoff(self.failures, self.min_interval, RETRY_CAP))

    def forbid(self) -> None:
        self.off = True


class PatchFailed(Exception):
    def __init__(self, status: int | None, text: str):
        super().__init__(text)
        self.status = status


def send_patch(pod: PodRef, cost: int, timeout: float = REQUEST_TIMEOUT) -> None:
    """PATCH the pod's annotation (JSON merge patch) over TLS verified against the service account's CA;
    raises PatchFailed (status None: no answer)."""
    try:
        token = Path(pod.token_path).read_text().strip()
        context = ssl.create_default_context(cafile=pod.ca_path)
    except (OSError, ssl.SSLError) as exc:
        raise PatchFailed(None, f"cannot read the service account's token or CA: {exc}") from None
    body = json.dumps({"metadata": {"annotations": {ANNOTATION: str(cost)}}}).encode()
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/merge-patch+json",
               "Accept": "application/json", "User-Agent": f"spooled-supervisor/{__version__}"}
    conn = http.client.HTTPSConnection(pod.host, pod.port, timeout=timeout, context=context)
    try:
        conn.request("PATCH", pod.path, body=body, headers=headers)
        answer = conn.getresponse()
        text = answer.read(2000).decode("utf-8", "replace")
    except (OSError, http.client.HTTPException) as exc:
        raise PatchFailed(None, f"{type(exc).__name__}: {exc}") from None
    finally:
        conn.close()
    if answer.status != 200:
        raise PatchFailed(answer.status, f"HTTP {answer.status}: {_message(text)}")


def _message(text: str) -> str:
    """The `message` of a Kubernetes Status answer, else the text's start."""
    try:
        return str(json.loads(text).get("message"))[:300]
    except (ValueError, AttributeError):
        return text[:300]


class PodAnnotator:
    """A daemon thread that keeps the pod's deletion-cost annotation at the latest offered figure."""

    def __init__(self, pod: PodRef, min_interval: float = MIN_INTERVAL,
                 send: Callable[[PodRef, int], None] = send_patch, clock: Callable[[], float] = time.monotonic):
        self.pod = pod
        self.policy = CostPolicy(min_interval)
        self._send = send
        self._clock = clock
        self._latest: int | None = None
        self._stopping = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="pod-deletion-cost", daemon=True)

    def start(self) -> PodAnnotator:
        self._thread.start()
        return self

    def offer(self, cost: int) -> None:
        """The latest figure (from the loop): never waits on the API."""
        with self._cond:
            if cost != self._latest:
                self._latest = cost
                self._cond.notify()

    def stop(self, timeout: float = 2.0) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _next(self) -> int | None:
        """Wait until a figure is due (or the annotator stops: None)."""
        with self._cond:
            while not self._stopping:
                wait = self.policy.wait(self._latest, self._clock())
                if wait == 0.0:
                    return self._latest
                self._cond.wait(wait)
            return None

    def _run(self) -> None:
        while (cost := self._next()) is not None:
            try:
                self._send(self.pod, cost)
            except PatchFailed as exc:
                self._failed(exc)
                continue
            if self.policy.failures:
                log_event(log, INFO, "pod deletion cost: the Kubernetes API takes the annotation again",
                          pod=self.pod.name, cost=cost)
            self.policy.succeeded(cost, self._clock())
            log_event(log, DEBUG, "pod deletion cost set", pod=self.pod.name, cost=cost)

    def _failed(self, exc: PatchFailed) -> None:
        if exc.status == 403:
            self.policy.forbid()
            log_event(log, WARNING, f"pod deletion cost: the Kubernetes API refused to patch this pod (403); "
                                    f"turning the feature off. To use it, {ROLE_HINT}", pod=self.pod.name,
                      namespace=self.pod.namespace, error=str(exc))
            return
        self.policy.failed(self._clock())
        level = WARNING if self.policy.failures == 1 else DEBUG  # once, until it works again
        log_event(log, level, "pod deletion cost: the annotation could not be set; retrying with back-off",
                  pod=self.pod.name, error=str(exc), failures=self.policy.failures)
