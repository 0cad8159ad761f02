"""The official SDK's gRPC client (spooled 1.6.0 SpooledGrpcClient) against the dev server's --grpc-port.

Every test reads the outcome back (over gRPC and over REST: one store serves both).
"""

from __future__ import annotations

import queue
import subprocess
import sys
import threading
import time

import pytest
import requests
from conftest import ROOT, parse_ts, wait_until
from support.grpc_support import start_server

grpc = pytest.importorskip("grpc")
from spooled import errors  # noqa: E402
from spooled.grpc import SpooledGrpcClient  # noqa: E402
from spooled.grpc.client import GrpcCompleteRequest, GrpcDequeueRequest, GrpcFailRequest, GrpcRenewLeaseRequest  # noqa: E402
from spooled.grpc.client import ProcessRequest as SdkProcessRequest  # noqa: E402

Q = "grpc-q"


@pytest.fixture
def server(tmp_path):
    s = start_server(tmp_path)
    yield s
    s.stop()
    noise = [line for line in s.out.lines if "warning" in line or "Traceback" in line]
    assert not noise, noise  # no internal error and no stack trace, whatever the clients did


@pytest.fixture
def client(server):
    c = SpooledGrpcClient(address=server.grpc_address, api_key=server.api_key, timeout=10)
    yield c
    c.close()


def _claim_one(client, worker="w1", lease=30):
    jobs = client.queue.dequeue(Q, worker, lease_duration_secs=lease).jobs
    assert len(jobs) == 1
    return jobs[0]


