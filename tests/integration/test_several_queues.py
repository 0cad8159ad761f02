"""One daemon on two queues, end to end over both transports: it registers with both (REST: the body's
`queue_names`, of which the server keeps only the first as the real one does; gRPC: metadata `queue_names`;
both: metadata `queues`), drains the first queue before it takes a job from the second, and counts each
queue's jobs in its own /metrics series. Outcomes are read back from the dev server's records, the register
request as sent, and the daemon's /metrics."""

from __future__ import annotations

import json

import pytest
from conftest import Daemon, metric, parse_ts, wait_for_status, wait_until
from support.fake_http import ForwardingProxy
from support.grpc_support import start_server

FIRST, SECOND = "urgent", "bulk"


@pytest.fixture
def server(tmp_path):
    s = start_server(tmp_path)
    yield s
    s.stop()


class RegisterRecorder(ForwardingProxy):
    """Forwards everything to the dev server and keeps the body of every register request."""

    def __init__(self, upstream: str):
        super().__init__(upstream)
        self.registered: list[dict] = []

    def _answer(self, request: bytes) -> bytes:
        head, _, body = request.partition(b"\r\n\r\n")
        if b" /api/v1/workers/register " in head.split(b"\r\n", 1)[0]:
            self.registered.append(json.loads(body))
        return super()._answer(request)


def transport_args(server, transport: str, proxy: RegisterRecorder) -> list[str]:
    if transport == "grpc":
        return ["--transport", "grpc", "--grpc-url", server.grpc_address]
    return ["--api-url", proxy.url]


@pytest.mark.timeout(90)
@pytest.mark.parametrize("transport", ["rest", "grpc"])
def test_two_queues_register_together_run_in_priority_order_and_are_counted_apart(server, transport):
    first = [server.enqueue(FIRST, {"do": "sleep", "secs": 0.05, "n": i}) for i in range(6)]
    second = [server.enqueue(SECOND, {"do": "sleep", "secs": 0.05, "n": i}) for i in range(4)]
    worker_id = f"w-two-{transport}"
    with RegisterRecorder(server.url) as proxy:
        daemon = Daemon(server, f"{FIRST},{SECOND}", procs=1, worker_id=worker_id,
                        args=["--health-port", "0", *transport_args(server, transport, proxy)])
        try:
            daemon.start().wait_ready()
            port = daemon.health_port
            run_and_check(server, daemon, transport, proxy, port, first, second)
        finally:
            daemon.stop()


def run_and_check(server, daemon: Daemon, transport: str, proxy: RegisterRecorder, port: int, first: list[str],
                  second: list[str]) -> None:
    worker_id = daemon.worker_id
    assert daemon.events("supervisor starting")[0]["queue"] == f"{FIRST},{SECOND}"
    worker = wait_until(lambda: server.worker(worker_id), timeout=10, what="the worker's row")
    assert worker["queue_name"] == FIRST and worker["queue_names"] == [FIRST]
    if transport == "grpc":  # gRPC metadata values are strings: the lists travel as JSON
        assert json.loads(worker["metadata"]["queues"]) == [FIRST, SECOND]
        assert json.loads(worker["metadata"]["queue_names"]) == [FIRST, SECOND]
    else:
        assert worker["metadata"]["queues"] == [FIRST, SECOND]
        assert [(body["queue_name"], body["queue_names"]) for body in proxy.registered] == [(FIRST, [FIRST, SECOND])]

    jobs = {job["id"]: job for job in wait_for_status(server, first + second, timeout=60)}
    assert {jobs[i]["queue_name"] for i in first} == {FIRST} and {jobs[i]["queue_name"] for i in second} == {SECOND}
    assert {job["assigned_worker_id"] for job in jobs.values()} == {worker_id}
    last_of_first = max(parse_ts(jobs[i]["started_at"]) for i in first)
    first_of_second = min(parse_ts(jobs[i]["started_at"]) for i in second)
    assert last_of_first <= first_of_second, "a job of the second queue started before the first was drained"

    wait_until(lambda: metric(port, "jobs_total", queue=SECOND, outcome="completed") == len(second), timeout=10,
               what="the second queue's completions in /metrics")
    assert metric(port, "jobs_total", queue=FIRST, outcome="completed") == len(first)
    for queue in (FIRST, SECOND):
        assert metric(port, "jobs_total", queue=queue, outcome="failed") == 0
        assert metric(port, "job_duration_seconds_count", queue=queue) == len(first if queue == FIRST else second)
