"""The daemon's gRPC transport (supervisor.client.grpc_transport) driven in-process by a small select()
loop, as the parent drives it, against the real dev server's gRPC port. Outcomes are read back over REST."""

from __future__ import annotations

import selectors
import subprocess
import sys
import threading
import time

import pytest
from conftest import ROOT, free_port, parse_ts, wait_until
from support.grpc_support import GrpcDriver as Driver
from support.grpc_support import start_server

from supervisor.client import rest as api
from supervisor.client.grpc_transport import GrpcMissing, parse_grpc_url, require_grpc
from supervisor.client.rest import Secret

Q = "gq"


@pytest.fixture
def server(tmp_path):
    s = start_server(tmp_path)
    yield s
    s.stop()


@pytest.fixture(params=["unary", "unary-grpcio", "stream"])
def mode(request):
    return request.param


@pytest.fixture
def drv(server, mode):
    d = Driver(server.grpc_address, server.api_key, mode=mode)
    yield d
    d.close()


def test_register_heartbeat_drain_and_deregister(server, drv):
    a = drv.api
    answer = drv.ok("reg", a.register_call(Q, "gw-1", "host-1", 3, {"procs": 3, "pid": 42}))
    assert answer["id"] == "gw-1" and answer["heartbeat_interval_secs"] == 10
    w = server.worker("gw-1")
    assert w["status"] == "healthy" and w["max_concurrency"] == 3 and w["metadata"] == {"procs": "3", "pid": "42"}
    hb = drv.ok("hb", a.heartbeat_call("gw-1", 2, "healthy", {"busy": 1}, 12.5, 3.25))
    assert hb == {"acknowledged": True, "should_drain": False}
    assert server.worker("gw-1")["current_jobs"] == 2
    _, err = drv.call("hb2", a.heartbeat_call("nobody", 0, "healthy"))
    assert isinstance(err, api.Rejected) and err.status == 404  # the parent then registers again
    r = server.request("POST", "/api/v1/workers/gw-1/heartbeat", json={"current_jobs": 0, "status": "draining"})
    assert r.status_code == 200, r.text
    assert drv.ok("hb3", a.heartbeat_call("gw-1", 0, "healthy"))["should_drain"] is True
    a.deregister("gw-1", timeout=5)
    assert server.worker("gw-1")["status"] == "offline"
    with pytest.raises(api.Rejected):
        a.deregister("never-was", timeout=5)
    routes = {r[0] for r in drv.requests}
    assert {"register", "worker_heartbeat", "deregister"} <= routes


def test_claim_complete_fail_renew_in_band(server, drv):
    a = drv.api
    ids = [server.enqueue(Q, {"n": 5, "big": 2 ** 40, "f": 1.5, "xs": [1, 2.5]}, max_retries=2) for _ in range(3)]
    jobs = drv.ok("claim", a.claim_call(Q, "gw", 5, 30))  # 5 dequeues, 3 jobs
    assert sorted(j["id"] for j in jobs) == sorted(ids)
    job = jobs[0]
    assert job["payload"] == {"n": 5, "big": 2 ** 40, "f": 1.5, "xs": [1, 2.5]}
    assert type(job["payload"]["n"]) is int and type(job["payload"]["big"]) is int
    assert job["lease_id"] and job["max_retries"] == 2 and job["timeout_seconds"] == 300
    assert abs(parse_ts(job["lease_expires_at"]) - parse_ts(server.job(job["id"])["lease_expires_at"])) < 0.01
    first, second, third = jobs
    assert drv.ok("c1", a.complete_call(first["id"], "gw", first["lease_id"], {"r": 1, "ok": True})) is None
    assert server.job(first["id"])["result"] == {"r": 1.0, "ok": True}
    _, err = drv.call("c1-again", a.complete_call(first["id"], "gw", first["lease_id"], None))
    assert isinstance(err, api.LeaseLost)  # not re-sent by us after a cut: the parent drops the outcome
    answer = drv.ok("f2", a.fail_call(second["id"], "gw", second["lease_id"], "boom " * 2000))
    assert answer["will_retry"] is True
    rest = server.job(second["id"])
    assert rest["status"] == "pending" and rest["retry_count"] == 1 and len(rest["last_error"]) <= 4096
    before = parse_ts(server.job(third["id"])["lease_expires_at"])
    drv.ok("r3", a.renew_lease_call(third["id"], "gw", third["lease_id"], 600))
    assert parse_ts(server.job(third["id"])["lease_expires_at"]) - before > 500
    _, err = drv.call("r3-bad", a.renew_lease_call(third["id"], "gw", "not-the-lease", 60))
    assert isinstance(err, api.LeaseLost) and err.code == "LEASE_EXPIRED"
    _, err = drv.call("c3-list", a.complete_call(third["id"], "gw", third["lease_id"], [1, 2]))
    assert isinstance(err, api.Rejected) and "only JSON objects" in err.message  # never sent
    assert server.job(third["id"])["status"] == "processing"
    assert drv.ok("empty", a.claim_call("other-queue", "gw", 2, 30)) == []


