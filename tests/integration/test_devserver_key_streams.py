"""A key's open streams end with it: a revoked key's WebSockets close at once, and an expired key's event
stream and WebSocket end once its time comes (within a second), against the real dev server."""

from __future__ import annotations

import datetime
import json

import pytest
import requests
from conftest import wait_until
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

pytestmark = pytest.mark.timeout(60)


def _key(server, **fields) -> tuple[str, str]:
    r = server.request("POST", "/api/v1/api-keys", json={"name": "short-lived", **fields})
    assert r.status_code == 201, r.text
    return r.json()["id"], r.json()["key"]


def _ws(server, key: str):
    return connect(f"ws://127.0.0.1:{server.port}/api/v1/ws?token={key}", open_timeout=10)


def _closed(ws, timeout: float = 10.0):
    """The close frame the server ended the socket with (events before it are skipped)."""
    with pytest.raises(ConnectionClosed) as info:
        while True:
            ws.recv(timeout=timeout)
    return info.value.rcvd


def _streams(server) -> int:
    return server.request("GET", "/_dev/events").json()["streams"]


def test_a_revoked_keys_websocket_closes_at_once(dev_server):
    kid, key = _key(dev_server)
    with _ws(dev_server, key) as ws:
        assert json.loads(ws.recv(timeout=10))["type"] == "Ping"
        assert dev_server.request("DELETE", f"/api/v1/api-keys/{kid}").status_code == 204
        rcvd = _closed(ws)
        assert rcvd is not None and rcvd.code == 1001
    wait_until(lambda: _streams(dev_server) == 0, timeout=5, what="the socket to be forgotten")


def test_an_expired_keys_event_stream_and_websocket_end(dev_server):
    soon = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=3)
    _, key = _key(dev_server, expires_at=soon.isoformat().replace("+00:00", "Z"))
    sse = requests.get(dev_server.url + "/api/v1/events", headers={"Authorization": f"Bearer {key}"}, stream=True,
                       timeout=15)
    assert sse.status_code == 200
    with _ws(dev_server, key) as ws:
        assert json.loads(ws.recv(timeout=10))["type"] == "Ping"
        rcvd = _closed(ws, timeout=15)
        assert rcvd is not None and (rcvd.code, rcvd.reason) == (1008, "API key has expired")
    assert datetime.datetime.now(datetime.UTC) >= soon
    lines = list(sse.iter_lines(decode_unicode=True))  # returns once the server ends the stream
    assert lines[0] == ":connected"
    wait_until(lambda: _streams(dev_server) == 0, timeout=5, what="both streams to end")
    r = dev_server.request("GET", "/api/v1/events", key=key)
    assert r.status_code == 401 and r.json()["message"] == "API key has expired"
