"""The SDK worker's event hooks under the real daemon: each runs in the child that ran the job, with the SDK's
event record, once per job (claimed, started, then one of completed, failed and lease_lost) or once per child
(started, stopped); a hook that raises is logged once and the jobs go on."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
from conftest import wait_for_status, wait_until

pytestmark = pytest.mark.timeout(90)


def hooks_seen(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.parametrize("spec", ["tests.support.sdk_app_hooks:worker", "tests.support.sdk_app_hooks:async_worker"])
def test_every_hook_runs_in_the_jobs_child_with_the_sdks_event_data(dev_server, daemon_factory, tmp_path, spec):
    out = tmp_path / "hooks.jsonl"
    d = daemon_factory("hooks", handler=spec, procs=1, env={"HOOKS_OUT": str(out)})
    ok = dev_server.enqueue("hooks", {"n": 1})
    (done,) = wait_for_status(dev_server, [ok])
    failed = dev_server.enqueue("hooks", {"fail": True}, max_retries=0)
    wait_for_status(dev_server, [failed], statuses=("failed", "deadletter"))
    lost = dev_server.enqueue("hooks", {"sleep": 1.0})
    d.busy_child(lost)
    dev_server.steal_lease(lost)  # its complete is refused: the lease is someone else's
    wait_until(lambda: [h for h in hooks_seen(out) if h["event"] == "job:lease_lost"], timeout=15)
    d.signal(signal.SIGTERM)
    assert d.wait() == 0

    seen = hooks_seen(out)
    child = done["result"]["pid"]
    assert {h["pid"] for h in seen} == {child} and child not in (d.proc.pid,)
    events = [(h["event"], h["data"].get("job_id")) for h in seen]
    assert events == [("started", None),
                      ("job:claimed", ok), ("job:started", ok), ("job:completed", ok),
                      ("job:claimed", failed), ("job:started", failed), ("job:failed", failed),
                      ("job:claimed", lost), ("job:started", lost), ("job:lease_lost", lost),
                      ("stopped", None)]
    by_event = {h["event"]: h for h in seen}
    assert by_event["started"]["type"] == "StartedEventData"
    assert by_event["started"]["data"] == {"worker_id": "test-worker", "queue_name": by_event["started"]["data"]
                                           ["queue_name"]}
    assert by_event["job:completed"]["data"] == {"job_id": ok, "queue_name": "hooks", "result": done["result"]}
    fail = by_event["job:failed"]
    assert fail["type"] == "JobFailedEventData" and fail["data"]["will_retry"] is False
    assert fail["data"]["error"].startswith("ValueError: asked to fail")
    lease = by_event["job:lease_lost"]["data"]
    assert (lease["operation"], lease["error"], lease["queue_name"]) == ("complete", "ConflictError", "hooks")
    assert by_event["stopped"]["data"] == {"worker_id": "test-worker", "reason": "graceful"}
    def hook_raised() -> list[dict]:
        return [r for r in d.records() if r.get("msg", "").startswith("an event hook raised")]

    wait_until(hook_raised, timeout=15, what="the hook's failure logged")  # the log is read on a thread
    (raised,) = hook_raised()  # once, not 3 times
    assert raised["event"] == "job:started" and raised["hook"].endswith("broken_hook")
    assert "this hook always fails" in raised.get("exc", "")
    assert not d.events("the SpooledWorker's event hooks (worker.on) are not run under the daemon")


def test_a_job_stopped_for_its_lost_lease_runs_lease_lost_in_its_child(dev_server, daemon_factory, tmp_path):
    out = tmp_path / "hooks.jsonl"
    d = daemon_factory("hooks", handler="tests.support.sdk_app_hooks:worker", procs=1, env={"HOOKS_OUT": str(out)},
                       args=["--lease", "5"])
    job = dev_server.enqueue("hooks", {"sleep": 30})
    pid = d.busy_child(job)
    dev_server.steal_lease(job)  # the next renewal finds the lease lost: the daemon stops the job's child
    d.wait_events("lease lost; stopping the job's work", job_id=job)
    lost = wait_until(lambda: [h for h in hooks_seen(out) if h["event"] == "job:lease_lost"], timeout=10)
    assert [(h["pid"], h["data"]["job_id"], h["data"]["operation"]) for h in lost] == [(pid, job, "heartbeat")]
    assert not [h for h in hooks_seen(out) if h["event"] in ("job:completed", "job:failed")]
