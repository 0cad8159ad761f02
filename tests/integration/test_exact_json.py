"""Integers of any size stay exact from the claim answer to the handler and from its result to the complete
call; a result JSON has no form for fails the job naming the value."""

from __future__ import annotations

import datetime
import json
import socket
import threading

import orjson
import pytest
from conftest import Daemon, wait_for_status, wait_until
from support.fake_http import ForwardingProxy

from supervisor import exactjson
from supervisor.child import wire
from supervisor.child.main import run_job
from supervisor.client import rest as api
from supervisor.client.httpconn import Response
from supervisor.job import Job

BIG = 2**80
EDGES = [2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63), -(2**63) - 1, 2**70, -(2**70), 10**40]


def test_loads_keeps_every_integer_exact_and_floats_as_floats():
    text = json.dumps({"edges": EDGES, "f": 1.5, "e": 1e300, "id": "1234567890123456789012345"}).encode()
    value = exactjson.loads(text)
    assert value["edges"] == EDGES and all(type(n) is int for n in value["edges"])
    assert value["f"] == 1.5 and value["e"] == 1e300 and value["id"] == "1234567890123456789012345"
    assert type(orjson.loads(text)["edges"][3]) is float  # what the fallback is for: orjson alone loses it
    assert exactjson.loads(b'{"small": 18}') == {"small": 18}
    assert exactjson.loads(memoryview(b"[18446744073709551616]")) == [2**64]
    for bad in (b'{"a": NaN, "b": 12345678901234567890123}', b"[Infinity, 12345678901234567890123]", b"{x"):
        with pytest.raises(ValueError):
            exactjson.loads(bad)


def test_dumps_writes_big_integers_exactly_alongside_what_only_orjson_knows():
    value = {"edges": EDGES, "when": datetime.datetime(2026, 1, 2, 3, 4, 5), "raw": orjson.Fragment(b'{"k":1}')}
    data = exactjson.dumps(value)
    assert json.loads(data) == {"edges": EDGES, "when": "2026-01-02T03:04:05", "raw": {"k": 1}}
    assert exactjson.dumps({"a": 1}) == orjson.dumps({"a": 1})  # the fast path is orjson's own output
    with pytest.raises(TypeError):
        exactjson.dumps({"s": {1, 2}, "big": BIG})


@pytest.mark.parametrize("value, message", [
    ({"x": float("nan")}, "float('nan') at result['x'] is not valid JSON"),
    ({"a": [1, {"b": float("-inf")}], "n": None}, "float('-inf') at result['a'][1]['b'] is not valid JSON"),
    ([BIG, float("inf")], "float('inf') at result[1] is not valid JSON"),
    ({"s": {1, 2}}, "{1, 2} (set) at result['s'] is not valid JSON"),
    ({"o": [object()]}, "(object) at result['o'][0] is not valid JSON"),
    ({1: "one"}, "the key 1 (int) in result is not a string"),
])
def test_dumps_strict_names_the_value_json_has_no_form_for(value, message):
    with pytest.raises(exactjson.NotJSON) as caught:
        exactjson.dumps_strict(value, "result")
    assert message in str(caught.value)


def test_dumps_strict_accepts_none_big_integers_and_cycles_are_refused():
    assert exactjson.dumps_strict({"n": None, "big": BIG, "s": "null"}) == b'{"n":null,"big":%d,"s":"null"}' % BIG
    loop: list = []
    loop.append(loop)
    with pytest.raises(exactjson.NotJSON):
        exactjson.dumps_strict(loop, "result")


def echo_handler(ctx):
    return ctx.payload["answer"]


def test_run_job_encodes_the_result_once_exactly_or_fails_the_job_naming_the_value():
    raw = {"id": "j1", "lease_id": "l1", "payload": {"answer": {"big": BIG, "neg": -(2**70)}}}
    done = run_job(echo_handler, Job.parse(raw), "w", 1_000_000)
    assert done.ok and isinstance(done.result, wire.WideJSON)  # encoded once, in the child, and said to be wide
    assert json.loads(wire.encode(done)[4:])["result"] == {"big": BIG, "neg": -(2**70)}
    small = run_job(echo_handler, Job.parse({**raw, "payload": {"answer": [1, 2**63]}}), "w", 1_000_000)
    assert small.ok and isinstance(small.result, orjson.Fragment)
    failed = run_job(echo_handler, Job.parse({**raw, "payload": {"answer": {"x": float("nan")}}}), "w", 1_000_000)
    assert not failed.ok
    assert failed.error == ("ResultNotSerializable: the handler's result could not be encoded as JSON "
                               "(float('nan') at result['x'] is not valid JSON)")


