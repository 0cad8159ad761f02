"""Close to one request per job, and pacing under a rate limit, end to end: the real dev
server (its own count of requests per organization, GET /_dev/stats) and the real daemon.

The in-process side (priorities, Retry-After against a due renewal, learning the rate) is in
test_pacer.py; here the daemon's traffic is what the server saw.
"""

from __future__ import annotations

import time
from collections import Counter

from conftest import wait_for_status, wait_until
from support.intake_helpers import bulk, daemons_fixture, dev_stats, servers_fixture, status  # noqa: F401 (fixtures)


def claims(server) -> int:
    return dev_stats(server)["by_route"].get("claim", 0)


def test_children_freeing_at_once_are_claimed_for_in_one_claim(dev_server, daemon_factory):
    """Four children, sixteen 0.3 s jobs: the jobs of a round end together, and one claim (one lease
    prefix on the server) carries the next four (the first, with no run time known yet, exactly four;
    later ones one more, the 100 ms of starts a claim batches at 13 a second). On a loaded machine a
    round's ends spread out and a claim may carry fewer, but still far fewer claims than jobs."""
    d = daemon_factory("pc-batch", procs=4).wait_ready()
    before = claims(dev_server)  # the empty queue's polls so far
    ids = bulk(dev_server, "pc-batch", [{"do": "sleep", "secs": 0.3}] * 16)

    def all_claimed():
        r = dev_server.request("GET", "/api/v1/jobs?queue_name=pc-batch&status=pending&limit=100")
        return r.status_code == 200 and r.json() == []

    wait_until(all_claimed, timeout=30, interval=0.02, what="every job claimed")
    after = claims(dev_server)  # the last round's claim came back full: no empty poll yet
    jobs = wait_for_status(dev_server, ids, timeout=30)
    by_claim = Counter(j["lease_id"][:36] for j in jobs)  # lease_id = <one uuid per claim>-<job id>
    assert 4 <= max(by_claim.values()) <= 5
    assert len(by_claim) <= 8, by_claim  # four rounds, one claim each on a quiet machine; 7 seen under coverage
    found_nothing = after - before - len(by_claim)  # the server saw every claim that carried jobs, and:
    # the idle daemon's poll before the jobs, and, when this test reads the count late on a loaded machine,
    # the claim ahead for the last round's ends (the queue is empty by then) and an idle poll after it
    assert 0 <= found_nothing <= 3, (after - before, by_claim)
    assert all(j["retry_count"] == 0 for j in jobs)
    assert d.proc.poll() is None


def test_a_job_shorter_than_a_third_of_its_lease_is_never_renewed(dev_server, daemon_factory):
    d = daemon_factory("pc-renew", procs=2, args=["--lease", "5"]).wait_ready()  # renewed every 1.7 s
    short = bulk(dev_server, "pc-renew", [{"do": "sleep", "secs": 0.1}] * 20)
    wait_for_status(dev_server, short, timeout=30)
    assert dev_stats(dev_server)["by_route"].get("job_heartbeat", 0) == 0
    long = dev_server.enqueue("pc-renew", {"do": "sleep", "secs": 2.2})  # the contrast: this one needs it
    wait_for_status(dev_server, [long], timeout=20)
    assert dev_stats(dev_server)["by_route"].get("job_heartbeat", 0) >= 1
    assert d.proc.poll() is None


def test_under_a_rate_limit_no_lease_lapses_and_429s_stay_rare(servers, daemons):
    """A free plan (5 requests/s, burst 10) and a mix of short jobs and jobs that need renewals on a 5 s
    lease: completes and renewals go first, so no lease lapses and no result is refused."""
    server = servers("--rate-limit", "5")
    payloads = [{"do": "sleep", "secs": 2.5 if i % 4 == 0 else 0.05} for i in range(12)]
    ids = bulk(server, "pc-limit", payloads)  # one request: the test spends as little of the plan as it can
    d = daemons(server, "pc-limit", procs=2, args=["--lease", "5", "--health-port", "0"]).wait_ready()
    port = d.health_port
    wait_until(lambda: status(port).get("jobs_settled", 0) >= 12, timeout=40, interval=0.2, what="12 jobs settled")
    snap = status(port)
    stats = dev_stats(server)

    def listed():
        r = server.request("GET", "/api/v1/jobs?queue_name=pc-limit&limit=100")
        return r.json() if r.status_code == 200 else None

    jobs = {j["id"]: j for j in wait_until(listed, timeout=10, interval=0.5, what="the job list")}
    assert sorted(jobs) == sorted(ids)
    assert all(j["status"] == "completed" and j["retry_count"] == 0 for j in jobs.values())
    assert not any("Lease expired" in (j.get("last_error") or "") for j in jobs.values())
    assert not d.events("lease lost; stopping the job's work")
    assert not [r for r in d.out.lines if "refused" in r]
    assert stats["rate_limited"] <= 5, stats  # the first collision teaches the rate; then none
    if snap["rate_limit_rps"] is not None:  # learned: the plan less 5%, not cut again by echoes
        assert snap["rate_limit_rps"] >= 0.8 * 4.75, snap


def test_max_rps_holds_the_daemons_request_rate_under_the_cap(servers, daemons):
    """--max-rps 4 with a backlog of 10 ms jobs: over a window of a dozen settled jobs, the server counts
    no more than 4 requests/s plus the bucket (4)."""
    server = servers()
    bulk(server, "pc-cap", [{"do": "sleep", "secs": 0.01}] * 100)
    port = daemons(server, "pc-cap", procs=2, args=["--max-rps", "4", "--health-port", "0"]).wait_ready().health_port
    wait_until(lambda: status(port).get("jobs_settled", 0) >= 2, timeout=30, interval=0.1, what="jobs settling")
    start, sent0, settled0 = time.monotonic(), dev_stats(server)["requests"], status(port)["jobs_settled"]
    wait_until(lambda: status(port)["jobs_settled"] >= settled0 + 12, timeout=30, interval=0.1,
               what="a dozen more jobs settled")
    window, sent = time.monotonic() - start, dev_stats(server)["requests"] - sent0
    assert sent <= 4 * window + 4 + 1, (sent, window)
    assert sent >= 12  # a complete per job at least: the window saw real work
    snap = status(port)
    assert snap["rate_limit_rps"] == 4.0
    assert snap["requests_per_job"] < 1.6, snap