def test_rest_fallback_delivers_a_non_object_result_exactly(server, mode):
    d = Driver(server.grpc_address, server.api_key, mode=mode, rest_url=server.url)
    try:
        server.enqueue(Q, {"x": 1})
        (job,) = d.ok("claim", d.api.claim_call(Q, "gw", 1, 30))
        value = [1, 2, {"big": 2 ** 60}]
        assert d.ok("c", d.api.complete_call(job["id"], "gw", job["lease_id"], value)) == {"success": True}
        assert server.job(job["id"])["result"] == value  # over REST: exact, big integer included
        assert ("complete", 200) in {(r[0], r[1]) for r in d.requests}
    finally:
        d.close()


def test_worker_row_is_read_over_rest(server, mode):
    d = Driver(server.grpc_address, server.api_key, mode=mode, rest_url=server.url)
    try:
        d.ok("reg", d.api.register_call(Q, "gw-row", "h", 2, {"instance_id": "abc", "pid": 7}, [Q, "other-q"]))
        row = d.ok("row", d.api.get_worker_call("gw-row"))
        assert row["id"] == "gw-row" and row["metadata"]["instance_id"] == "abc"
        assert row["metadata"]["pid"] == "7"  # gRPC metadata maps carry strings
    finally:
        d.close()
    alone = Driver(server.grpc_address, server.api_key, mode=mode)
    try:
        _, err = alone.call("row", alone.api.get_worker_call("gw-row"))
        assert isinstance(err, api.Unavailable)  # without REST nobody can read it; the parent ignores that
    finally:
        alone.close()


def test_a_failing_rest_fallback_answers_as_grpc_did(server, mode):
    d = Driver(server.grpc_address, server.api_key, mode=mode, rest_url=f"http://127.0.0.1:{free_port()}")
    try:
        server.enqueue(Q, {"x": 1})
        (job,) = d.ok("claim", d.api.claim_call(Q, "gw", 1, 30))
        _, err = d.call("c", d.api.complete_call(job["id"], "gw", job["lease_id"], ["not", "an", "object"]))
        assert isinstance(err, api.Rejected) and "only JSON objects" in err.message and "REST fallback" in err.message
        assert server.job(job["id"])["status"] == "processing"  # the parent now fails it with that error
    finally:
        d.close()


def test_rest_fallback_settles_while_grpc_is_down(server, mode):
    d = Driver(f"127.0.0.1:{free_port()}", server.api_key, timeout=2.0, mode=mode, rest_url=server.url)
    try:
        ids = [server.enqueue(Q, {"x": i}, max_retries=2) for i in range(2)]
        jobs = server.request("POST", "/api/v1/jobs/claim", json={"queue_name": Q, "worker_id": "gw", "limit": 2})
        one, two = jobs.json()["jobs"]
        _, err = d.call("claim", d.api.claim_call(Q, "gw", 1, 30))
        assert isinstance(err, api.Unavailable)  # claims have no fallback
        assert d.call("c", d.api.complete_call(one["id"], "gw", one["lease_id"], {"r": 1}))[1] is None
        assert d.call("f", d.api.fail_call(two["id"], "gw", two["lease_id"], "went wrong"))[1] is None
        assert server.job(one["id"])["status"] == "completed" and server.job(one["id"])["result"] == {"r": 1}
        rest = server.job(two["id"])
        assert rest["status"] == "pending" and rest["retry_count"] == 1 and rest["last_error"] == "went wrong"
        assert sorted(ids) == sorted([one["id"], two["id"]])
    finally:
        d.close()


