"""The SDK client's `queues` resource against the dev server: list, get, stats, config, pause/resume, delete."""

from __future__ import annotations

import pytest
from conftest import DevServer
from spooled import SpooledClient
from spooled.errors import ConflictError, NotFoundError

pytestmark = pytest.mark.timeout(60)


def sdk(server: DevServer) -> SpooledClient:
    return SpooledClient(api_key=server.api_key, base_url=server.url)


def test_get_answers_a_configured_queue_and_one_that_only_has_jobs(dev_server):
    c = sdk(dev_server)
    c.jobs.create({"queue_name": "only-jobs", "payload": {}})
    c.queues.update_config("configured", {"max_retries": 7, "default_timeout": 90, "rate_limit": 50,
                                          "settings": {"team": "media"}})
    listed = {q.queue_name: q for q in c.queues.list()}
    assert set(listed) == {"configured", "only-jobs"}

    configured = c.queues.get("configured")
    assert (configured.queue_name, configured.max_retries, configured.default_timeout, configured.rate_limit,
            configured.enabled, configured.settings) == ("configured", 7, 90, 50, True, {"team": "media"})
    assert configured.id and configured.organization_id and configured.created_at <= configured.updated_at

    implicit = c.queues.get("only-jobs")
    summary = listed["only-jobs"]
    assert (implicit.max_retries, implicit.default_timeout, implicit.rate_limit, implicit.enabled) == (
        summary.max_retries, summary.default_timeout, summary.rate_limit, summary.enabled)
    assert implicit.id == c.queues.get("only-jobs").id and implicit.settings == {}

    with pytest.raises(NotFoundError):
        c.queues.get("never-heard-of")
    bad = dev_server.request("GET", "/api/v1/queues/bad%20name")
    assert bad.status_code == 400 and bad.json()["code"] == "BAD_REQUEST"


def test_stats_pause_and_resume_show_through_get(dev_server):
    c = sdk(dev_server)
    for _ in range(3):
        c.jobs.create({"queue_name": "thumbs", "payload": {}})
    stats = c.queues.get_stats("thumbs")
    assert (stats.queue_name, stats.pending_jobs, stats.processing_jobs) == ("thumbs", 3, 0)

    paused = c.queues.pause("thumbs", reason="deploy")
    assert paused.paused and paused.reason == "deploy"
    got = c.queues.get("thumbs")
    assert got.enabled is False and got.settings["paused"] is True and got.settings["paused_reason"] == "deploy"
    assert "paused_at_epoch" not in got.settings
    assert c.jobs.claim({"queue_name": "thumbs", "worker_id": "w", "limit": 5}).jobs == []

    resumed = c.queues.resume("thumbs")
    assert resumed.resumed and resumed.paused_duration_secs >= 0
    assert c.queues.get("thumbs").enabled is True
    assert len(c.jobs.claim({"queue_name": "thumbs", "worker_id": "w", "limit": 5}).jobs) == 3


def test_delete_refuses_while_jobs_wait_unless_they_go_too(dev_server):
    c = sdk(dev_server)
    job = c.jobs.create({"queue_name": "old", "payload": {}}).id
    c.queues.update_config("old", {"max_retries": 1})
    with pytest.raises(ConflictError):
        c.queues.delete("old")
    assert c.queues.get("old").max_retries == 1

    c.queues.delete("old", delete_jobs=True)
    with pytest.raises(NotFoundError):
        c.queues.get("old")
    with pytest.raises(NotFoundError):
        c.jobs.get(job)
    with pytest.raises(NotFoundError):
        c.queues.delete("old")

    c.queues.update_config("empty", {"enabled": True})
    c.queues.delete("empty")
    assert "empty" not in {q.queue_name for q in c.queues.list()}
    bad = dev_server.request("DELETE", "/api/v1/queues/x?delete_jobs=maybe")
    assert bad.status_code in (400, 422)
