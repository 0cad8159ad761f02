"""The dashboard, a job's priority, the organization's usage against its plan and its incoming-webhook
token, through the SDK client as an application calls them, and their bad input answered as the server does."""

from __future__ import annotations

import pytest
from conftest import DevServer
from spooled import SpooledClient
from spooled.errors import NotFoundError, SpooledError

pytestmark = pytest.mark.timeout(60)


def sdk(server: DevServer, key: str | None = None) -> SpooledClient:
    return SpooledClient(api_key=key or server.api_key, base_url=server.url)


def test_the_dashboard_counts_jobs_queues_and_workers(dev_server):
    c = sdk(dev_server)
    for i in range(3):
        c.jobs.create({"queue_name": "dash", "payload": {"i": i}})
    dev_server.request("POST", "/api/v1/workers/register",
                       json={"queue_name": "dash", "hostname": "h", "worker_id": "w"})
    leased = dev_server.request("POST", "/api/v1/jobs/claim", json={"queue_name": "dash", "worker_id": "w"}).json()
    job = leased["jobs"][0]
    dev_server.request("POST", f"/api/v1/jobs/{job['id']}/complete",
                       json={"worker_id": "w", "lease_id": job["lease_id"]})
    c.queues.pause("dash")
    d = c.dashboard.get()
    assert d.system.environment == "development" and d.system.database_status == "healthy"
    assert (d.jobs.total, d.jobs.pending, d.jobs.processing, d.jobs.completed_24h) == (3, 2, 0, 1)
    assert d.jobs.avg_processing_time_ms is not None and d.jobs.avg_processing_time_ms >= 0
    assert [(q.name, q.pending, q.paused) for q in d.queues] == [("dash", 2, True)]
    assert (d.workers.total, d.workers.healthy) == (1, 1)
    assert (d.recent_activity.jobs_created_1h, d.recent_activity.jobs_completed_1h) == (3, 1)
    assert dev_server.request("GET", "/api/v1/dashboard", key="sp_test_wrong").status_code == 401


def test_priority_of_a_waiting_job_changes_and_decides_the_next_claim(dev_server):
    c = sdk(dev_server)
    first = c.jobs.create({"queue_name": "prio", "payload": {}}).id
    second = c.jobs.create({"queue_name": "prio", "payload": {}}).id
    boosted = c.jobs.boost_priority(second, 10)
    assert (boosted.job_id, boosted.old_priority, boosted.new_priority) == (second, 0, 10)
    assert c.jobs.get(second).priority == 10
    claimed = dev_server.request("POST", "/api/v1/jobs/claim", json={"queue_name": "prio", "worker_id": "w"}).json()
    assert claimed["jobs"][0]["id"] == second
    with pytest.raises(NotFoundError):  # processing now: not pending or scheduled
        c.jobs.boost_priority(second, 1)
    with pytest.raises(NotFoundError):
        c.jobs.boost_priority("no-such-job", 1)
    for bad, status, code in (({"priority": 101}, 400, "VALIDATION_ERROR"), ({}, 422, "VALIDATION_ERROR"),
                              ({"priority": "high"}, 422, "VALIDATION_ERROR")):
        r = dev_server.request("PUT", f"/api/v1/jobs/{first}/priority", json=bad)
        assert (r.status_code, r.json()["code"]) == (status, code), r.text
    assert c.jobs.get(first).priority == 0


def test_usage_counts_against_the_plan_of_the_organization(dev_server):
    c = sdk(dev_server)
    c.jobs.create({"queue_name": "u1", "payload": {}})
    c.jobs.create({"queue_name": "u2", "payload": {}})
    c.queues.update_config("u3", {"max_retries": 1})
    usage = c.organizations.get_usage()
    assert usage.plan == "free" and usage.plan_display_name == "Free"
    assert (usage.limits.max_queues, usage.limits.max_workers, usage.limits.max_payload_size_bytes) == (2, 1, 65536)
    assert usage.usage.jobs_today.current == 2 and usage.usage.active_jobs.current == 2
    assert usage.usage.queues.current == 3 and usage.usage.queues.percentage == 150.0
    assert usage.usage.api_keys.current == 1 and usage.usage.workflows.is_disabled is True
    assert {(w.resource, w.severity) for w in usage.warnings} >= {("queues", "critical"), ("api_keys", "warning")}
    (org,) = c.organizations.list()
    assert org.plan_tier == "free" and org.slug == "default"


def test_the_webhook_token_is_read_rotated_and_never_cleared(dev_server):
    c = sdk(dev_server)
    first = c.organizations.get_webhook_token()
    assert first.webhook_token and first.webhook_token.startswith("whk_") and len(first.webhook_token) == 36
    assert first.webhook_url and first.webhook_url.endswith("/custom")
    assert c.organizations.get_webhook_token().webhook_token == first.webhook_token
    rotated = c.organizations.regenerate_webhook_token()
    assert rotated.webhook_token != first.webhook_token
    assert c.organizations.get_webhook_token().webhook_token == rotated.webhook_token
    with pytest.raises(SpooledError):  # the SDK 1.6.0 refuses it before asking; the server refuses it too
        c.organizations.clear_webhook_token()
    r = dev_server.request("POST", "/api/v1/organizations/webhook-token/clear", json={"confirm": True})
    assert r.status_code == 400 and r.json()["code"] == "VALIDATION_ERROR"
    assert c.organizations.get_webhook_token().webhook_token == rotated.webhook_token


def test_slugs_are_checked_and_generated_as_the_server_does(dev_server):
    c = sdk(dev_server)
    assert c.organizations.check_slug("default").available is False  # the dev server's own organization
    taken = dev_server.request("GET", "/api/v1/organizations/check-slug", params={"slug": "default"}).json()
    assert taken["valid"] is True and taken["suggestion"].startswith("default-")
    free = c.organizations.check_slug("acme-labs")
    assert free.available and free.valid
    bad = c.organizations.check_slug("Bad_Slug")
    assert not bad.valid and bad.error == "Slug can only contain lowercase letters, digits, and hyphens"
    assert c.organizations.generate_slug("  Acme Labs, Inc.  ").slug == "acme-labs-inc"
    assert c.organizations.generate_slug("42 Things").slug == "org-42-things"
    assert c.organizations.generate_slug("Default").slug.startswith("default-")
    r = dev_server.request("POST", "/api/v1/organizations/generate-slug", json={"name": "   "}, key="no-key-needed")
    assert r.status_code == 400 and r.json()["code"] == "VALIDATION_ERROR"