def test_non_object_payload_arrives_as_none(server, drv):
    jid = server.enqueue(Q, ["a", "list"])
    (job,) = drv.ok("claim", drv.api.claim_call(Q, "gw", 1, 30))
    assert job["id"] == jid and job["payload"] is None


def test_wrong_key_is_unauthorized(server, mode):
    d = Driver(server.grpc_address, "sp_test_not-the-key", mode=mode)
    try:
        _, err = d.call("reg", d.api.register_call(Q, "gw", "h", 1, {}))
        assert isinstance(err, api.Unauthorized)
        _, err = d.call("claim", d.api.claim_call(Q, "gw", 2, 30))
        assert isinstance(err, api.Unauthorized)
        assert "not-the-key" not in str(err) and "not-the-key" not in repr(d.api)
    finally:
        d.close()


def test_settlement_answers_wait_for_the_loops_turn_while_claims_wake_it(server):
    """Over the wire client a claim's answer wakes the loop (the connection is watched for reading); with only
    settlements out it is not: their answers are read on the loop's next turn (expire), LAZY_READ after at
    the latest, so a child's report and the answer to the one before it cost one turn, not two."""
    from supervisor.client.grpc_transport import LAZY_READ

    d = Driver(server.grpc_address, server.api_key)
    try:
        a, sel = d.api, d.sel
        ids = [server.enqueue(Q, {"n": i}) for i in range(2)]

        def watched_for_reading() -> bool:
            try:
                return bool(sel.get_key(d.client.wire.sock).events & selectors.EVENT_READ)
            except KeyError:
                return False

        assert d.ok("warm", a.claim_call("nothing-here", "gw", 1, 30)) == []  # the connection is up
        d.client.submit("claim", a.claim_call(Q, "gw", 2, 30))
        assert watched_for_reading()
        d.run_until(lambda: "claim" in d.answers, what="the claim's answer")
        jobs, err = d.answers.pop("claim")
        assert err is None and sorted(j["id"] for j in jobs) == sorted(ids)
        first, second = jobs
        sent = time.monotonic()
        d.client.submit("c1", a.complete_call(first["id"], "gw", first["lease_id"], {"ok": True}))
        assert not watched_for_reading()
        assert d.client.next_deadline() <= sent + LAZY_READ + 0.01
        wait_until(lambda: server.job(first["id"])["status"] == "completed", 5, what="the server applied the complete")
        assert not [k for k, _ in sel.select(0) if k.data[0] == "http"]  # the answer wakes nobody...
        assert d.client.done() == []
        d.client.expire(time.monotonic())  # ... and is taken on the loop's next turn
        assert d.client.done() == [("c1", None, None)]
        assert watched_for_reading()  # nothing out: an idle connection's GOAWAY or hang-up is seen at once
        d.client.submit("c2", a.complete_call(second["id"], "gw", second["lease_id"], {"ok": True}))
        d.client.submit("claim2", a.claim_call(Q, "gw", 1, 30))  # a claim out: answers wake the loop again
        assert watched_for_reading()
        d.run_until(lambda: {"c2", "claim2"} <= set(d.answers), 5, "both answers")
        assert d.answers["c2"] == (None, None) and d.answers["claim2"] == ([], None)
        assert server.job(second["id"])["status"] == "completed"
        # with nothing else to wake it, the loop still reads a lone settlement's answer within LAZY_READ
        third = server.enqueue(Q, {"n": 3})
        job = d.ok("claim3", a.claim_call(Q, "gw", 1, 30))[0]
        assert job["id"] == third
        began = time.monotonic()
        assert d.ok("c3", a.complete_call(third, "gw", job["lease_id"], None)) is None
        assert time.monotonic() - began < LAZY_READ + 1.0
    finally:
        d.close()


