"""With --transport grpc the daemon claims over gRPC and listens for new jobs on the REST events stream
beside it (--api-url): a job enqueued over gRPC while it idles is announced and claimed at once."""

from __future__ import annotations

import pytest
from conftest import Daemon, wait_for_status
from support.grpc_support import start_server

pytestmark = pytest.mark.timeout(60)


def test_a_job_enqueued_over_grpc_wakes_a_grpc_daemon(tmp_path):
    import grpc

    from supervisor.proto import spooled_pb2 as pb
    from supervisor.proto import spooled_pb2_grpc as pb_grpc

    server = start_server(tmp_path)
    daemon = Daemon(server, "g-wake", args=["--transport", "grpc", "--grpc-url", server.grpc_address,
                                            "--poll-interval", "60", "--log-level", "debug"])
    try:
        daemon.start().wait_ready()
        daemon.wait_events("listening for new jobs on the events stream")
        with grpc.insecure_channel(server.grpc_address) as channel:
            stub = pb_grpc.QueueServiceStub(channel)
            answer = stub.Enqueue(pb.EnqueueRequest(queue_name="g-wake", payload={"n": 1}),
                                  metadata=[("x-api-key", server.api_key)], timeout=10)
        job = answer.job_id
        wait_for_status(server, [job], timeout=15)
        daemon.wait_events("job announced", job_id=job)
        msgs = [(r.get("msg"), r.get("job_id")) for r in daemon.records()]
        assert msgs.index(("job announced", job)) < msgs.index(("job claimed", job))
    finally:
        daemon.stop()
        server.stop()
