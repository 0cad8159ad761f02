"""The child's hooks in-process: built only for a worker with hooks, the server's answers acted on for the jobs
this child ran only, `error` for a refused report, at most MAX_AWAITING jobs remembered."""

from __future__ import annotations

import pytest
from spooled import SpooledClient
from spooled.worker import SpooledWorker

from supervisor.child import hooks as hooks_module
from supervisor.child.hooks import MAX_AWAITING, hooks_of

pytestmark = pytest.mark.timeout(30)


def worker_with(*events: str) -> tuple[SpooledWorker, list]:
    worker = SpooledWorker(SpooledClient(api_key="sk_test_" + "0" * 32, base_url="http://127.0.0.1:9"),
                           queue_name="q")
    got: list = []
    for event in events:
        worker.on(event, lambda data, event=event: got.append((event, data)))
    return worker, got


def test_no_worker_or_no_hook_costs_nothing():
    assert hooks_of(None, "w") is None
    assert hooks_of(worker_with()[0], "w") is None
    started_only = hooks_of(worker_with("started")[0], "w")
    assert started_only is not None and not started_only.wants_settled


def test_answers_run_for_the_jobs_this_child_ran_only():
    worker, got = worker_with("job:completed", "error")
    hooks = hooks_of(worker, "w")
    assert hooks is not None and hooks.wants_settled
    job = {"id": "j1", "queue_name": "q", "retry_count": 0, "max_retries": 3}
    hooks.job_ended(job, {"result": {"x": 1}})
    for msg in ({"t": "settled", "id": "other", "as": "completed"}, {"t": "settled", "id": "j1", "as": "completed"},
                {"t": "settled", "id": "j1", "as": "completed"}):  # not ours, ours, ours again (no second run)
        hooks.take_settled(msg)
    hooks.run_settled()
    assert [(event, data.job_id, data.result) for event, data in got] == [("job:completed", "j1", {"x": 1})]
    hooks.job_ended({**job, "id": "j2"}, {})
    hooks.take_settled({"t": "settled", "id": "j2", "as": "error", "error": "400 payload refused"})
    hooks.run_settled()
    event, data = got[-1]
    assert event == "error" and isinstance(data.error, hooks_module.ReportRefused) and "refused" in str(data.error)


def test_a_child_remembers_a_bounded_number_of_jobs():
    hooks = hooks_of(worker_with("job:failed")[0], "w")
    assert hooks is not None
    for n in range(MAX_AWAITING + 5):
        hooks.job_ended({"id": f"j{n}"}, {})
    assert len(hooks.awaiting) == MAX_AWAITING
    assert "j0" not in hooks.awaiting and f"j{MAX_AWAITING + 4}" in hooks.awaiting


def test_a_refused_result_is_the_error_hook_and_the_failure_sent_instead_settles_after_it():
    worker, got = worker_with("job:completed", "job:failed", "error")
    hooks = hooks_of(worker, "w")
    assert hooks is not None
    job = {"id": "j1", "queue_name": "q", "retry_count": 0, "max_retries": 0}
    hooks.job_ended(job, {"result": {"big": True}})
    hooks.take_settled({"t": "settled", "id": "j1", "as": "refused", "error": "400 INVALID_JSON: body too large"})
    hooks.run_settled()
    assert "j1" in hooks.awaiting  # still due: the failure's answer
    hooks.take_settled({"t": "settled", "id": "j1", "as": "failed", "error": "ResultRejected: ..."})
    hooks.run_settled()
    assert [event for event, _ in got] == ["error", "job:failed"] and not hooks.awaiting
    assert "body too large" in str(got[0][1].error) and got[1][1].will_retry is False