@pytest.mark.timeout(20)
def test_frames_carry_big_integers_both_ways_and_the_result_reaches_the_complete_call_exactly():
    parent, child = socket.socketpair()
    chan = wire.Channel(parent)
    job = Job.parse({"id": "j1", "lease_id": "l1", "payload": {"n": 2**70, "edges": EDGES}})
    received = []
    reader = threading.Thread(target=lambda: received.append(wire.read_frame(child, wire.decode_down)))
    reader.start()
    chan.send(wire.JobFrame(job))
    while chan.wants_write:
        chan.flush()
    reader.join(10)
    assert received == [wire.JobFrame(job)] and type(received[0].job.payload["n"]) is int

    wire.write_frame(child, run_job(lambda ctx: {"big": BIG, "line": "a\nb"}, job, "w", 1_000_000))
    wire.write_frame(child, run_job(lambda ctx: None, job, "w", 1_000_000))
    wire.write_frame(child, wire.Done("j1", False, error="boom\nline two"))
    messages = []
    wait_until(lambda: messages.extend(chan.receive()) or len(messages) == 3, timeout=5)
    ok, none, failed = messages
    assert ok == wire.Done("j1", True, {"big": BIG, "line": "a\nb"})
    assert type(ok.result["big"]) is int and none.result is None
    assert failed == wire.Done("j1", False, error="boom\nline two")
    spooled = api.SpooledAPI("http://127.0.0.1:1", api.Secret("sp_test_0123456789"))
    body = json.loads(spooled.complete_call("j1", "w", "l1", ok.result).body)
    assert body == {"worker_id": "w", "lease_id": "l1", "result": {"big": BIG, "line": "a\nb"}}
    assert "result" not in json.loads(spooled.complete_call("j1", "w", "l1", none.result).body)
    parent.close()
    child.close()


def test_a_claim_answer_keeps_payload_integers_exact():
    spooled = api.SpooledAPI("http://127.0.0.1:1", api.Secret("sp_test_0123456789"))
    call = spooled.claim_call("q", "w", 1, 30)
    body = b'{"jobs":[{"id":"j","lease_id":"l","payload":{"n":1180591620717411303424}}]}'
    [job] = spooled.result(call, Response(200, {}, body, False))
    assert job["payload"]["n"] == 2**70 and type(job["payload"]["n"]) is int


@pytest.mark.timeout(90)
def test_the_daemon_hands_a_big_integer_to_the_handler_and_completes_a_big_result_exactly(dev_server):
    """The claim comes from a proxy (the dev server is not needed to keep integers exact for this) and the
    complete call it receives is read back byte for byte."""
    job = {"id": "exact-1", "lease_id": "lease-exact-1", "queue_name": "exact", "payload": {"n": 2**70},
           "retry_count": 0, "max_retries": 0, "timeout_seconds": 30}
    with ForwardingProxy(dev_server.url, fake_job=job) as proxy:
        daemon = Daemon(dev_server, "exact", handler="tests.support.handlers_exact:inspect", procs=1,
                        worker_id="w-exact", args=["--api-url", proxy.url]).start()
        try:
            wait_until(lambda: proxy.completed, timeout=30, what="the complete call")
        finally:
            daemon.stop()
    sent = json.loads(proxy.completed[0])
    assert sent["lease_id"] == "lease-exact-1"
    assert sent["result"] == {"type": "int", "n": 2**70, "big": BIG, "neg": -(2**70)}


@pytest.mark.timeout(90)
def test_big_integers_round_trip_through_the_real_dev_server_and_the_daemon(dev_server, daemon_factory):
    body = b'{"queue_name": "exact-dev", "payload": {"n": 1180591620717411303424}, "max_retries": 0}'
    r = dev_server.request("POST", "/api/v1/jobs", data=body)
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]
    daemon_factory("exact-dev", handler="tests.support.handlers_exact:inspect", procs=1)
    [job] = wait_for_status(dev_server, [job_id], ("completed", "deadletter"), timeout=40)
    result = json.loads(dev_server.request("GET", f"/api/v1/jobs/{job_id}").content)["result"]
    assert result == {"type": "int", "n": 2**70, "big": BIG, "neg": -(2**70)}


@pytest.mark.timeout(90)
def test_a_result_json_has_no_form_for_fails_the_job_with_the_value_named(dev_server, daemon_factory):
    ids = {kind: dev_server.enqueue("notjson", {"kind": kind}, max_retries=0) for kind in ("nan", "inf", "set")}
    daemon_factory("notjson", handler="tests.support.handlers_exact:not_json", procs=1)
    jobs = dict(zip(ids, wait_for_status(dev_server, list(ids.values()), ("deadletter",), timeout=40), strict=True))
    prefix = "ResultNotSerializable: the handler's result could not be encoded as JSON ("
    assert jobs["nan"]["last_error"] == prefix + "float('nan') at result['x'] is not valid JSON)"
    assert jobs["inf"]["last_error"] == prefix + "float('inf') at result['deep'][1]['v'] is not valid JSON)"
    assert jobs["set"]["last_error"] == prefix + "{1, 2} (set) at result['s'] is not valid JSON)"
