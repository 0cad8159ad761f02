"""Workflows and job dependencies on the dev server as the real server runs them: only jobs whose
dependencies are met are claimed, a completion releases its dependents, a dead-lettered job cancels the
ones that can no longer run, a workflow's status follows its jobs, and bad definitions are refused with
the real server's errors. Read through the official SDK where it has the call, and run under the real
daemon in dependency order."""

from __future__ import annotations

import pytest
from conftest import wait_for_status, wait_until
from spooled import SpooledClient
from spooled.types.workflows import AddDependenciesParams, CreateWorkflowParams

pytestmark = pytest.mark.timeout(90)


def _client(server) -> SpooledClient:
    return SpooledClient(api_key=server.api_key, base_url=server.url)


def _claim_all(server, queue: str, worker: str = "w") -> list[dict]:
    r = server.request("POST", "/api/v1/jobs/claim", json={"queue_name": queue, "worker_id": worker, "limit": 100})
    assert r.status_code == 200, r.text
    return r.json()["jobs"]


def _complete(server, job: dict, worker: str = "w") -> None:
    r = server.request("POST", f"/api/v1/jobs/{job['id']}/complete", json={"worker_id": worker,
                                                                          "lease_id": job["lease_id"]})
    assert r.status_code == 200, r.text


def _fail(server, job: dict, worker: str = "w") -> None:
    r = server.request("POST", f"/api/v1/jobs/{job['id']}/fail", json={"worker_id": worker,
                                                                      "lease_id": job["lease_id"], "error": "no"})
    assert r.status_code == 200, r.text


def _diamond(queue: str, **extra) -> dict:
    return {"name": "diamond (test): 1", "jobs": [
        {"key": "a", "queue_name": queue, "payload": {"k": "a"}, **extra},
        {"key": "b", "queue_name": queue, "payload": {"k": "b"}, "depends_on": ["a"]},
        {"key": "c", "queue_name": queue, "payload": {"k": "c"}, "depends_on": ["a"]},
        {"key": "d", "queue_name": queue, "payload": {"k": "d"}, "depends_on": ["b", "c"]},
    ]}


def test_a_diamond_runs_level_by_level_and_completes(dev_server):
    sdk = _client(dev_server)
    made = sdk.workflows.create(CreateWorkflowParams.model_validate(_diamond("wf-q")))
    assert made.status == "pending"
    ids = {m.key: m.job_id for m in made.job_ids}
    assert set(ids) == {"a", "b", "c", "d"}

    level = _claim_all(dev_server, "wf-q")
    assert [j["id"] for j in level] == [ids["a"]]
    running = sdk.workflows.get(made.workflow_id)
    assert running.status == "running" and running.started_at is not None
    _complete(dev_server, level[0])
    level = _claim_all(dev_server, "wf-q")
    assert {j["id"] for j in level} == {ids["b"], ids["c"]}
    _complete(dev_server, level[0])
    assert _claim_all(dev_server, "wf-q") == []  # d waits for both
    deps = sdk.workflows.jobs.get_dependencies(ids["d"])
    assert deps.dependencies_met is False and {d.job_id for d in deps.dependencies} == {ids["b"], ids["c"]}
    _complete(dev_server, level[1])
    [last] = _claim_all(dev_server, "wf-q")
    assert last["id"] == ids["d"]
    _complete(dev_server, last)

    done = sdk.workflows.get(made.workflow_id)
    assert done.status == "completed" and done.completed_jobs == 4 and done.progress_percent == 100.0
    detail = dev_server.request("GET", f"/api/v1/workflows/{made.workflow_id}").json()
    assert [j["id"] for j in detail["jobs"]] == [ids[k] for k in "abcd"]
    assert detail["progress"] == {"total": 4, "completed": 4, "failed": 0, "pending": 0, "processing": 0}
    assert {(e["parent_job_id"], e["child_job_id"]) for e in detail["dependencies"]} == {
        (ids["a"], ids["b"]), (ids["a"], ids["c"]), (ids["b"], ids["d"]), (ids["c"], ids["d"])}
    job = detail["jobs"][0]
    assert job["queue"] == "wf-q" and job["payload"] == {"k": "a"} and job["timeout_ms"] == 300000
    assert [w.id for w in sdk.workflows.list()] == [made.workflow_id]
    a_deps = dev_server.request("GET", f"/api/v1/jobs/{ids['a']}/dependencies").json()
    assert a_deps["dependencies"] == [] and {d["job_id"] for d in a_deps["dependents"]} == {ids["b"], ids["c"]}
    assert a_deps["dependencies_met"] is True


