"""Dev server durability and process lifecycle: SIGKILL after acknowledged writes, restart, keys, signals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
import requests
from conftest import ROOT, DevServer, OutputPump, own
from support.fake_keys import live_shaped

pytestmark = pytest.mark.timeout(60)


def test_sigkill_loses_no_acknowledged_write(tmp_path):
    db = str(tmp_path / "durable.db")
    s = DevServer(db).start()
    key = s.api_key
    assert key.startswith("sp_test_")
    s.request("POST", "/api/v1/workers/register", json={"queue_name": "d", "hostname": "h", "worker_id": "keeper"})
    ids = [s.enqueue("d", {"i": i}) for i in range(30)]
    claimed = s.request(
        "POST", "/api/v1/jobs/claim", json={"queue_name": "d", "worker_id": "keeper", "limit": 10}
    ).json()["jobs"]
    for job in claimed[:4]:
        r = s.request(
            "POST",
            f"/api/v1/jobs/{job['id']}/complete",
            json={"worker_id": "keeper", "lease_id": job["lease_id"], "result": job["payload"]},
        )
        assert r.status_code == 200
    job = claimed[4]
    assert (
        s.request(
            "POST",
            f"/api/v1/jobs/{job['id']}/fail",
            json={"worker_id": "keeper", "lease_id": job["lease_id"], "error": "e"},
        ).status_code
        == 200
    )
    other = requests.post(s.url + "/api/v1/organizations", json={"name": "Second", "slug": "second"}, timeout=5).json()[
        "api_key"
    ]["key"]
    before = {i: s.job(i) for i in ids}
    worker_before = s.worker("keeper")

    s.stop(signal.SIGKILL)
    assert s.proc.returncode == -signal.SIGKILL

    again = DevServer(db).start()
    try:
        assert again.api_key == key  # the generated key was stored
        after = {i: again.job(i) for i in ids}
        assert after == before  # every job, lease and status exactly as acknowledged
        assert sum(j["status"] == "completed" for j in after.values()) == 4
        assert sum(j["status"] == "processing" for j in after.values()) == 5
        leased = claimed[5]
        r = again.request(
            "POST",
            f"/api/v1/jobs/{leased['id']}/complete",
            json={"worker_id": "keeper", "lease_id": leased["lease_id"]},
        )
        assert r.status_code == 200  # the lease survived the restart
        w = again.worker("keeper")
        assert (w["jobs_processed"], w["jobs_failed"]) == (worker_before["jobs_processed"] + 1, 1)
        assert again.request("GET", "/api/v1/jobs/stats", key=other).status_code == 200
    finally:
        again.stop()


def test_sigterm_exits_zero_and_given_key_is_used(tmp_path):
    db = str(tmp_path / "k.db")
    s = DevServer(db, extra=["--api-key", "sp_test_given_key_0123456789"]).start()
    assert s.api_key == "sp_test_given_key_0123456789"
    jid = s.enqueue("q", 1)
    s.stop(signal.SIGTERM)
    assert s.proc.returncode == 0
    assert "API key: from --api-key, ending ...6789" in s.out.text()
    env_key = DevServer(db, env={"SPOOLED_API_KEY": "sp_test_env_key_abcdefghij"}).start()
    try:
        assert env_key.api_key == "sp_test_env_key_abcdefghij"
        assert env_key.job(jid)["payload"] == 1
        assert "API key: from SPOOLED_API_KEY, ending ...ghij" in env_key.out.text()
        # the key given earlier still works: keys are stored, not replaced
        assert env_key.request("GET", f"/api/v1/jobs/{jid}", key="sp_test_given_key_0123456789").status_code == 200
    finally:
        env_key.stop(signal.SIGINT)
    assert env_key.proc.returncode == 0


def test_port_zero_memory_db_and_env_settings(tmp_path):
    proc = own(
        subprocess.Popen(
            [sys.executable, "-m", "supervisor", "dev-server", "--port", "0", "--db", ":memory:"],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
            env={**os.environ, "SPOOLED_DEV_LEASE_DURATION": "45", "SPOOLED_DEV_HEARTBEAT_INTERVAL": "7"},
        )
    )
    out = OutputPump(proc.stdout)
    try:
        key = out.wait_for(r"API key: (sp_test_\S+)").group(1)
        url = out.wait_for(r"Spooled dev server listening on (http://127\.0\.0\.1:(\d+))$")
        assert int(url.group(2)) > 0
        h = {"Authorization": f"Bearer {key}"}
        r = requests.post(url.group(1) + "/api/v1/jobs", json={"queue_name": "m", "payload": [1]}, headers=h, timeout=5)
        assert r.status_code == 201
        assert requests.get(url.group(1) + f"/api/v1/jobs/{r.json()['id']}", headers=h, timeout=5).json()[
            "payload"
        ] == [1]
        reg = requests.post(
            url.group(1) + "/api/v1/workers/register", json={"queue_name": "m", "hostname": "h"}, headers=h, timeout=5
        ).json()
        assert (reg["lease_duration_secs"], reg["heartbeat_interval_secs"]) == (45, 7)  # from SPOOLED_DEV_* env
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0


def test_help_documents_the_resilience_switches():
    r = subprocess.run(
        [sys.executable, "-m", "supervisor", "dev-server", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert r.returncode == 0
    for flag in (
        "--fault-503",
        "--fault-delay-ms",
        "--fault-cut",
        "--fault-seed",
        "--max-workers",
        "--rate-limit",
        "--rate-burst",
        "--lease-sweep-interval",
        "--worker-offline-after",
        "--max-payload-bytes",
        "SPOOLED_DEV_FAULT_503",
        "SPOOLED_API_KEY",
        "/_dev/faults",
    ):
        assert flag in r.stdout, flag


def test_an_adopted_key_is_never_echoed_and_the_key_file_holds_the_key_in_use(tmp_path):
    """A real key in the environment is adopted: the output names its source and last four characters only; a
    key the server made itself is still printed; --key-file gives scripts either."""
    real = live_shaped("q" * 24 + "WXYZ")
    adopted = DevServer(str(tmp_path / "a.db"), env={"SPOOLED_API_KEY": real},
                        extra=["--key-file", str(tmp_path / "a.key")]).start()
    try:
        assert adopted.request("GET", "/api/v1/jobs/stats").status_code == 200
        assert (tmp_path / "a.key").read_text() == real + "\n" and (tmp_path / "a.key").stat().st_mode & 0o077 == 0
    finally:
        adopted.stop()
    text = adopted.out.text()
    assert real not in text and real[8:] not in text and "API key: from SPOOLED_API_KEY, ending ...WXYZ" in text
    made = DevServer(str(tmp_path / "m.db"), extra=["--key-file", str(tmp_path / "m.key")]).start()
    try:
        assert made.api_key.startswith("sp_test_") and f"API key: {made.api_key}" in made.out.text()
        assert (tmp_path / "m.key").read_text() == made.api_key + "\n"
    finally:
        made.stop()