def test_stubs_are_current():
    """The committed stubs are what regenerate.py makes from supervisor/proto/spooled.proto."""
    pytest.importorskip("grpc_tools")
    done = subprocess.run([sys.executable, "-m", "supervisor.proto.regenerate", "--check"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_register_with_stable_id_heartbeat_and_sticky_drain(server, client):
    first = client.workers.register(Q, "host-a", worker_id="stable-1", max_concurrency=4)
    again = client.workers.register(Q, "host-a", worker_id="stable-1", max_concurrency=4)
    assert first.worker_id == again.worker_id == "stable-1"
    assert first.heartbeat_interval_secs == 10
    workers = server.request("GET", "/api/v1/workers").json()
    assert [w["id"] for w in workers] == ["stable-1"]
    assert server.worker("stable-1")["max_concurrency"] == 4
    hb = client.workers.heartbeat("stable-1", current_jobs=2)
    assert hb.acknowledged and not hb.should_drain
    assert server.worker("stable-1")["current_jobs"] == 2
    assert not client.workers.heartbeat("nobody", current_jobs=0).acknowledged
    # draining is sticky: once the worker said it, a later `healthy` still gets should_drain
    assert client.workers.heartbeat("stable-1", current_jobs=0, status="draining").should_drain
    hb = client.workers.heartbeat("stable-1", current_jobs=0, status="healthy")
    assert hb.acknowledged and hb.should_drain
    assert server.worker("stable-1")["status"] == "draining"


def test_enqueue_dequeue_complete_and_read_back(server, client):
    made = client.queue.enqueue(Q, {"n": 7, "nested": {"xs": [1, 2]}}, max_retries=2, timeout_seconds=60)
    assert made.created
    job = _claim_one(client)
    assert job.id == made.job_id and job.lease_id and job.status == "processing"
    assert job.payload == {"n": 7.0, "nested": {"xs": [1.0, 2.0]}}  # Struct numbers are doubles
    assert job.max_retries == 2 and job.timeout_seconds == 60 and job.assigned_worker_id == "w1"
    assert client.queue.complete(job.id, "w1", {"ok": True, "v": 3}, lease_id=job.lease_id).success
    rest = server.job(job.id)
    assert rest["status"] == "completed" and rest["result"] == {"ok": True, "v": 3.0}
    got = client.queue.get_job(job.id).job
    assert got.status == "completed" and got.result == {"ok": True, "v": 3.0}
    stats = client.queue.get_queue_stats(Q)
    assert (stats.completed, stats.pending, stats.total) == (1, 0, 1)


def test_settlement_without_lease_id_is_invalid_argument(server, client):
    client.queue.enqueue(Q, {"x": 1})
    job = _claim_one(client)
    for call in (lambda: client.queue.complete(job.id, "w1", None, lease_id=""),
                 lambda: client.queue.fail(job.id, "w1", "boom", lease_id=""),
                 lambda: client.queue.renew_lease(job.id, "w1", 30, lease_id="")):
        with pytest.raises(errors.ValidationError, match="lease_id is required for job settlement"):
            call()
    assert server.job(job.id)["status"] == "processing"
    assert client.queue.complete(job.id, "w1", None, lease_id=job.lease_id).success  # with it: accepted


def test_fail_retry_unset_retries_and_false_dead_letters(server, client):
    client.queue.enqueue(Q, {"a": 1}, max_retries=3)
    job = _claim_one(client)
    answer = client.queue.fail(job.id, "w1", "transient", retry=None, lease_id=job.lease_id)
    assert answer.success and answer.will_retry and answer.next_retry_delay_secs >= 1
    rest = server.job(job.id)
    assert rest["status"] == "pending" and rest["retry_count"] == 1 and rest["last_error"] == "transient"
    client.queue.enqueue(Q, {"b": 2}, max_retries=3)
    other = _claim_one(client)
    assert other.id != job.id  # the retried job waits out its back-off
    answer = client.queue.fail(other.id, "w1", "fatal", retry=False, lease_id=other.lease_id)
    assert answer.success and not answer.will_retry
    rest = server.job(other.id)
    assert rest["status"] == "deadletter" and rest["retry_count"] == 1  # gRPC fail always counts the attempt
    dlq = server.request("GET", f"/api/v1/jobs/dlq?queue_name={Q}").json()
    assert [j["id"] for j in dlq] == [other.id]


def test_wrong_lease_and_expired_lease_are_failed_precondition(tmp_path):
    server = start_server(tmp_path, "--lease-sweep-interval", "60")  # no sweep: the expired lease stays ours
    client = SpooledGrpcClient(address=server.grpc_address, api_key=server.api_key, timeout=10)
    try:
        client.queue.enqueue(Q, {"x": 1})
        job = _claim_one(client, lease=1)  # clamped up to 5 s
        expires = parse_ts(server.job(job.id)["lease_expires_at"])
        assert 4.0 <= expires - parse_ts(server.job(job.id)["started_at"]) <= 6.0
        with pytest.raises(errors.ConflictError, match="does not match the job's current lease") as info:
            client.queue.complete(job.id, "w1", None, lease_id=job.lease_id + "x")
        assert info.value.code == "LEASE_EXPIRED"
        with pytest.raises(errors.NotFoundError, match="Job not found or not authorized"):
            client.queue.complete(job.id, "someone-else", None, lease_id=job.lease_id)

        wait_until(lambda: time.time() > expires + 0.05, timeout=15, interval=0.1, what="the 5 s lease to run out")
        with pytest.raises(errors.ConflictError, match="Lease expired") as info:
            client.queue.renew_lease(job.id, "w1", 30, lease_id=job.lease_id)
        assert info.value.code == "LEASE_EXPIRED"
        with pytest.raises(errors.ConflictError, match="Lease expired"):
            client.queue.complete(job.id, "w1", None, lease_id=job.lease_id)
        assert server.job(job.id)["status"] == "processing"
    finally:
        client.close()
        server.stop()


def test_renew_extends_and_clamps_the_lease(server, client):
    client.queue.enqueue(Q, {"x": 1})
    job = _claim_one(client, lease=10)
    before = parse_ts(server.job(job.id)["lease_expires_at"])
    renewed = client.queue.renew_lease(job.id, "w1", 120, lease_id=job.lease_id)
    assert renewed.success and renewed.new_expires_at is not None
    after = parse_ts(server.job(job.id)["lease_expires_at"])
    assert after - before > 100 and abs(after - renewed.new_expires_at.timestamp()) < 2
    client.queue.renew_lease(job.id, "w1", 999_999, lease_id=job.lease_id)  # clamped to 3600, not refused
    capped = parse_ts(server.job(job.id)["lease_expires_at"]) - parse_ts(server.job(job.id)["updated_at"])
    assert 3590 <= capped <= 3601


def test_deregister_hands_held_jobs_back(server, client):
    client.workers.register(Q, "h", worker_id="leaver")
    client.queue.enqueue(Q, {"x": 1})
    job = _claim_one(client, worker="leaver")
    assert client.workers.deregister("leaver").success
    rest = server.job(job.id)
    assert rest["status"] == "pending" and rest["retry_count"] == 0 and rest["assigned_worker_id"] is None
    assert server.worker("leaver")["status"] == "offline"
    with pytest.raises(errors.NotFoundError):
        client.workers.deregister("never-registered")


def test_wrong_or_missing_key_is_unauthenticated(server):
    bad = SpooledGrpcClient(address=server.grpc_address, api_key="sp_test_wrong", timeout=5)
    try:
        with pytest.raises(errors.AuthenticationError, match="Invalid API key"):
            bad.queue.enqueue(Q, {"x": 1})
        with pytest.raises(errors.AuthenticationError):
            list(bad.queue.stream_jobs(Q, "w1"))
    finally:
        bad.close()
    from supervisor.proto import spooled_pb2, spooled_pb2_grpc

    with grpc.insecure_channel(server.grpc_address) as channel:
        stub = spooled_pb2_grpc.QueueServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.GetQueueStats(spooled_pb2.GetQueueStatsRequest(queue_name=Q), timeout=5)
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert info.value.details() == "Missing x-api-key or authorization header"
        ok = stub.GetQueueStats(spooled_pb2.GetQueueStatsRequest(queue_name=Q), timeout=5,
                                metadata=[("authorization", f"Bearer {server.api_key}")])
        assert ok.queue_name == Q
    assert server.stats()["total"] == 0


def _reader(stream) -> queue.Queue:
    """Read a JobStream on a thread into a queue (the SDK's stream blocks)."""
    out: queue.Queue = queue.Queue()

    def run():
        try:
            for job in stream:
                out.put(job)
        except Exception as e:  # the cancel at the end of the test
            out.put(e)

    threading.Thread(target=run, daemon=True).start()
    return out


def _stub(server):
    from supervisor.proto import spooled_pb2, spooled_pb2_grpc

    channel = grpc.insecure_channel(server.grpc_address)
    return channel, spooled_pb2_grpc.QueueServiceStub(channel), spooled_pb2, [("x-api-key", server.api_key)]


def _started(server, job_id: str) -> float:
    return parse_ts(server.job(job_id)["started_at"])


def test_stream_jobs_one_job_out_at_a_time_on_the_one_second_clock(server, client):
    """The stream holds one job; a settlement and an enqueue are noticed at its next 1 s turn, not sooner."""
    stream = client.queue.stream_jobs(Q, "streamer", lease_duration_secs=30)
    got = _reader(stream)
    try:
        first = server.enqueue(Q, {"n": 1})  # created over REST, noticed by the stream's next turn
        job = got.get(timeout=10)
        assert job.id == first and job.lease_id
        second = server.enqueue(Q, {"n": 2})
        # the stream holds `first`, so `second` is left for anyone else: a REST claim gets it
        claimed = server.request("POST", "/api/v1/jobs/claim", json={"queue_name": Q, "worker_id": "rest-w"}).json()
        assert [j["id"] for j in claimed["jobs"]] == [second]
        assert got.empty()
        third = server.enqueue(Q, {"n": 3})
        assert client.queue.complete(job.id, "streamer", None, lease_id=job.lease_id).success
        settled = time.time()
        nxt = got.get(timeout=10)  # settled: the next one comes at the stream's next turn
        assert nxt.id == third
        # turns are 1 s apart: the third job was claimed a whole number of seconds after the first
        gap = _started(server, third) - _started(server, first)
        assert gap >= 0.95 and abs(gap - round(gap)) < 0.25, gap
        assert _started(server, third) >= settled - 0.05  # and not before the first was settled
        assert client.queue.complete(nxt.id, "streamer", None, lease_id=nxt.lease_id).success
        # with nothing to hand out, the stream sleeps a whole second between its claims
        fourth = server.enqueue(Q, {"n": 4})
        assert got.get(timeout=10).id == fourth
        gap = _started(server, fourth) - _started(server, third)
        assert gap >= 0.95 and abs(gap - round(gap)) < 0.25, gap
    finally:
        stream.cancel()


def test_stream_jobs_sleeps_a_second_at_a_time_until_a_scheduled_job_is_due(server, client):
    from datetime import UTC, datetime

    import psutil

    stream = client.queue.stream_jobs(Q, "patient", lease_duration_secs=30)
    got = _reader(stream)
    try:
        client.queue.get_queue_stats(Q)  # the stream is open and waiting on an empty queue
        ps = psutil.Process(server.proc.pid)
        cpu0 = sum(ps.cpu_times()[:2])
        due = time.time() + 2.0
        jid = server.enqueue(Q, {"n": 1}, scheduled_at=datetime.fromtimestamp(due, UTC).isoformat())
        job = got.get(timeout=15)
        claimed = _started(server, jid)
        assert job.id == jid and due - 0.05 <= claimed <= due + 1.5  # delivered once due, at most a turn late
        cpu = sum(ps.cpu_times()[:2]) - cpu0
        assert cpu < 0.3, f"the dev server burnt {cpu:.2f} s of CPU while the stream waited 2 s"
    finally:
        stream.cancel()


def test_stream_jobs_next_job_after_the_lease_runs_out(server, client):
    stream = client.queue.stream_jobs(Q, "slow", lease_duration_secs=5)
    got = _reader(stream)
    try:
        a = server.enqueue(Q, {"n": 1})
        assert got.get(timeout=10).id == a
        b = server.enqueue(Q, {"n": 2})
        nxt = got.get(timeout=20)  # never settled: after its 5 s lease the stream moves on
        assert nxt.id in (a, b)  # (the sweep may have put `a` back first)
    finally:
        stream.cancel()


def test_stream_without_a_lease_gets_the_300_s_default(server, client):
    stream = client.queue.stream_jobs(Q, "no-lease", lease_duration_secs=0)
    got = _reader(stream)
    try:
        jid = server.enqueue(Q, {"n": 1})
        assert got.get(timeout=10).id == jid
        row = server.job(jid)
        assert 299 <= parse_ts(row["lease_expires_at"]) - parse_ts(row["started_at"]) <= 301
    finally:
        stream.cancel()


def test_a_job_held_by_a_stream_that_went_away_stays_leased_until_it_expires(server, client):
    stream = client.queue.stream_jobs(Q, "leaver", lease_duration_secs=5)
    got = _reader(stream)
    jid = server.enqueue(Q, {"n": 1})
    job = got.get(timeout=10)
    assert job.id == jid
    stream.cancel()  # gone without settling: there is no release call, and the server does not guess one
    expires = parse_ts(server.job(jid)["lease_expires_at"])
    claimed = server.request("POST", "/api/v1/jobs/claim", json={"queue_name": Q, "worker_id": "other"}).json()
    assert claimed["jobs"] == []
    row = server.job(jid)
    assert row["status"] == "processing" and row["lease_id"] == job.lease_id
    row = wait_until(lambda: (r := server.job(jid))["status"] == "pending" and r, timeout=15, interval=0.1,
                     what="the stranded job back once its lease ran out")
    assert time.time() >= expires - 0.05 and row["retry_count"] == 1
    claimed = server.request("POST", "/api/v1/jobs/claim", json={"queue_name": Q, "worker_id": "other"}).json()
    assert [j["id"] for j in claimed["jobs"]] == [jid]


def _open_streams(stub, pb, md, n: int, worker: str = "s") -> tuple[list, dict]:
    """n StreamJobs calls on one channel; `ended` maps the index of each that ended to its status."""
    calls, ended = [], {}
    for i in range(n):
        call = stub.StreamJobs(pb.StreamJobsRequest(queue_name=Q, worker_id=f"{worker}{i}", lease_duration_secs=30),
                               metadata=md)
        call.add_done_callback(lambda c, i=i: ended.setdefault(i, (c.code(), c.details())))
        calls.append(call)
    return calls, ended


def _processing(stub, pb, md) -> int:
    return stub.GetQueueStats(pb.GetQueueStatsRequest(queue_name=Q), metadata=md, timeout=10).processing


def test_the_organization_holds_at_most_100_open_streams(server):
    channel, stub, pb, md = _stub(server)
    for i in range(101):
        server.enqueue(Q, {"n": i})
    calls, ended = _open_streams(stub, pb, md, 101)
    try:
        # one job out per stream: 100 jobs processing means 100 streams open, and one was refused
        wait_until(lambda: ended and _processing(stub, pb, md) == 100, timeout=30, interval=0.2,
                   what="100 streams holding a job each and one refused")
        assert list(ended.values()) == [(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                         "Stream limit reached: at most 100 open streams per organization")]
    finally:
        for c in calls:
            c.cancel()
        channel.close()


def test_a_closed_stream_frees_its_place_and_process_jobs_counts_too(tmp_path):
    server = start_server(tmp_path, "--grpc-stream-limit", "2")
    channel, stub, pb, md = _stub(server)
    try:
        bidi_in: queue.Queue = queue.Queue()
        bidi = stub.ProcessJobs(iter(bidi_in.get, None), metadata=md)
        bidi_in.put(pb.ProcessRequest(dequeue=pb.DequeueRequest(queue_name=Q, worker_id="bidi")))
        assert next(bidi).error.code == "NO_JOBS"  # the ProcessJobs stream is open, and it counts
        calls, ended = _open_streams(stub, pb, md, 2)
        wait_until(lambda: ended, timeout=20, what="the third stream refused")
        assert list(ended.values()) == [(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                         "Stream limit reached: at most 2 open streams per organization")]
        live = next(c for i, c in enumerate(calls) if i not in ended)
        live.cancel()
        bidi_in.put(None)
        wait_until(lambda: bidi.done() and live.done(), timeout=10, what="both streams ended")
        ids = {server.enqueue(Q, {"n": i}) for i in range(2)}
        kept = []

        def take_one():  # a freed place is free once the server has seen the cancel: try again until then
            call = stub.StreamJobs(pb.StreamJobsRequest(queue_name=Q, worker_id=f"again{len(kept)}"), metadata=md)
            item = _reader(call).get(timeout=10)
            if isinstance(item, grpc.RpcError):
                assert item.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                return None
            kept.append(call)
            return item.id
        got = {wait_until(take_one, timeout=20, interval=0.2, what="a new stream accepted") for _ in range(2)}
        assert got == ids  # two streams open again, one job out with each
        for c in kept:
            c.cancel()
    finally:
        channel.close()
        server.stop()


def test_malformed_stream_and_dequeue_requests_get_the_real_servers_errors(server):
    channel, stub, pb, md = _stub(server)
    try:
        cases = [("", "w", "Queue name must be 1-255 characters"),
                 ("-bad", "w", "Queue name cannot start with dots or dashes"),
                 ("a b", "w", "Queue name can only contain alphanumeric characters, dashes, underscores, and dots"),
                 (Q, "", "Worker ID is required")]
        for queue_name, worker, message in cases:
            with pytest.raises(grpc.RpcError) as info:
                next(stub.StreamJobs(pb.StreamJobsRequest(queue_name=queue_name, worker_id=worker), metadata=md,
                                     timeout=10))
            assert (info.value.code(), info.value.details()) == (grpc.StatusCode.INVALID_ARGUMENT, message)
            with pytest.raises(grpc.RpcError) as info:
                stub.Dequeue(pb.DequeueRequest(queue_name=queue_name, worker_id=worker), metadata=md, timeout=10)
            assert (info.value.code(), info.value.details()) == (grpc.StatusCode.INVALID_ARGUMENT, message)
        for req, message in ((pb.CompleteRequest(worker_id="w", lease_id="l"), "Job ID is required"),
                             (pb.CompleteRequest(job_id="j", lease_id="l"), "Worker ID is required")):
            with pytest.raises(grpc.RpcError) as info:
                stub.Complete(req, metadata=md, timeout=10)
            assert (info.value.code(), info.value.details()) == (grpc.StatusCode.INVALID_ARGUMENT, message)
    finally:
        channel.close()


def test_a_long_error_is_cut_and_marked(server, client):
    client.queue.enqueue(Q, {"x": 1}, max_retries=3)
    job = _claim_one(client)
    assert client.queue.fail(job.id, "w1", "é" * 3000, retry=True, lease_id=job.lease_id).success
    stored = server.job(job.id)["last_error"]
    assert stored.endswith("... [truncated]") and len(stored.encode()) <= 4096 and stored.startswith("éé")


def test_process_jobs_answers_each_message_in_order(server, client):
    stream = client.queue.process_jobs()
    answers = stream.receive()
    try:
        stream.send(SdkProcessRequest(dequeue=GrpcDequeueRequest(queue_name=Q, worker_id="bidi", batch_size=10)))
        assert next(answers).error_code == "NO_JOBS"
        ids = [server.enqueue(Q, {"n": i}) for i in range(3)]
        for _ in ids:
            stream.send(SdkProcessRequest(dequeue=GrpcDequeueRequest(queue_name=Q, worker_id="bidi", batch_size=10)))
        jobs = [next(answers).job for _ in ids]  # batch_size notwithstanding: one job per dequeue
        assert sorted(j.id for j in jobs) == sorted(ids)
        j0, j1, j2 = jobs
        stream.send(SdkProcessRequest(complete=GrpcCompleteRequest(job_id=j0.id, worker_id="bidi", result={"r": 1},
                                                                   lease_id=j0.lease_id)))
        stream.send(SdkProcessRequest(complete=GrpcCompleteRequest(job_id=j0.id, worker_id="bidi",
                                                                   lease_id=j0.lease_id)))  # a duplicate
        stream.send(SdkProcessRequest(fail=GrpcFailRequest(job_id=j1.id, worker_id="bidi", error="no", retry=False,
                                                           lease_id=j1.lease_id)))
        stream.send(SdkProcessRequest(renew_lease=GrpcRenewLeaseRequest(job_id=j2.id, worker_id="bidi",
                                                                        extension_secs=60, lease_id="wrong")))
        stream.send(SdkProcessRequest(renew_lease=GrpcRenewLeaseRequest(job_id=j2.id, worker_id="bidi",
                                                                        extension_secs=60, lease_id=j2.lease_id)))
        got = [next(answers) for _ in range(5)]
        assert got[0].complete.success
        assert got[1].error_code == "NOT_FOUND"
        assert got[2].fail.success and not got[2].fail.will_retry
        assert got[3].error_code == "LEASE_EXPIRED"
        assert got[4].renew_lease.success
        assert server.job(j0.id)["result"] == {"r": 1.0}
        assert server.job(j1.id)["status"] == "deadletter"
        assert server.job(j2.id)["status"] == "processing"
    finally:
        stream.cancel()


def test_process_jobs_refusals_are_worded_as_the_real_server_words_them(tmp_path):
    server = start_server(tmp_path, "--rate-limit", "2", "--rate-burst", "8")
    channel, stub, pb, md = _stub(server)
    requests_in: queue.Queue = queue.Queue()
    answers = stub.ProcessJobs(iter(requests_in.get, None), metadata=md)
    try:
        def ask(**which):
            requests_in.put(pb.ProcessRequest(**which))
            return next(answers)
        assert (ask().error.code, ask().error.message) == ("INVALID_REQUEST", "Empty request")
        got = ask(dequeue=pb.DequeueRequest(queue_name=Q)).error
        assert (got.code, got.message) == ("INVALID_ARGUMENT", "Worker ID is required")
        got = ask(complete=pb.CompleteRequest(job_id="j", worker_id="w")).error
        assert (got.code, got.message) == ("INVALID_ARGUMENT", "lease_id is required for job settlement")
        got = ask(complete=pb.CompleteRequest(worker_id="w", lease_id="l")).error  # no job id: matches no job
        assert (got.code, got.message) == ("NOT_FOUND", "Job not found or not authorized")
        got = ask(dequeue=pb.DequeueRequest(queue_name="", worker_id="w")).error  # no queue: nothing to claim
        assert got.code == "NO_JOBS"

        def limited():
            answer = ask(dequeue=pb.DequeueRequest(queue_name=Q, worker_id="w")).error
            return answer if answer.code == "RATE_LIMIT_EXCEEDED" else None
        got = wait_until(limited, timeout=10, interval=0, what="the rate limit, in band")
        assert got.message == "status: 'Some resource has been exhausted', self: \"Rate limit exceeded\""
        # the stream goes on: once the bucket refills, the next message is answered
        wait_until(lambda: ask(dequeue=pb.DequeueRequest(queue_name=Q, worker_id="w")).error.code == "NO_JOBS",
                   timeout=10, interval=0.3, what="an answer after the refusal")
    finally:
        requests_in.put(None)
        answers.cancel()
        channel.close()
        server.stop()


def test_rest_and_grpc_claim_each_others_jobs(server, client):
    listy = server.enqueue(Q, [1, 2, 3])  # REST allows any JSON payload; gRPC sends only objects
    job = _claim_one(client)
    assert job.id == listy and job.payload == {}  # missing on the wire; the SDK shows {}
    assert client.queue.complete(job.id, "w1", {"seen": "grpc"}, lease_id=job.lease_id).success
    assert server.job(listy)["status"] == "completed"
    made = client.queue.enqueue(Q, {"from": "grpc"})
    claimed = server.request("POST", "/api/v1/jobs/claim", json={"queue_name": Q, "worker_id": "rest-w"}).json()["jobs"]
    assert [j["id"] for j in claimed] == [made.job_id] and claimed[0]["payload"] == {"from": "grpc"}
    r = server.request("POST", f"/api/v1/jobs/{made.job_id}/complete",
                       json={"worker_id": "rest-w", "lease_id": claimed[0]["lease_id"], "result": {"via": "rest"}})
    assert r.status_code == 200, r.text
    assert client.queue.get_job(made.job_id).job.status == "completed"


def test_faults_apply_to_grpc(server, client):
    client.queue.enqueue(Q, {"x": 1})
    server.faults(fail_503=1.0)
    with pytest.raises(errors.NetworkError):
        client.queue.dequeue(Q, "w1")
    server.faults(fail_503=0.0, cut=1.0)
    with pytest.raises(errors.NetworkError):  # handled, then the answer is cut: the job was leased
        client.queue.dequeue(Q, "w1")
    server.faults(cut=0.0)
    assert server.job(server.request("GET", f"/api/v1/jobs?queue_name={Q}").json()[0]["id"])["status"] == "processing"


def test_a_delayed_call_holds_no_other_call(server, client):
    """The injected delay holds each unary call for its time, side by side: eight calls delayed 0.4 s each
    end within about one delay, not eight; and a call of an organization
    without a delay is not held at all."""
    import concurrent.futures

    client.queue.enqueue(Q, {"x": 1})
    server.faults(delay_ms=400)
    try:
        def timed_stats() -> float:
            t = time.monotonic()
            assert client.queue.get_queue_stats(Q).pending == 1
            return time.monotonic() - t

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            start = time.monotonic()
            waits = list(pool.map(lambda _: timed_stats(), range(8)))
            took = time.monotonic() - start
        assert min(waits) >= 0.38, waits  # each call waited out its delay
        assert took < 2.0, (took, waits)  # ...at the same time as the others (one after another: 3.2 s)
        other = requests.post(server.url + "/api/v1/organizations", json={"name": "Other", "slug": "other-delay"},
                              timeout=5)
        assert other.status_code == 201, other.text
        quick = SpooledGrpcClient(address=server.grpc_address, api_key=other.json()["api_key"]["key"], timeout=10)
        try:
            t = time.monotonic()
            quick.queue.get_queue_stats(Q)
            assert time.monotonic() - t < 0.35  # its organization has no delay (faults set per organization)
        finally:
            quick.close()
    finally:
        server.faults(delay_ms=0)


def test_quota_and_rate_limit_are_resource_exhausted(tmp_path):
    server = start_server(tmp_path, "--max-workers", "1", "--rate-limit", "2", "--rate-burst", "4")
    client = SpooledGrpcClient(address=server.grpc_address, api_key=server.api_key, timeout=5)
    try:
        client.workers.register(Q, "h", worker_id="one")
        with pytest.raises(errors.QuotaExceededError, match="limit reached"):
            client.workers.register(Q, "h", worker_id="two")

        def limited():
            try:
                client.queue.get_queue_stats(Q)
                return None
            except errors.RateLimitError as e:
                return e
        assert "Rate limit exceeded" in str(wait_until(limited, timeout=10, interval=0, what="the rate limit"))
    finally:
        client.close()
        server.stop()


def test_grpc_port_without_the_extra_exits_2_saying_how_to_install(tmp_path):
    code = ("import sys; sys.modules['grpc'] = None; from supervisor.devserver.cli import main; "
            f"sys.exit(main(['--port', '0', '--grpc-port', '0', '--db', {str(tmp_path / 'x.db')!r}]))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "pip install 'spooled-supervisor[grpc]'" in done.stderr and len(done.stderr.strip().splitlines()) == 1