def test_a_dead_lettered_job_cancels_what_can_no_longer_run_and_retry_resumes(dev_server):
    wf = _diamond("wf-f", max_retries=0)
    wf["jobs"].append({"key": "e", "queue_name": "wf-f", "payload": {}, "depends_on": ["a", "x"],
                       "dependency_mode": "any"})
    wf["jobs"].append({"key": "x", "queue_name": "wf-f", "payload": {}})
    made = dev_server.request("POST", "/api/v1/workflows", json=wf)
    assert made.status_code == 200, made.text
    ids = {m["key"]: m["job_id"] for m in made.json()["job_ids"]}
    wid = made.json()["workflow_id"]
    first = {j["id"]: j for j in _claim_all(dev_server, "wf-f")}
    assert set(first) == {ids["a"], ids["x"]}
    _fail(dev_server, first[ids["a"]])  # max_retries 0: dead-lettered at once
    for key in "bcd":
        job = dev_server.job(ids[key])
        assert job["status"] == "cancelled" and job["last_error"] == "Parent job failed or was deadlettered"
    assert dev_server.job(ids["e"])["status"] == "pending"  # "any": x can still complete
    assert dev_server.request("POST", f"/api/v1/workflows/{wid}/retry").status_code == 400  # still running
    _complete(dev_server, first[ids["x"]])
    [e] = _claim_all(dev_server, "wf-f")
    assert e["id"] == ids["e"]
    _complete(dev_server, e)
    failed = dev_server.request("GET", f"/api/v1/workflows/{wid}").json()
    assert failed["status"] == "failed" and failed["progress"]["failed"] == 4 and failed["progress"]["completed"] == 2
    summary = [w for w in dev_server.request("GET", "/api/v1/workflows?status=failed").json() if w["id"] == wid]
    assert summary and summary[0]["failed_jobs"] == 1 and summary[0]["completed_jobs"] == 2

    retried = dev_server.request("POST", f"/api/v1/workflows/{wid}/retry")
    assert retried.status_code == 200 and retried.json()["status"] == "running"
    assert dev_server.request("GET", "/api/v1/jobs/dlq").json() == []
    [a] = _claim_all(dev_server, "wf-f")  # b, c, d wait for a again
    assert a["id"] == ids["a"] and a["retry_count"] == 0
    _complete(dev_server, a)
    for job in _claim_all(dev_server, "wf-f"):
        _complete(dev_server, job)
    [d] = _claim_all(dev_server, "wf-f")
    _complete(dev_server, d)
    assert dev_server.request("GET", f"/api/v1/workflows/{wid}").json()["status"] == "completed"


def test_cancelling_a_workflow_cancels_its_waiting_jobs(dev_server):
    made = dev_server.request("POST", "/api/v1/workflows", json=_diamond("wf-c")).json()
    [a] = _claim_all(dev_server, "wf-c")
    r = dev_server.request("POST", f"/api/v1/workflows/{made['workflow_id']}/cancel")
    assert r.status_code == 200 and r.json()["status"] == "cancelled" and r.json()["completed_at"]
    statuses = {j["id"]: j["status"] for j in
                dev_server.request("GET", f"/api/v1/workflows/{made['workflow_id']}").json()["jobs"]}
    assert statuses[a["id"]] == "processing" and sorted(statuses.values()).count("cancelled") == 3
    _complete(dev_server, a)  # the running job still finishes; nothing is released
    assert _claim_all(dev_server, "wf-c") == []