def test_stream_cut_mid_run_loses_no_settlement(server, drv, mode):
    a = drv.api
    ids = [server.enqueue(Q, {"i": i}) for i in range(6)]
    jobs = drv.ok("claim", a.claim_call(Q, "gw", 6, 60))
    assert len(jobs) == 6
    server.faults(cut=1.0)  # every call is handled, then its answer is cut (the stream with it)
    complete0 = a.complete_call(jobs[0]["id"], "gw", jobs[0]["lease_id"], {"k": 0})
    if mode == "stream":  # the transport re-sends it on a new stream
        drv.client.submit("c0", complete0)
        drv.run_until(lambda: drv.client.failures >= 1, what="the stream to break")
        server.faults(cut=0.0)
        drv.run_until(lambda: "c0" in drv.answers, what="the re-sent complete")
        assert drv.answers.pop("c0") == (None, None)  # answered NOT_FOUND: counted as done
    else:  # the parent retries a call that came back Unavailable
        _, err = drv.call("c0", complete0)
        assert isinstance(err, api.Unavailable)
        server.faults(cut=0.0)
        assert drv.call("c0-again", a.complete_call(jobs[0]["id"], "gw", jobs[0]["lease_id"], {"k": 0})) == (None, None)
    assert server.job(jobs[0]["id"])["result"] == {"k": 0.0}
    # chaos: cuts and 503s on a third of the messages; the parent's retry (a fresh call) stands in for on_report
    server.faults(cut=0.2, fail_503=0.2)
    for job in jobs[1:]:
        for attempt in range(20):
            result, err = drv.call(("c", job["id"], attempt), a.complete_call(job["id"], "gw", job["lease_id"], None))
            if not isinstance(err, api.Unavailable):
                break
        assert err is None, err
    server.faults(cut=0.0, fail_503=0.0)
    assert [server.job(i)["status"] for i in ids] == ["completed"] * 6


def test_unreachable_server_gives_unavailable_then_recovers(tmp_path, mode):
    port = free_port()
    d = Driver(f"127.0.0.1:{port}", "sp_test_x", timeout=2.0, mode=mode)
    server = None
    try:
        _, err = d.call("reg", d.api.register_call(Q, "gw", "h", 1, {}))
        assert isinstance(err, api.Unavailable)
        _, err = d.call("claim", d.api.claim_call(Q, "gw", 1, 30))
        assert isinstance(err, api.Unavailable)
        assert d.client.failures >= 1 or mode.startswith("unary")
        server = start_server(tmp_path, "--grpc-port", str(port))  # (the later flag wins)
        d.api._key = Secret(server.api_key)
        jid = server.enqueue(Q, {"x": 1})
        attempts = iter(range(1000))

        def claimed():
            jobs, err = d.call(("claim", next(attempts)), d.api.claim_call(Q, "gw", 1, 30))
            return jobs if err is None and jobs else None
        jobs = wait_until(claimed, timeout=20, interval=0.2, what="the transport to reach the server again")
        assert [j["id"] for j in jobs] == [jid]
    finally:
        d.close()
        if server is not None:
            server.stop()


def test_no_channel_or_thread_before_the_first_call_and_none_for_unary_calls(server):
    before = threading.active_count()
    d = Driver(server.grpc_address, server.api_key)
    try:
        assert d.api._channel is None and threading.active_count() == before
        d.ok("reg", d.api.register_call(Q, "gw", "h", 1, {}))
        server.enqueue(Q, {"x": 1})
        job, = d.ok("claim", d.api.claim_call(Q, "gw", 1, 30))
        assert d.ok("done", d.api.complete_call(job["id"], "gw", job["lease_id"], {"r": 1})) is None
        # the loop's own HTTP/2 connection: no grpcio channel, no thread
        assert d.api._channel is None and threading.active_count() == before
    finally:
        d.close()
    d = Driver(server.grpc_address, server.api_key, client="grpcio")
    try:
        d.ok("reg", d.api.register_call(Q, "gw", "h", 1, {}))
        assert d.api._channel is not None  # grpcio's channel, made on the first call
    finally:
        d.close()


