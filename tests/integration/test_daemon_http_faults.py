"""The real daemon behind a proxy that mangles one claim answer: it keeps completing jobs."""

from __future__ import annotations

import pytest
from conftest import Daemon, wait_for_status
from support.fake_http import ForwardingProxy, interim_flood, with_chunked_too


@pytest.mark.timeout(90)
def test_a_claim_answer_after_500_interim_answers_is_read_and_the_daemon_completes_every_job(dev_server):
    ids = [dev_server.enqueue("flood", {"do": "echo", "n": i}) for i in range(6)]
    with ForwardingProxy(dev_server.url, first_claim=interim_flood) as proxy:
        daemon = Daemon(dev_server, "flood", procs=2, worker_id="w-flood", args=["--api-url", proxy.url]).start()
        try:
            jobs = wait_for_status(dev_server, ids, timeout=40)
            assert proxy.claims_changed == 1
            assert all(j["retry_count"] == 0 for j in jobs)  # the flooded claim's jobs were run, not lost
            assert sorted(j["result"]["echo"]["n"] for j in jobs) == list(range(6))
            assert not [line for line in daemon.out.lines if "unexpected error" in line] and daemon.proc.poll() is None
        finally:
            daemon.stop()
    assert daemon.proc.returncode == 0


@pytest.mark.timeout(90)
def test_a_malformed_claim_answer_fails_the_claim_and_the_daemon_goes_on_serving(dev_server):
    """Content-Length and chunked together: the claim fails as a network error (its jobs come back when their
    5 s lease runs out), later claims on a fresh connection are served."""
    ids = [dev_server.enqueue("mangled", {"do": "echo", "n": i}) for i in range(4)]
    with ForwardingProxy(dev_server.url, first_claim=with_chunked_too) as proxy:
        daemon = Daemon(dev_server, "mangled", procs=2, worker_id="w-mangled",
                        args=["--api-url", proxy.url, "--lease", "5"]).start()
        try:
            jobs = wait_for_status(dev_server, ids, timeout=60)
            assert proxy.claims_changed == 1
            assert any(j["retry_count"] == 1 for j in jobs)  # the jobs of the claim the daemon could not read
            failed = daemon.wait_events("claim failed")
            assert failed and "BAD_FRAMING" in failed[0]["error"]
            assert not [line for line in daemon.out.lines if "unexpected error" in line] and daemon.proc.poll() is None
        finally:
            daemon.stop()
    assert daemon.proc.returncode == 0
