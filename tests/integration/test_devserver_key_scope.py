"""A queue-scoped key stays in its queues on every surface of the real dev server: job routes by id are 404
for another queue's job, lists are filtered, webhooks and the dashboard need an unscoped key, workflows and
schedules of another queue are hidden, event streams and WebSockets carry only the key's queues, and gRPC
refuses another queue. Each test is one hostile caller: a key scoped to `mine` reaching for `theirs`."""

from __future__ import annotations

import json
import time

import pytest
import requests
from support.grpc_support import start_server
from websockets.sync.client import connect

pytestmark = pytest.mark.timeout(90)
grpc = pytest.importorskip("grpc")

from supervisor.proto import spooled_pb2, spooled_pb2_grpc  # noqa: E402


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = start_server(tmp_path_factory.mktemp("scope"))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def scoped(server) -> str:
    r = server.request("POST", "/api/v1/api-keys", json={"name": "mine-only", "queues": ["mine"]})
    assert r.status_code == 201, r.text
    return r.json()["key"]


def claimed(server, queue: str, worker: str = "w") -> dict:
    server.enqueue(queue, {"secret": "<b>theirs</b>"})
    r = server.request("POST", "/api/v1/jobs/claim", json={"queue_name": queue, "worker_id": worker, "limit": 1})
    return r.json()["jobs"][0]


def test_another_queues_jobs_are_hidden_from_every_job_route(server, scoped):
    job = claimed(server, "theirs")
    jid, lease = job["id"], job["lease_id"]
    server.enqueue("mine", {"n": 1})
    settle = {"worker_id": "w", "lease_id": lease}
    for method, path, body in (("GET", f"/api/v1/jobs/{jid}", None), ("DELETE", f"/api/v1/jobs/{jid}", None),
                               ("POST", f"/api/v1/jobs/{jid}/retry", None),
                               ("POST", f"/api/v1/jobs/{jid}/complete", {**settle, "result": 1}),
                               ("POST", f"/api/v1/jobs/{jid}/fail", {**settle, "error": "x"}),
                               ("POST", f"/api/v1/jobs/{jid}/heartbeat", settle),
                               ("GET", f"/api/v1/jobs/{jid}/dependencies", None),
                               ("POST", f"/api/v1/jobs/{jid}/dependencies", {"depends_on": [jid]}),
                               ("GET", f"/_dev/jobs/{jid}/history", None),
                               ("POST", f"/_dev/leases/{jid}/expire", None),
                               ("POST", f"/_dev/leases/{jid}/steal", None)):
        r = server.request(method, path, json=body, key=scoped)
        assert r.status_code == 404 and "theirs" not in r.text, (method, path, r.text)
    assert server.request("GET", f"/api/v1/jobs/{jid}").json()["status"] == "processing"  # nothing changed
    listed = server.request("GET", "/api/v1/jobs", key=scoped).json()
    assert listed and {j["queue_name"] for j in listed} == {"mine"}
    assert [r["id"] for r in server.request("GET", f"/api/v1/jobs/status?ids={jid}", key=scoped).json()] == []
    stats = server.request("GET", "/api/v1/jobs/stats", key=scoped).json()
    assert stats["processing"] == 0 and stats["total"] >= 1
    assert {q["queue_name"] for q in server.request("GET", "/api/v1/queues", key=scoped).json()} == {"mine"}
    r = server.request("POST", "/api/v1/jobs/dlq/purge", json={"confirm": True}, key=scoped)
    assert r.status_code == 403 and r.json()["code"] == "ACCESS_DENIED"
    r = server.request("POST", "/api/v1/jobs/dlq/retry", json={"queue_name": "theirs"}, key=scoped)
    assert r.status_code == 403
    for method, path, body in (("GET", "/api/v1/dashboard", None), ("GET", "/_dev/requests", None),
                               ("POST", "/_dev/faults", {"fail_503": 1.0}), ("POST", "/_dev/events/drop", None)):
        assert server.request(method, path, json=body, key=scoped).status_code == 403, path
    overview = server.request("GET", "/_dev/overview", key=scoped).json()
    assert [q["queue_name"] for q in overview["queues"]] == ["mine"]


