"""`/api/v1/ws` end to end: the realtime events over RFC 6455 as the real server sends them, read by a real
WebSocket client (the `websockets` library the SDK's realtime client uses), and hostile clients: a bad
handshake, a wrong key, frames that break the protocol or the size limit, a client that never reads."""

from __future__ import annotations

import json
import time

import pytest
import requests
from conftest import wait_until
from support.ws_client import FrameStream, client_frame, handshake
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

pytestmark = pytest.mark.timeout(90)


def _ws(server, query: str = ""):
    return connect(f"ws://127.0.0.1:{server.port}/api/v1/ws?token={server.api_key}{query}", open_timeout=10,
                   max_size=2**24)


def _recv(ws, timeout: float = 10.0) -> dict:
    return json.loads(ws.recv(timeout=timeout))


def _recv_until(ws, variant: str, timeout: float = 10.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        msg = _recv(ws, max(0.01, deadline - time.monotonic()))
        if msg["type"] == variant:
            return msg


def _streams(server) -> int:
    return server.request("GET", "/_dev/events").json()["streams"]


def test_a_jobs_events_and_the_clients_commands(dev_server):
    with _ws(dev_server) as ws:
        hello = _recv(ws)
        assert hello["type"] == "Ping" and hello["data"]["timestamp"].endswith("Z")
        jid = dev_server.enqueue("ws-a", {"n": 1}, priority=2)
        created = _recv_until(ws, "JobCreated")
        assert created == {"type": "JobCreated", "data": {"job_id": jid, "queue_name": "ws-a", "priority": 2,
                                                          "timestamp": created["data"]["timestamp"]}}
        job = dev_server.request("POST", "/api/v1/jobs/claim", json={"queue_name": "ws-a", "worker_id": "w"}).json()
        lease = job["jobs"][0]["lease_id"]
        status = _recv_until(ws, "JobStatusChange")["data"]
        assert (status["job_id"], status["old_status"], status["new_status"]) == (jid, "pending", "processing")
        dev_server.request("POST", f"/api/v1/jobs/{jid}/complete", json={"worker_id": "w", "lease_id": lease,
                                                                         "result": "<b>done</b>"})
        done = _recv_until(ws, "JobCompleted")["data"]
        assert done["job_id"] == jid and done["result"] == "<b>done</b>"

        ws.send(json.dumps({"cmd": "Ping"}))
        assert _recv(ws)["type"] == "Ping"
        assert ws.ping().wait(5)  # a protocol ping is answered with a pong

        # Subscribe narrows to one queue (lower-case command, as the SDK sends it); Unsubscribe widens again.
        ws.send(json.dumps({"cmd": "subscribe", "queue": "ws-b"}))
        ws.send(json.dumps({"cmd": "Ping"}))
        _recv_until(ws, "Ping")  # the command was read before the next job is made
        dev_server.enqueue("ws-a", {"skip": True})
        other = dev_server.enqueue("ws-b", {})
        assert _recv_until(ws, "JobCreated")["data"]["job_id"] == other
        ws.send(json.dumps({"cmd": "Unsubscribe"}))
        ws.send(json.dumps({"cmd": "Ping"}))
        _recv_until(ws, "Ping")
        again = dev_server.enqueue("ws-a", {})
        assert _recv_until(ws, "JobCreated")["data"]["job_id"] == again
        ws.send("not json <script>")  # ignored, as the real server ignores what it cannot parse
        ws.send(json.dumps({"cmd": "Ping"}))
        assert _recv_until(ws, "Ping")
    wait_until(lambda: _streams(dev_server) == 0, what="the socket to be forgotten")


def test_the_event_and_queue_filters_of_the_query(dev_server):
    with _ws(dev_server, "&queue=wq&events=job.completed") as ws:
        _recv(ws)
        dev_server.enqueue("wq", {})
        dev_server.enqueue("other", {})
        job = dev_server.request("POST", "/api/v1/jobs/claim", json={"queue_name": "wq", "worker_id": "w"}).json()
        j = job["jobs"][0]
        dev_server.request("POST", f"/api/v1/jobs/{j['id']}/complete",
                           json={"worker_id": "w", "lease_id": j["lease_id"]})
        msg = _recv(ws)
        assert msg["type"] == "JobCompleted" and msg["data"]["job_id"] == j["id"] and "result" not in msg["data"]


def test_a_wrong_key_and_bad_handshakes_are_answered_not_upgraded(dev_server):
    with pytest.raises(InvalidStatus) as e:
        connect(f"ws://127.0.0.1:{dev_server.port}/api/v1/ws?token=sp_test_wrong", open_timeout=10)
    assert e.value.response.status_code == 401
    sock, status, _, rest = handshake(dev_server.port, "/api/v1/ws")
    assert status == 401 and b"Missing or invalid Authorization header" in rest
    sock.close()
    path = f"/api/v1/ws?api_key={dev_server.api_key}"
    for headers, want in [({"Sec-WebSocket-Version": "8"}, "Sec-WebSocket-Version"),
                          ({"Sec-WebSocket-Key": None}, "Sec-WebSocket-Key"),
                          ({"Sec-WebSocket-Key": "short"}, "Sec-WebSocket-Key"),
                          ({"Upgrade": None}, "Upgrade"), ({"Connection": "keep-alive"}, "Connection")]:
        sock, status, got, rest = handshake(dev_server.port, path, headers)
        assert status == 400, (headers, status)
        body = rest.decode()
        assert '"code":"BAD_REQUEST"' in body and want in body, body
        if "Sec-WebSocket-Version" in headers:
            assert got["sec-websocket-version"] == "13"
        sock.close()
    sock, status, _, rest = handshake(dev_server.port, path + "&queue=bad%20name")
    assert status == 400 and b"VALIDATION_ERROR" in rest
    sock.close()
    # The header works as well as the query string, and the server is unharmed.
    with connect(f"ws://127.0.0.1:{dev_server.port}/api/v1/ws", open_timeout=10,
                 additional_headers={"Authorization": f"Bearer {dev_server.api_key}"}) as ws:
        assert _recv(ws)["type"] == "Ping"


@pytest.mark.parametrize("frame,code", [
    (client_frame(0x1, b"", length=1 << 20), 1009),  # declares 1 MiB: refused before any of it is read
    (client_frame(0x1, b'{"cmd":"Ping"}', mask=False), 1002),
    (client_frame(0x1, b"x", rsv=0x40), 1002),
    (client_frame(0x3, b"x"), 1002),
    (client_frame(0x9, b"x", fin=False), 1002),
    (client_frame(0x0, b"x"), 1002),
    (client_frame(0x1, b"\xff\xfe"), 1007),
    (client_frame(0x1, b"a" * 40000, fin=False) + client_frame(0x0, b"a" * 40000), 1009),
    (client_frame(0x8, b"\x03\xe8bye"), 1000),
    (client_frame(0x8, b"\x00\x05"), 1002),
], ids=["too-big", "unmasked", "reserved-bits", "unknown-opcode", "fragmented-ping", "stray-continuation",
        "not-utf8", "fragments-too-big", "close-echoed", "bad-close-code"])
def test_a_frame_that_breaks_the_protocol_closes_with_its_code(dev_server, frame, code):
    sock, status, _, rest = handshake(dev_server.port, f"/api/v1/ws?token={dev_server.api_key}")
    assert status == 101
    frames = FrameStream(sock, rest)
    assert frames.next()[0] == 0x1  # the first Ping event
    sock.sendall(frame)
    assert frames.until_close() == code
    assert frames.next(timeout=5) is None  # then the server ends the connection
    sock.close()
    assert requests.get(dev_server.url + "/health", timeout=5).status_code == 200


def test_a_client_that_never_reads_is_dropped_and_costs_the_api_nothing(dev_server):
    before = _streams(dev_server)
    sock, status, _, _ = handshake(dev_server.port, f"/api/v1/ws?token={dev_server.api_key}", rcvbuf=4096)
    assert status == 101
    wait_until(lambda: _streams(dev_server) == before + 1, what="the socket to subscribe")
    r = dev_server.request("POST", "/api/v1/jobs/bulk", json={"queue_name": "flood",
                                                             "jobs": [{"payload": i} for i in range(100)]})
    assert r.json()["success_count"] == 100
    jobs = dev_server.request("POST", "/api/v1/jobs/claim",
                              json={"queue_name": "flood", "worker_id": "w", "limit": 100}).json()["jobs"]
    big = "x" * 60000
    started = time.monotonic()
    for j in jobs:  # 100 events of 60 KB each: far more than the socket buffers hold
        t0 = time.monotonic()
        ok = dev_server.request("POST", f"/api/v1/jobs/{j['id']}/complete",
                                json={"worker_id": "w", "lease_id": j["lease_id"], "result": big})
        assert ok.status_code == 200 and time.monotonic() - t0 < 2.0
    t0 = time.monotonic()
    assert requests.get(dev_server.url + "/health", timeout=5).status_code == 200
    assert time.monotonic() - t0 < 1.0
    wait_until(lambda: _streams(dev_server) == before, timeout=30, what="the stalled socket to be dropped")
    assert time.monotonic() - started < 30
    sock.close()


def test_a_dropped_stream_closes_the_socket_with_going_away(dev_server):
    with _ws(dev_server) as ws:
        _recv(ws)
        assert dev_server.request("POST", "/_dev/events/drop").json()["dropped"] >= 1
        with pytest.raises(ConnectionClosed) as e:
            while True:
                ws.recv(timeout=10)
        assert e.value.rcvd is not None and e.value.rcvd.code == 1001
