"""The SPOOLED_* environment variables take effect on a real daemon started without flags."""

from __future__ import annotations

import signal

import pytest
from conftest import (
    PY,
    Daemon,
    parse_ts,
    wait_for_status,
    wait_until,
)
from support.intake_helpers import status as status_of

DONE = ("completed", "failed", "deadletter")


# ---------------------------------------------------------------- environment
@pytest.mark.timeout(60)
def test_the_environment_variables_take_effect(dev_server, stopped, tmp_path):
    """No flag at all: every setting from SPOOLED_* variables, checked by what the daemon then does."""
    key_file = tmp_path / "key"
    key_file.write_text(dev_server.api_key + "\n")
    env = {"SPOOLED_API_KEY": "", "SPOOLED_API_KEY_FILE": str(key_file), "SPOOLED_QUEUE": "q-env",
           "SPOOLED_HANDLER": "supervisor.demo_handlers:misbehave", "SPOOLED_PROCS": "3",
           "SPOOLED_API_URL": dev_server.url, "SPOOLED_WORKER_ID": "w-from-env", "SPOOLED_LEASE": "45",
           "SPOOLED_POLL_INTERVAL": "0.2", "SPOOLED_HEALTH_PORT": "0", "SPOOLED_HEALTH_HOST": "127.0.0.1",
           "SPOOLED_LOG_FORMAT": "json", "SPOOLED_LOG_LEVEL": "DEBUG", "SPOOLED_MAX_RESULT_BYTES": "5000",
           "SPOOLED_MAX_JOBS_PER_CHILD": "2", "SPOOLED_KILL_GRACE": "1", "SPOOLED_DRAIN_TIMEOUT": "7",
           "SPOOLED_API_TIMEOUT": "10"}
    d = Daemon(dev_server, "unused", worker_id="unused", env=env)
    d.cmd = [PY, "-m", "supervisor", "run"]
    stopped.append(d.start())
    d.wait_ready()
    port = d.health_port
    snap = wait_until(lambda: (lambda s: s if len(s["children"]) == 3 else None)(status_of(port)), timeout=15,
                      what="three children (SPOOLED_PROCS)")
    assert snap["worker_id"] == "w-from-env" and snap["queue"] == "q-env" and snap["procs"] == 3
    assert dev_server.worker("w-from-env")["status"] == "healthy"  # the key came from the file
    big = dev_server.enqueue("q-env", {"do": "big_result", "bytes": 6000}, max_retries=0)
    job = wait_for_status(dev_server, [big], DONE, timeout=20)[0]
    assert "over the 5000 byte limit" in job["last_error"], job["last_error"]  # SPOOLED_MAX_RESULT_BYTES
    held = dev_server.enqueue("q-env", {"do": "sleep", "secs": 2})
    job = wait_for_status(dev_server, [held], ("processing",), timeout=20)[0]
    lease = parse_ts(job["lease_expires_at"]) - parse_ts(job["started_at"])
    assert 44 <= lease <= 46, lease  # SPOOLED_LEASE (the dev server's default is 30)
    ids = [dev_server.enqueue("q-env", {"do": "sleep", "secs": 0.3}) for _ in range(6)]
    jobs = wait_for_status(dev_server, [held, *ids], timeout=30)
    assert {j["assigned_worker_id"] for j in jobs} == {"w-from-env"}
    recycled = d.wait_events("replacing child", reason="max_jobs")
    assert all(e["jobs_done"] == 2 for e in recycled)  # SPOOLED_MAX_JOBS_PER_CHILD
    assert d.events("job started")  # a DEBUG line: SPOOLED_LOG_LEVEL
    assert all(line.startswith("{") for line in d.out.lines if line.strip())  # SPOOLED_LOG_FORMAT=json
    assert d.events("supervisor starting")[0]["procs"] == 3
    d.signal(signal.SIGTERM)
    assert d.wait(20) == 0