def test_another_queues_workers_are_hidden(server, scoped):
    theirs = server.request("POST", "/api/v1/workers/register",
                            json={"queue_name": "theirs", "hostname": "h", "worker_id": "their-worker"}).json()["id"]
    mine = server.request("POST", "/api/v1/workers/register", json={"queue_name": "mine", "hostname": "h"},
                          key=scoped).json()["id"]
    assert {w["id"] for w in server.request("GET", "/api/v1/workers", key=scoped).json()} == {mine}
    for method, path, body in (("GET", f"/api/v1/workers/{theirs}", None),
                               ("POST", f"/api/v1/workers/{theirs}/heartbeat", {"current_jobs": 0}),
                               ("POST", f"/api/v1/workers/{theirs}/deregister", None)):
        r = server.request(method, path, json=body, key=scoped)
        assert r.status_code == 404, (path, r.text)
    assert server.request("GET", f"/api/v1/workers/{theirs}").json()["status"] == "healthy"


def test_webhooks_need_an_unscoped_key(server, scoped):
    made = server.request("POST", "/api/v1/outgoing-webhooks",
                          json={"name": "all", "url": "http://127.0.0.1:9/hook", "events": ["job.completed"]})
    assert made.status_code == 201, made.text
    wid = made.json()["id"]
    for method, path, body in (("GET", "/api/v1/outgoing-webhooks", None),
                               ("POST", "/api/v1/outgoing-webhooks",
                                {"name": "steal", "url": "http://127.0.0.1:9/x", "events": ["job.completed"]}),
                               ("GET", f"/api/v1/outgoing-webhooks/{wid}", None),
                               ("PUT", f"/api/v1/outgoing-webhooks/{wid}", {"name": "renamed"}),
                               ("DELETE", f"/api/v1/outgoing-webhooks/{wid}", None),
                               ("POST", f"/api/v1/outgoing-webhooks/{wid}/test", None),
                               ("GET", f"/api/v1/outgoing-webhooks/{wid}/deliveries", None),
                               ("POST", f"/api/v1/outgoing-webhooks/{wid}/retry/nope", None)):
        r = server.request(method, path, json=body, key=scoped)
        assert r.status_code == 403 and r.json()["code"] == "ACCESS_DENIED", (method, path, r.text)
    assert [w["name"] for w in server.request("GET", "/api/v1/outgoing-webhooks").json()] == ["all"]


def test_workflows_reaching_another_queue_are_refused_or_hidden(server, scoped):
    def workflow(queues, key=None):
        jobs = [{"key": f"k{i}", "queue_name": q, "payload": {}} for i, q in enumerate(queues)]
        return server.request("POST", "/api/v1/workflows", json={"name": "wf", "jobs": jobs}, key=key)

    r = workflow(["mine", "theirs"], key=scoped)
    assert r.status_code == 403 and "theirs" in r.json()["message"]
    assert server.request("GET", "/api/v1/jobs?queue_name=theirs&status=pending").status_code == 200
    own = workflow(["mine"], key=scoped).json()["workflow_id"]
    mixed = workflow(["mine", "theirs"]).json()["workflow_id"]
    for method, path in (("GET", f"/api/v1/workflows/{mixed}"), ("POST", f"/api/v1/workflows/{mixed}/cancel"),
                         ("POST", f"/api/v1/workflows/{mixed}/retry")):
        r = server.request(method, path, key=scoped)
        assert r.status_code == 404 and r.json()["message"] == "Workflow not found", (path, r.text)
    assert server.request("GET", f"/api/v1/workflows/{mixed}").json()["status"] != "cancelled"
    listed = {w["id"] for w in server.request("GET", "/api/v1/workflows", key=scoped).json()}
    assert own in listed and mixed not in listed
    assert server.request("GET", f"/api/v1/workflows/{own}", key=scoped).status_code == 200


