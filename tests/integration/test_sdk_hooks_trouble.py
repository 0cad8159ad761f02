"""The SDK worker's hooks under the real daemon when things go wrong: a handler's exception is `job:failed` (never
`error`, as in the SDK) and a result the server refuses is the `error` hook, then `job:failed`; `stopped` runs in
each child that leaves (a scale-down, a drain); a hook that hangs is bounded (the job's timeout, or
--child-exit-grace for `stopped`) and its child replaced; a hook that raises is logged once and changes no job's
outcome."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest
from conftest import DevServer, wait_for_status, wait_until

pytestmark = pytest.mark.timeout(120)

HANDLER = "tests.support.sdk_app_hook_trouble:handle"


def seen(path: Path, event: str | None = None) -> list[dict]:
    lines = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return [h for h in lines if event is None or h["event"] == event]


def daemon(daemon_factory, out: Path, trouble: str = "", procs: int = 1, args: list[str] | None = None):
    return daemon_factory("trouble", handler=HANDLER, procs=procs, args=args,
                          env={"HOOKS_OUT": str(out), "TROUBLE": trouble})


@pytest.fixture
def small_body_server(tmp_path):
    s = DevServer(str(tmp_path / "small.db"), extra=["--max-body-bytes", str(64 * 1024)]).start()
    yield s
    s.stop()


def test_a_handlers_exception_is_job_failed_and_a_refused_result_the_error_hook(small_body_server, tmp_path):
    from conftest import Daemon

    out = tmp_path / "hooks.jsonl"
    d = Daemon(small_body_server, "trouble", handler=HANDLER, procs=1, env={"HOOKS_OUT": str(out)}).start()
    try:
        raised = small_body_server.enqueue("trouble", {"fail": True}, max_retries=0)
        wait_for_status(small_body_server, [raised], statuses=("deadletter", "failed"))
        wait_until(lambda: seen(out, "job:failed"), timeout=15)
        big = small_body_server.enqueue("trouble", {"big": 200_000}, max_retries=0)  # over the server's body limit
        (record,) = wait_for_status(small_body_server, [big], statuses=("deadletter", "failed"))
        assert record["last_error"].startswith("ResultRejected: the API refused this job's result")
        wait_until(lambda: len(seen(out, "job:failed")) == 2, timeout=15)
        d.signal(signal.SIGTERM)
        assert d.wait() == 0
    finally:
        d.stop()
    pid = seen(out, "started")[0]["pid"]
    assert {h["pid"] for h in seen(out)} == {pid}
    order = [(h["event"], h["data"].get("job_id")) for h in seen(out) if h["event"] not in ("started", "stopped")]
    assert order == [("job:claimed", raised), ("job:started", raised), ("job:failed", raised),
                     ("job:claimed", big), ("job:started", big), ("error", None), ("job:failed", big)]
    first, second = seen(out, "job:failed")
    assert first["data"]["error"].startswith("ValueError: asked to fail") and first["data"]["will_retry"] is False
    (error,) = seen(out, "error")  # the refused result only: a handler's exception is no `error` event
    assert error["type"] == "ErrorEventData" and error["data"]["error"]["type"] == "ReportRefused"
    assert "400" in error["data"]["error"]["text"]
    assert second["data"]["error"].startswith("ResultRejected: the API refused this job's result")


def test_stopped_runs_in_each_child_after_a_scale_down_and_after_a_drain(dev_server, daemon_factory, tmp_path):
    out = tmp_path / "hooks.jsonl"
    d = daemon(daemon_factory, out, procs=2)
    d.wait_ready()
    started = wait_until(lambda: {h["pid"] for h in seen(out, "started")} if len(seen(out, "started")) == 2 else None,
                         timeout=20)
    jobs = [dev_server.enqueue("trouble", {}) for _ in range(4)]
    wait_for_status(dev_server, jobs)
    d.signal(signal.SIGTTOU)  # one child fewer: it leaves gracefully
    (gone,) = wait_until(lambda: seen(out, "stopped") or None, timeout=15)
    assert gone["pid"] in started and gone["data"] == {"worker_id": "test-worker", "reason": "graceful"}
    after = dev_server.enqueue("trouble", {})
    (job,) = wait_for_status(dev_server, [after])
    assert job["result"]["pid"] == (started - {gone["pid"]}).pop()
    d.signal(signal.SIGTERM)  # a drain: the other child leaves too
    assert d.wait() == 0
    stops = seen(out, "stopped")
    assert sorted(h["pid"] for h in stops) == sorted(started) and len(stops) == 2  # once per child
    assert len(seen(out, "started")) == 2


def test_a_hanging_stopped_hook_is_cut_at_the_exit_grace_and_its_child_replaced(dev_server, daemon_factory,
                                                                                tmp_path):
    out = tmp_path / "hooks.jsonl"
    d = daemon(daemon_factory, out, trouble="stopped=hang",
               args=["--child-exit-grace", "1", "--max-jobs-per-child", "1", "--kill-grace", "10"])
    first = dev_server.enqueue("trouble", {})
    (one,) = wait_for_status(dev_server, [first])
    (hung,) = wait_until(lambda: seen(out, "stopped") or None, timeout=15)  # the recycle: it hangs in its hook
    assert hung["pid"] == one["result"]["pid"]
    second = dev_server.enqueue("trouble", {})
    (two,) = wait_for_status(dev_server, [second], timeout=20)  # on the child that replaced it
    assert two["result"]["pid"] != one["result"]["pid"]
    assert dev_server.job(first)["status"] == "completed"  # the hang changed nothing of the job's outcome
    began = time.monotonic()
    d.signal(signal.SIGTERM)
    assert d.wait() == 0
    assert time.monotonic() - began < 8  # the second child's hang is cut at 1 s too, not at --kill-grace
    assert d.out.text().count("the child's exit ran past --child-exit-grace") == 2
    assert len(seen(out, "stopped")) == 2


def test_a_hook_that_hangs_during_a_job_is_bounded_by_the_jobs_timeout(dev_server, daemon_factory, tmp_path):
    out = tmp_path / "hooks.jsonl"
    d = daemon(daemon_factory, out, trouble="job:started=hang")
    stuck = dev_server.enqueue("trouble", {}, max_retries=0, timeout_seconds=2)
    (job,) = wait_for_status(dev_server, [stuck], statuses=("deadletter", "failed"), timeout=30)
    assert job["last_error"].startswith("JobTimeout: the job ran past its timeout of 2 s")
    d.wait_events("job timed out; stopping its child", job_id=stuck)
    wait_until(lambda: len(seen(out, "started")) == 2, timeout=20)  # its child was replaced
    assert len({h["pid"] for h in seen(out, "started")}) == 2


def test_a_settled_hook_that_hangs_keeps_the_jobs_outcome_and_is_bounded_by_the_next_jobs_timeout(
        dev_server, daemon_factory, tmp_path):
    out = tmp_path / "hooks.jsonl"
    d = daemon(daemon_factory, out, trouble="job:completed=hang")
    first = dev_server.enqueue("trouble", {})
    (one,) = wait_for_status(dev_server, [first])
    wait_until(lambda: seen(out, "job:completed"), timeout=15)  # the child now hangs in that hook, between jobs
    assert dev_server.job(first)["status"] == "completed"
    second = dev_server.enqueue("trouble", {}, max_retries=1, timeout_seconds=2)
    (two,) = wait_for_status(dev_server, [second], timeout=40)  # retried on the child that replaced the stuck one
    assert two["result"]["pid"] != one["result"]["pid"] and two["retry_count"] == 1
    assert dev_server.job(first)["status"] == "completed"
    d.signal(signal.SIGTERM)


def test_hooks_that_raise_are_logged_once_each_and_change_no_outcome(dev_server, daemon_factory, tmp_path):
    out = tmp_path / "hooks.jsonl"
    d = daemon(daemon_factory, out, trouble="job:claimed=raise,job:completed=raise,job:failed=raise,stopped=raise")
    ok = [dev_server.enqueue("trouble", {}) for _ in range(3)]
    bad = [dev_server.enqueue("trouble", {"fail": True}, max_retries=0) for _ in range(2)]
    done = wait_for_status(dev_server, ok)
    failed = wait_for_status(dev_server, bad, statuses=("deadletter", "failed"))
    assert all(j["result"]["pid"] == done[0]["result"]["pid"] for j in done)
    assert all(j["last_error"].startswith("ValueError: asked to fail") and j["retry_count"] == 0 for j in failed)
    wait_until(lambda: len(seen(out, "job:failed")) == 2 and len(seen(out, "job:completed")) == 3, timeout=15)
    d.signal(signal.SIGTERM)
    assert d.wait() == 0
    raised = [r for r in d.records() if r.get("msg", "").startswith("an event hook raised")]
    assert sorted(r["event"] for r in raised) == ["job:claimed", "job:completed", "job:failed", "stopped"]
    assert all("fails on purpose" in r.get("exc", "") for r in raised)
    assert seen(out, "stopped")  # it ran (and raised); the child still left cleanly
    assert not d.events("job failed") or all(e["job_id"] in bad for e in d.events("job failed"))
