"""JSON numbers through the dev server: integers of any size kept exactly, NaN / Infinity refused."""

from __future__ import annotations

import json

import pytest
import requests

from supervisor import exactjson as jsonexact

pytestmark = pytest.mark.timeout(60)

BIG = 2**70  # 1180591620717411303424, stored as 1.1805916207174113e+21 before
EDGES = [2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63), -(2**63) - 1, 10**400, -(10**400)]


def post_raw(server, path: str, body: bytes) -> requests.Response:
    return requests.post(server.url + path, data=body, headers=server.headers(), timeout=10)


def test_big_integers_round_trip_exactly_through_the_rest_api(dev_server):
    s = dev_server
    payload = {"n": BIG, "neg": -BIG, "edges": EDGES, "f": 1.5, "digits": "1180591620717411303424"}
    r = s.request("POST", "/api/v1/jobs", json={"queue_name": "q", "payload": payload, "tags": {"big": 2**66}})
    assert r.status_code == 201, r.text
    jid = r.json()["id"]
    r = s.request("POST", "/api/v1/workers/register",
                  json={"queue_name": "q", "hostname": "h", "worker_id": "w1", "metadata": {"big": 2**90}})
    assert r.status_code == 201, r.text
    assert s.worker("w1")["metadata"] == {"big": 2**90}

    r = s.request("POST", "/api/v1/jobs/claim", json={"queue_name": "q", "worker_id": "w1", "limit": 1})
    job = r.json()["jobs"][0]
    assert job["id"] == jid and job["payload"] == payload
    assert "1180591620717411303424" in r.text and "e+21" not in r.text
    result = {"r": 2**80, "list": [-(2**90), 3]}
    r = s.request("POST", f"/api/v1/jobs/{jid}/complete",
                  json={"worker_id": "w1", "lease_id": job["lease_id"], "result": result})
    assert r.status_code == 200, r.text

    got = s.job(jid)
    assert got["status"] == "completed"
    assert got["payload"] == payload and got["result"] == result and got["tags"] == {"big": 2**66}
    assert type(got["result"]["r"]) is int and type(got["payload"]["f"]) is float


def test_big_integers_in_bulk_jobs_heartbeat_metadata_and_queue_settings(dev_server):
    s = dev_server
    r = s.request("POST", "/api/v1/jobs/bulk", json={"queue_name": "q", "jobs": [{"payload": {"n": 2**65}}]})
    assert r.status_code == 200, r.text
    jid = r.json()["succeeded"][0]["job_id"]
    assert s.job(jid)["payload"] == {"n": 2**65}
    s.request("POST", "/api/v1/workers/register", json={"queue_name": "q", "hostname": "h", "worker_id": "w2"})
    r = s.request("POST", "/api/v1/workers/w2/heartbeat", json={"current_jobs": 0, "metadata": {"m": -(2**99)}})
    assert r.status_code == 200, r.text
    assert s.worker("w2")["metadata"] == {"m": -(2**99)}
    r = s.request("PUT", "/api/v1/queues/q/config", json={"settings": {"big": BIG}})
    assert r.status_code == 200 and r.json()["settings"] == {"big": BIG}, r.text
    assert s.request("POST", "/api/v1/queues/q/pause", json={"reason": "x"}).status_code == 200  # re-encodes
    settings = s.request("GET", "/api/v1/queues/q/config").json()["settings"]
    assert settings["big"] == BIG and settings["paused"] is True


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e400", "-1e999", "9" * 5000])
def test_non_finite_and_absurd_numbers_are_invalid_json(dev_server, number):
    body = b'{"queue_name":"q","payload":{"x":' + number.encode() + b'}}'
    r = post_raw(dev_server, "/api/v1/jobs", body)
    assert r.status_code == 400, r.text
    assert r.json()["code"] == "INVALID_JSON" and r.json()["details"][0]["code"] == "invalid_json"
    assert dev_server.stats()["total"] == 0


# ---------- jsonexact in process ----------
def test_loads_keeps_every_integer_exact_and_floats_as_floats():
    text = json.dumps({"edges": EDGES, "f": [0.1, 1e300, -2.5e-300], "s": "12345678901234567890123"})
    value = jsonexact.loads(text.encode())
    assert value["edges"] == EDGES and all(type(v) is int for v in value["edges"])
    assert value["f"] == [0.1, 1e300, -2.5e-300] and value["s"] == "12345678901234567890123"
    assert jsonexact.loads(b'{"small": 123456789012345678}') == {"small": 123456789012345678}  # fast path


@pytest.mark.parametrize("text", [b"[NaN]", b"[Infinity]", b"[-Infinity]", b"[1e400]", b"[01234567890123456789012]",
                                  b'["\\ud800", 12345678901234567890]', b"[12345678901234567890",
                                  b"\xef\xbb\xbf[12345678901234567890]", b"[" * 2000 + b"1" + b"]" * 2000])
def test_loads_refuses_what_orjson_refuses_even_on_the_exact_path(text):
    with pytest.raises(ValueError):
        jsonexact.loads(text)


def test_dumps_encodes_big_integers_and_deep_nesting_exactly():
    assert jsonexact.dumps({"n": BIG, "m": [-(2**64)]}) == b'{"n":1180591620717411303424,"m":[-18446744073709551616]}'
    assert jsonexact.dumps({"s": "é", "f": 1.5}).decode() == '{"s":"é","f":1.5}'
    nested: list = [0]
    for _ in range(330):  # orjson.dumps stops at 254 levels; the stdlib fallback takes it
        nested = [nested]
    assert jsonexact.loads(jsonexact.dumps(nested)) == nested
    assert jsonexact.dumps([2**64]) == b"[18446744073709551616]"