def test_another_queues_schedules_are_hidden(server, scoped):
    body = {"name": "s", "cron_expression": "0 0 * * * *", "payload_template": {}}
    r = server.request("POST", "/api/v1/schedules", json={**body, "queue_name": "theirs"}, key=scoped)
    assert r.status_code == 403
    theirs = server.request("POST", "/api/v1/schedules", json={**body, "queue_name": "theirs"}).json()["id"]
    mine = server.request("POST", "/api/v1/schedules", json={**body, "queue_name": "mine"}, key=scoped).json()["id"]
    assert {s["id"] for s in server.request("GET", "/api/v1/schedules", key=scoped).json()} == {mine}
    for method, path, body2 in (("GET", f"/api/v1/schedules/{theirs}", None),
                                ("PUT", f"/api/v1/schedules/{theirs}", {"name": "x"}),
                                ("POST", f"/api/v1/schedules/{theirs}/pause", None),
                                ("POST", f"/api/v1/schedules/{theirs}/resume", None),
                                ("POST", f"/api/v1/schedules/{theirs}/trigger", None),
                                ("GET", f"/api/v1/schedules/{theirs}/history", None),
                                ("DELETE", f"/api/v1/schedules/{theirs}", None)):
        r = server.request(method, path, json=body2, key=scoped)
        assert r.status_code == 404 and r.json()["message"] == "Schedule not found", (path, r.text)
    assert server.request("GET", f"/api/v1/schedules/{theirs}").json()["name"] == "s"


def _wait_for(pred, what: str, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
    raise AssertionError(f"no {what}")


def test_event_streams_and_websockets_carry_only_the_keys_queues(server, scoped):
    sse = requests.get(server.url + "/api/v1/events", headers={"Authorization": f"Bearer {scoped}"}, stream=True,
                       timeout=10)
    assert sse.status_code == 200
    lines = sse.iter_lines(decode_unicode=True)
    assert next(lines) == ":connected"
    try:
        with connect(f"ws://127.0.0.1:{server.port}/api/v1/ws?token={scoped}", open_timeout=10) as ws:
            assert json.loads(ws.recv(timeout=10))["type"] == "Ping"
            ws.send(json.dumps({"cmd": "Subscribe", "queue": "theirs"}))  # ignored: outside the key's queues
            ws.send(json.dumps({"cmd": "Unsubscribe"}))  # widens the filter, never the scope
            ws.send(json.dumps({"cmd": "Ping"}))
            assert json.loads(ws.recv(timeout=10))["type"] == "Ping"  # the commands were read
            server.enqueue("theirs", {"secret": "<b>theirs</b>"})
            mine = server.enqueue("mine", {})
            got = json.loads(ws.recv(timeout=10))
            assert got["type"] == "JobCreated" and got["data"]["job_id"] == mine
            data = _wait_for(lambda: next((ln for ln in lines if ln.startswith("data:")), None), "SSE event")
            assert json.loads(data[5:])["data"]["job_id"] == mine
    finally:
        sse.close()
    r = requests.get(server.url + "/api/v1/events?queue=theirs", headers={"Authorization": f"Bearer {scoped}"},
                     timeout=10)
    assert r.status_code == 403


def test_grpc_keeps_a_scoped_key_in_its_queues(server, scoped):
    job = claimed(server, "theirs", "gw")
    md = [("x-api-key", scoped)]
    with grpc.insecure_channel(server.grpc_address) as channel:
        q = spooled_pb2_grpc.QueueServiceStub(channel)
        calls = ((q.Enqueue, spooled_pb2.EnqueueRequest(queue_name="theirs"), grpc.StatusCode.PERMISSION_DENIED),
                 (q.Dequeue, spooled_pb2.DequeueRequest(queue_name="theirs", worker_id="gw"),
                  grpc.StatusCode.PERMISSION_DENIED),
                 (q.GetQueueStats, spooled_pb2.GetQueueStatsRequest(queue_name="theirs"),
                  grpc.StatusCode.PERMISSION_DENIED),
                 (q.GetJob, spooled_pb2.GetJobRequest(job_id=job["id"]), grpc.StatusCode.NOT_FOUND),
                 (q.Complete, spooled_pb2.CompleteRequest(job_id=job["id"], worker_id="gw", lease_id=job["lease_id"]),
                  grpc.StatusCode.NOT_FOUND))
        for call, request, code in calls:
            with pytest.raises(grpc.RpcError) as info:
                call(request, timeout=5, metadata=md)
            assert info.value.code() == code, (request, info.value.details())
        assert q.Enqueue(spooled_pb2.EnqueueRequest(queue_name="mine"), timeout=5, metadata=md).job_id
        stream = q.StreamJobs(spooled_pb2.StreamJobsRequest(queue_name="theirs", worker_id="gw"), timeout=5,
                              metadata=md)
        with pytest.raises(grpc.RpcError) as info:
            next(stream)
        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert server.request("GET", f"/api/v1/jobs/{job['id']}").json()["status"] == "processing"