@pytest.mark.parametrize("body,status,code,message", [
    ({"name": "w", "jobs": [{"key": "a", "queue_name": "q", "payload": 1, "depends_on": ["a"]}]},
     400, "BAD_REQUEST", "Circular dependency detected in workflow"),
    ({"name": "w", "jobs": [{"key": "a", "queue_name": "q", "payload": 1, "depends_on": ["b"]},
                            {"key": "b", "queue_name": "q", "payload": 1, "depends_on": ["a"]}]},
     400, "BAD_REQUEST", "Circular dependency detected in workflow"),
    ({"name": "w", "jobs": [{"key": "a", "queue_name": "q", "payload": 1, "depends_on": ["zz"]}]},
     400, "BAD_REQUEST", "Job 'a' depends on unknown job 'zz'"),
    ({"name": "w", "jobs": [{"key": "a", "queue_name": "q", "payload": 1},
                            {"key": "a", "queue_name": "q", "payload": 2}]},
     400, "BAD_REQUEST", "Workflow job keys must be unique"),
    ({"jobs": [{"key": "a", "queue_name": "q", "payload": 1}]}, 422, "VALIDATION_ERROR", "name"),
    ({"name": "w", "jobs": [{"key": "a", "queue_name": "q"}]}, 422, "VALIDATION_ERROR", "payload"),
    ({"name": "w", "jobs": []}, 400, "VALIDATION_ERROR", "1-100 jobs"),
    ({"name": "w", "jobs": [{"key": f"k{i}", "queue_name": "q", "payload": 1} for i in range(101)]},
     400, "VALIDATION_ERROR", "1-100 jobs"),
    ({"name": "<script>", "jobs": [{"key": "a", "queue_name": "q", "payload": 1}]},
     400, "VALIDATION_ERROR", "invalid characters"),
    ({"name": "w", "jobs": [{"key": "a b", "queue_name": "q", "payload": 1}]}, 400, "VALIDATION_ERROR", "Job key"),
    ({"name": "w", "jobs": [{"key": "a", "queue_name": ".q", "payload": 1}]}, 400, "VALIDATION_ERROR", "cannot start"),
    ({"name": "w", "jobs": [{"key": "a", "queue_name": "q" * 101, "payload": 1}]}, 400, "VALIDATION_ERROR",
     "between 1 and 100"),  # a longer name no claim accepts
    ({"name": "w", "jobs": [{"key": "a", "queue_name": "q", "payload": 1, "dependency_mode": "some"}]},
     422, "VALIDATION_ERROR", "unknown variant"),
    ({"name": "w", "jobs": [{"key": "a", "queue_name": "q", "payload": 1, "priority": 101}]},
     400, "VALIDATION_ERROR", "priority"),
    ({"name": "w", "jobs": "a"}, 422, "VALIDATION_ERROR", "jobs"),
], ids=["self-cycle", "cycle", "unknown-key", "duplicate-key", "no-name", "no-payload", "no-jobs", "101-jobs",
        "markup-name", "bad-key", "bad-queue", "long-queue", "bad-mode", "priority", "jobs-not-array"])
def test_a_bad_workflow_is_refused_with_the_real_servers_error(dev_server, body, status, code, message):
    r = dev_server.request("POST", "/api/v1/workflows", json=body)
    assert r.status_code == status, r.text
    assert r.json()["code"] == code and message in r.json()["message"], r.json()
    assert dev_server.request("GET", "/api/v1/workflows").json() == []
    assert dev_server.request("GET", "/api/v1/jobs").json() == []  # nothing half-made


def test_unknown_workflows_and_jobs_are_404(dev_server):
    for method, path in [("GET", "/api/v1/workflows/nope"), ("POST", "/api/v1/workflows/nope/cancel"),
                         ("POST", "/api/v1/workflows/nope/retry"), ("GET", "/api/v1/jobs/nope/dependencies")]:
        r = dev_server.request(method, path)
        assert r.status_code == 404 and r.json()["code"] == "NOT_FOUND", (path, r.text)
    jid = dev_server.enqueue("deps", {})
    r = dev_server.request("POST", f"/api/v1/jobs/{jid}/dependencies", json={"depends_on": ["nope"]})
    assert r.status_code == 404 and r.json()["message"] == "Dependency job nope not found in your organization"
    other = dev_server.request("POST", "/api/v1/organizations", json={"name": "Other org", "slug": "other-org"})
    key = other.json()["api_key"]["key"]
    assert dev_server.request("GET", f"/api/v1/jobs/{jid}/dependencies", key=key).status_code == 404


def test_dependencies_added_later_gate_a_job_and_cycles_are_skipped(dev_server):
    sdk = _client(dev_server)
    first, second = dev_server.enqueue("later", {"n": 1}), dev_server.enqueue("later", {"n": 2})
    added = sdk.workflows.jobs.add_dependencies(second, AddDependenciesParams(dependency_job_ids=[first, second]))
    assert added.added_count == 1 and added.dependencies_met is False  # the self edge is skipped
    back = dev_server.request("POST", f"/api/v1/jobs/{first}/dependencies", json={"depends_on": [second]})
    assert back.status_code == 200 and back.json() == {"dependencies_added": 0, "dependencies_met": True}
    [job] = _claim_all(dev_server, "later")
    assert job["id"] == first
    _complete(dev_server, job)
    [job] = _claim_all(dev_server, "later")
    assert job["id"] == second
    bad = dev_server.request("POST", f"/api/v1/jobs/{first}/dependencies", json={"depends_on": []})
    assert bad.status_code == 400 and bad.json()["code"] == "VALIDATION_ERROR"
    bad = dev_server.request("POST", f"/api/v1/jobs/{first}/dependencies", json={"depends_on": [1]})
    assert bad.status_code == 422