def test_children_and_the_transport_module_do_not_import_grpc():
    code = ("import sys; import supervisor.child.main, supervisor.client.grpc_transport, supervisor.commands.run; "
            "bad = [m for m in sys.modules if m == 'grpc' or m.startswith('grpc.')]; assert not bad, bad")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_without_the_extra_the_error_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "grpc", None)
    with pytest.raises(GrpcMissing, match=r"pip install 'spooled-supervisor\[grpc\]'"):
        require_grpc()


def test_grpc_url_parsing():
    assert parse_grpc_url("127.0.0.1:50051") == ("127.0.0.1:50051", "127.0.0.1", False)
    assert parse_grpc_url("localhost") == ("localhost:50051", "localhost", False)
    assert parse_grpc_url("[::1]:7000") == ("[::1]:7000", "::1", False)
    assert parse_grpc_url("grpc.spooled.cloud:443") == ("grpc.spooled.cloud:443", "grpc.spooled.cloud", True)
    assert parse_grpc_url("grpcs://grpc.example.com") == ("grpc.example.com:443", "grpc.example.com", True)
    for bad in ("", ":80", "host:port"):
        with pytest.raises(ValueError):
            parse_grpc_url(bad)


def test_struct_doubles_become_ints_below_2_53():
    from google.protobuf import struct_pb2

    from supervisor.proto.structs import plain, plain_struct

    s = struct_pb2.Struct()
    s.update({"a": 5.0, "b": [1.0, 2.5, {"c": -3.0}], "d": True, "e": None, "s": "5"})
    assert plain_struct(s, ints=True) == {"a": 5, "b": [1, 2.5, {"c": -3}], "d": True, "e": None, "s": "5"}
    assert type(plain(struct_pb2.Value(number_value=2.0 ** 53), ints=True)) is float
    assert type(plain(struct_pb2.Value(number_value=2.0 ** 53 - 1), ints=True)) is int


def test_a_jobs_times_read_the_same_with_the_seconds_remembered():
    from supervisor.client import grpc_transport as gt
    from supervisor.proto import spooled_pb2 as pb

    gt._SECONDS.clear()
    job = pb.Job(id="j", queue_name="q")
    job.created_at.seconds, job.created_at.nanos = 1764762000, 123456789  # 2025-12-03T11:40:00Z
    job.lease_expires_at.seconds, job.lease_expires_at.nanos = 1764762000, 5000
    first = gt.job_dict(job)
    assert (first["created_at"], first["lease_expires_at"]) == ("2025-12-03T11:40:00.123456Z",
                                                                "2025-12-03T11:40:00.000005Z")
    assert gt._SECONDS == {1764762000: "2025-12-03T11:40:00."}
    for second in range(1764762001, 1764762001 + 300):  # past the 256 remembered: forgotten, still right
        job.created_at.seconds = second
        assert gt.job_dict(job)["created_at"] == time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second)) + ".123456Z"
    assert len(gt._SECONDS) <= 256
    assert gt.job_dict(pb.Job(id="k"))["created_at"] is None  # an unset time is no time


class HostileServer:
    """A TCP listener on loopback that reads whatever comes and answers each connection as `behaviour` says:
    `garbage` (bytes that are no HTTP/2), `silent` (never a byte), `close` (hangs up)."""

    def __init__(self, behaviour: str):
        import socket

        self.behaviour = behaviour
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.accepted = 0
        self.conns: list = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.accepted += 1
            self.conns.append(conn)
            try:
                conn.recv(65536)
                if self.behaviour == "garbage":
                    conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n" + b"\xff" * 64)
                elif self.behaviour == "close":
                    conn.close()
            except OSError:
                pass

    def close(self) -> None:
        self.listener.close()
        for c in self.conns:
            c.close()


