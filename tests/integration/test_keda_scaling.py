"""KEDA scales on work, not on reservations: a busy daemon (short jobs, API latency on) is fed at about its
own pace while the test samples the stats route KEDA's scaler reads and computes the replica count the
shipped ScaledObject would ask for. It must never exceed the count of pods that would be busy with the work
there is (jobs waiting plus jobs really running, `--procs` per pod). The old trigger on processing_jobs, which
counts claimed-ahead jobs, is computed alongside as the control: it asks for more."""

from __future__ import annotations

import math
import threading
import time

import pytest
import requests
from conftest import Daemon, DevServer
from support.keda_scaler import desired_replicas, scaled_object, scaler_query, triggers

PROCS = 2  # children per pod, as the Deployment's CPU limit gives


def busy_pods(pending: float, running: int) -> int:
    """Pods of PROCS children the work there is would keep busy, within the ScaledObject's bounds."""
    spec = scaled_object()["spec"]
    return min(max(math.ceil((pending + running) / PROCS), spec["minReplicaCount"]), spec["maxReplicaCount"])


def old_trigger_replicas(pending: float, processing: float) -> int:
    """What the former ScaledObject (pending / 10 and processing / 2) asked for."""
    spec = scaled_object()["spec"]
    wanted = max(math.ceil(pending / 10), math.ceil(processing / PROCS))
    return min(max(wanted, spec["minReplicaCount"]), spec["maxReplicaCount"])


@pytest.mark.timeout(120)
def test_the_replica_count_keda_asks_for_stays_within_the_busy_pods(tmp_path):
    server = DevServer(str(tmp_path / "dev.db"), extra=["--fault-delay-ms", "20"]).start()
    queue = "default"  # the queue the ScaledObject's URL names
    d = Daemon(server, queue, procs=PROCS, worker_id="w-keda", args=["--health-port", "0"]).start()
    port = d.health_port
    stop = threading.Event()

    def feed():  # at the daemon's pace, however fast it is: a short queue it keeps claiming ahead from
        body = {"queue_name": queue, "jobs": [{"payload": {"do": "sleep", "secs": 0.01}}] * 12}
        while not stop.wait(0.05):
            if server.request("GET", f"/api/v1/queues/{queue}/stats").json()["pending_jobs"] < 12:
                server.request("POST", "/api/v1/jobs/bulk", json=body)

    feeder = threading.Thread(target=feed, daemon=True)
    samples = []
    try:
        d.wait_ready()
        feeder.start()
        (pending_trigger,) = triggers().values()
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline:
            stats = server.request("GET", f"/api/v1/queues/{queue}/stats").json()
            pending = scaler_query(pending_trigger, server.url, server.api_key)
            running = requests.get(f"http://127.0.0.1:{port}/status", timeout=5).json()["busy"]
            samples.append((pending, stats["processing_jobs"], running))  # three requests pace the samples
        stop.set()
        feeder.join(5)
    finally:
        stop.set()
        d.stop()
        server.stop()
    assert len(samples) >= 10
    for pending, processing, running in samples:
        asked = desired_replicas({"pending_jobs": pending})
        assert asked <= busy_pods(pending, running), (pending, processing, running, asked)
    # The control: counting claimed-ahead jobs asked for more pods than the work could keep busy.
    over = [s for s in samples if old_trigger_replicas(s[0], s[1]) > busy_pods(s[0], s[2])]
    assert over, f"the processing_jobs trigger never over-asked in {samples}"
    print(f"samples {len(samples)}; pending max {max(s[0] for s in samples):g}; processing max "
          f"{max(s[1] for s in samples)}; running max {max(s[2] for s in samples)}; asked max "
          f"{max(desired_replicas({'pending_jobs': s[0]}) for s in samples)}; the processing trigger asked max "
          f"{max(old_trigger_replicas(s[0], s[1]) for s in samples)}, over the busy pods in {len(over)} samples")