def test_a_parent_job_releases_or_cancels_its_child(dev_server):
    parent = dev_server.enqueue("pc", {}, max_retries=0)
    child = dev_server.enqueue("pc", {}, parent_job_id=parent)
    assert dev_server.job(child)["dependencies_met"] is False
    deps = dev_server.request("GET", f"/api/v1/jobs/{child}/dependencies").json()
    assert [d["job_id"] for d in deps["dependencies"]] == [parent]
    [job] = _claim_all(dev_server, "pc")
    _fail(dev_server, job)
    assert dev_server.job(child)["status"] == "cancelled"
    elsewhere = dev_server.request("POST", "/api/v1/jobs", json={"queue_name": "other", "payload": {},
                                                               "parent_job_id": parent})
    assert elsewhere.status_code == 400 and "same queue" in elsewhere.json()["message"]


def test_a_three_level_workflow_runs_in_dependency_order_under_the_daemon(dev_server, daemon_factory):
    wf = {"name": "three levels", "jobs": [
        {"key": "root", "queue_name": "wf-d", "payload": {"do": "sleep", "secs": 0.2}},
        {"key": "mid1", "queue_name": "wf-d", "payload": {"do": "sleep", "secs": 0.2}, "depends_on": ["root"]},
        {"key": "mid2", "queue_name": "wf-d", "payload": {"do": "sleep", "secs": 0.2}, "depends_on": ["root"]},
        {"key": "leaf", "queue_name": "wf-d", "payload": {"do": "sleep", "secs": 0.2},
         "depends_on": ["mid1", "mid2"]},
    ]}
    made = dev_server.request("POST", "/api/v1/workflows", json=wf).json()
    ids = {m["key"]: m["job_id"] for m in made["job_ids"]}
    daemon_factory("wf-d", procs=3, args=["--wake", "poll"])
    jobs = {j["id"]: j for j in wait_for_status(dev_server, list(ids.values()), timeout=60)}
    by_key = {k: jobs[v] for k, v in ids.items()}
    for child, parents in [("mid1", ["root"]), ("mid2", ["root"]), ("leaf", ["mid1", "mid2"])]:
        for parent in parents:
            assert by_key[child]["started_at"] >= by_key[parent]["completed_at"], (child, parent)
    wait_until(lambda: dev_server.request("GET", f"/api/v1/workflows/{made['workflow_id']}").json()["status"]
               == "completed", what="the workflow to complete")


@pytest.mark.parametrize("query,status", [("offset=" + "9" * 20, 400), ("offset=-1", 200),
                                          ("offset=1000000000000", 200), ("limit=" + "9" * 20, 400),
                                          ("limit=0", 200), ("offset=1e3", 400)])
def test_hostile_paging_of_the_workflow_list_is_a_clear_answer_never_a_500(dev_server, query, status):
    r = dev_server.request("GET", "/api/v1/workflows?" + query)
    assert r.status_code == status, r.text
    if status == 400:
        assert r.json()["code"] == "BAD_REQUEST" and "Failed to deserialize query string" in r.json()["message"]
    else:
        assert isinstance(r.json(), list)


def test_a_running_job_given_a_dependency_is_held_after_its_retry_until_it_completes(dev_server):
    """As the real server: dependencies may be added to a job of any status; one that is processing keeps
    its lease, and once it fails back to pending it waits for the new dependency."""
    runner = dev_server.enqueue("held", {"n": 1})
    [job] = _claim_all(dev_server, "held")
    gate = dev_server.enqueue("gate", {})
    r = dev_server.request("POST", f"/api/v1/jobs/{runner}/dependencies", json={"depends_on": [gate]})
    assert r.status_code == 200 and r.json() == {"dependencies_added": 1, "dependencies_met": False}
    _fail(dev_server, job)
    assert dev_server.job(runner)["status"] == "pending"
    deps = dev_server.request("GET", f"/api/v1/jobs/{runner}/dependencies").json()
    assert deps["dependencies_met"] is False and [d["job_id"] for d in deps["dependencies"]] == [gate]
    [g] = _claim_all(dev_server, "gate")
    _complete(dev_server, g)
    assert dev_server.request("GET", f"/api/v1/jobs/{runner}/dependencies").json()["dependencies_met"] is True
    claimed = wait_until(lambda: _claim_all(dev_server, "held"), timeout=10, what="the retry after its back-off")
    assert [j["id"] for j in claimed] == [runner]