@pytest.mark.parametrize("behaviour", ["garbage", "silent", "close"])
def test_the_wire_client_against_a_hostile_server(behaviour):
    peer = HostileServer(behaviour)
    d = Driver(peer.address, "sp_test_never-shown", timeout=1.0)
    try:
        for attempt in range(2):  # each call fails on its own, and the next one connects afresh
            started = time.monotonic()
            result, err = d.call(("claim", attempt), d.api.claim_call(Q, "gw", 1, 30), timeout=10)
            assert result is None and isinstance(err, api.Unavailable), err
            assert time.monotonic() - started < 5  # within the call's 1 s deadline and a turn, never a stall
            assert "sp_test_never-shown" not in str(err)
            wait_until(lambda a=attempt: peer.accepted == a + 1, timeout=5, what="a fresh connection per attempt")
        if behaviour == "silent":
            assert "within 1 s" in str(err)
        else:
            assert "no answer" not in str(err)
        job_err = d.call("done", d.api.complete_call("j1", "gw", "l1", {"r": 1}), timeout=10)[1]
        assert isinstance(job_err, api.Unavailable)
    finally:
        d.close()
        peer.close()


def test_the_wire_client_over_tls_verifies_the_server_and_speaks_h2(tmp_path):
    """A grpcio server with a self-signed certificate: accepted with it as the CA bundle (ALPN h2), refused
    without (the system roots do not know it)."""
    import selectors as sels
    import ssl
    from concurrent.futures import ThreadPoolExecutor

    import grpc
    from support.tls_proxy import self_signed_cert

    from supervisor.client.h2grpc import H2Client
    from supervisor.proto import spooled_pb2 as pb
    from supervisor.proto import spooled_pb2_grpc as pb_grpc

    cert, key = self_signed_cert(tmp_path)
    seen = []

    class Queue(pb_grpc.QueueServiceServicer):
        def Dequeue(self, request, context):
            seen.append((request.queue_name, dict(context.invocation_metadata()).get("x-api-key")))
            return pb.DequeueResponse()

    server = grpc.server(ThreadPoolExecutor(2))
    pb_grpc.add_QueueServiceServicer_to_server(Queue(), server)
    creds = grpc.ssl_server_credentials([(open(key, "rb").read(), open(cert, "rb").read())])
    port = server.add_secure_port("127.0.0.1:0", creds)
    server.start()
    sel = sels.DefaultSelector()
    try:
        def one_call(ctx):
            import socket

            addrs = socket.getaddrinfo("127.0.0.1", port, type=socket.SOCK_STREAM)
            client = H2Client(sel, lambda: addrs, f"127.0.0.1:{port}", "127.0.0.1", ctx,
                              lambda: (("x-api-key", "sp_test_tls"),), "test/1")
            body = pb.DequeueRequest(queue_name="tls-q", worker_id="w").SerializeToString()
            assert client.call("/spooled.v1.QueueService/Dequeue", body, "ctx") is not None
            deadline = time.monotonic() + 10
            while not client.answers and time.monotonic() < deadline:
                for k, mask in sel.select(0.2):
                    k.data[1].on_ready(mask, time.monotonic())
            answers = list(client.answers)
            client.close()
            return answers

        trusted = ssl.create_default_context(cafile=cert)
        trusted.set_alpn_protocols(["h2"])
        (ctx, answer), = one_call(trusted)
        assert (ctx, answer.status, answer.message) == ("ctx", 0, b"") and seen == [("tls-q", "sp_test_tls")]
        default = ssl.create_default_context()
        default.set_alpn_protocols(["h2"])
        (_, answer), = one_call(default)
        assert answer.status == 14 and "CERTIFICATE_VERIFY_FAILED" in answer.details and len(seen) == 1
    finally:
        sel.close()
        server.stop(0)
