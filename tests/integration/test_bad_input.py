"""Bad input: results JSON can't encode, results too large (for the daemon or for the server),
payloads the handler doesn't expect, payloads of several MiB. Each job ends with a clear error (or,
for a big payload the handler does expect, its result) and the daemon carries on with the same children.
"""

from __future__ import annotations

import pytest
from conftest import Daemon, DevServer, wait_for_status

DONE = ("completed", "failed", "deadletter")
MIB = 2**20


@pytest.fixture
def big_server(tmp_path):
    s = DevServer(str(tmp_path / "dev.db"), extra=["--lease-sweep-interval", "0.2",
                                                  "--max-payload-bytes", str(6 * MIB),
                                                  "--max-body-bytes", str(6 * MIB + 512 * 1024)]).start()
    yield s
    s.stop()


@pytest.mark.timeout(90)
def test_bad_results_and_payloads_fail_the_job_clearly_and_leave_the_daemon_alone(big_server):
    d = Daemon(big_server, "bad", procs=2).start()
    try:
        d.wait_ready()
        children = sorted(d.child_pids())
        assert len(children) == 2
        cases = {
            "unserialisable": ({"do": "unserialisable"},
                               "ResultNotSerializable: the handler's result could not be encoded as JSON ("),
            "too big for the daemon": ({"do": "big_result", "bytes": 3 * MIB},
                                       "ResultTooLarge: the handler's result is 3145739 bytes of JSON, over the "
                                       "1900000 byte limit"),
            "unexpected payload": ([1, 2, 3], "AttributeError: 'list' object has no attribute 'get'"),
            "several MiB echoed back": ({"do": "echo", "blob": "y" * (5 * MIB)}, "ResultTooLarge: "),
        }
        ids = {name: big_server.enqueue("bad", payload, max_retries=0) for name, (payload, _) in cases.items()}
        big = big_server.enqueue("bad", {"do": "size", "blob": "z" * (5 * MIB)}, max_retries=0)
        jobs = dict(zip(ids, wait_for_status(big_server, list(ids.values()), DONE, timeout=30), strict=False))
        for name, (_, error) in cases.items():
            job = jobs[name]
            assert job["status"] == "deadletter", (name, job["status"], job["last_error"])
            assert job["last_error"].startswith(error), (name, job["last_error"][:300])
            assert len(job["last_error"]) <= 2048
        # A payload of several MiB the handler does expect goes through the pipe and back whole.
        done = wait_for_status(big_server, [big], DONE, timeout=30)[0]
        assert done["status"] == "completed" and done["result"]["payload_len"] == 5 * MIB

        # The daemon is unaffected: same children, nothing restarted, still working.
        ok = big_server.enqueue("bad", {"do": "echo", "n": 1})
        result = wait_for_status(big_server, [ok], timeout=10)[0]["result"]
        assert result["echo"] == {"do": "echo", "n": 1} and result["pid"] in children
        assert sorted(d.child_pids()) == children
        assert not d.events("child exited; starting a new one") and not d.events("child died during a job")
        assert d.proc.poll() is None
    finally:
        d.stop()
    assert d.proc.returncode == 0


@pytest.mark.timeout(60)
def test_a_result_larger_than_the_server_accepts_fails_the_job(big_server):
    # The daemon's own cap is raised above the server's body limit, so the server is the one refusing.
    d = Daemon(
        big_server, "bigres", procs=1, worker_id="bigres-worker", args=["--max-result-bytes", str(16 * MIB)]
    ).start()
    try:
        d.wait_ready()
        job_id = big_server.enqueue("bigres", {"do": "big_result", "bytes": 7 * MIB}, max_retries=0)
        job = wait_for_status(big_server, [job_id], DONE, timeout=30)[0]
        assert job["status"] == "deadletter"
        assert job["last_error"].startswith("ResultRejected: the API refused this job's result: 400"), job["last_error"]
        refused = d.wait_events("the API refused the result; failing the job instead")  # read on a thread
        assert refused[0]["job_id"] == job_id
        ok = big_server.enqueue("bigres", {"do": "echo"})
        assert wait_for_status(big_server, [ok], timeout=10)[0]["status"] == "completed"
        assert d.proc.poll() is None
    finally:
        d.stop()
    assert d.proc.returncode == 0
