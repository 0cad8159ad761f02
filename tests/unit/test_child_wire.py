"""The parent-child frame protocol: frames of several MiB cross a socketpair both ways without deadlock, each
frame's JSON object is what it always was, and what a hostile child sends is read safely or ignored."""

from __future__ import annotations

import socket
import threading
import time

import orjson
import pytest

from supervisor import exactjson
from supervisor.child import wire
from supervisor.job import Job


@pytest.mark.timeout(20)
def test_frames_of_several_mib_cross_a_socketpair_without_deadlock():
    parent, child = socket.socketpair()
    chan = wire.Channel(parent)
    big = wire.JobFrame(Job.parse({"id": "j", "lease_id": "L", "payload": "x" * (6 * 2**20)}))
    received = []
    reader = threading.Thread(target=lambda: received.append(wire.read_frame(child, wire.decode_down)))
    reader.start()
    chan.send(big)
    while chan.wants_write:  # non-blocking: the parent writes in pieces as the reader drains
        chan.flush()
    reader.join(10)
    assert received == [big]
    wire.write_frame(child, wire.Done("j", True, 1))
    wire.write_frame(child, wire.Ready(1))
    messages = []
    while len(messages) < 2:
        messages += chan.receive()
    assert messages == [wire.Done("j", True, 1), wire.Ready(1)]
    child.close()
    with pytest.raises(EOFError):
        while True:
            chan.receive()


def test_each_frame_is_the_json_object_it_always_was():
    job = Job.parse({"id": "j", "lease_id": "L", "payload": {"n": 2**70}})
    assert wire.JobFrame(job).wire() == {"t": "job", "job": job.raw}
    assert wire.JobFrame(job, True, 12.5).wire() == {"t": "job", "job": job.raw, "held": True, "start_by": 12.5}
    assert wire.Drop("j").wire() == {"t": "drop", "id": "j"} and wire.Stop().wire() == {"t": "stop"}
    assert wire.Done("j", True, {"x": 1}).wire() == {"t": "done", "id": "j", "ok": True, "result": {"x": 1}}
    assert wire.Done("j", False, error="boom", next="k", started=3.0).wire() == {
        "t": "done", "id": "j", "ok": False, "error": "boom", "next": "k", "started": 3.0}
    assert wire.Started("j", 1.5).wire() == {"t": "started", "id": "j", "at": 1.5}
    assert wire.Dropped("j").wire() == {"t": "dropped", "id": "j"}
    assert wire.Ready(7, 8, None).wire() == {"t": "ready", "pid": 7, "keeper": 8, "about": None}
    assert wire.BootError("tb").wire() == {"t": "boot_error", "error": "tb"}
    for frame in (wire.Done("j", True, 1), wire.Started("j", 1.5), wire.Dropped("j"), wire.Ready(7, 8, {"a": 1}),
                  wire.BootError("tb")):
        assert wire.decode_up(frame.wire()) == frame
    for frame in (wire.JobFrame(job), wire.JobFrame(job, True, 12.5), wire.Drop("j"), wire.Stop()):
        assert wire.decode_down(frame.wire()) == frame


@pytest.mark.parametrize(("sent", "read"), [
    ({"t": "done", "id": "j"}, wire.Done("j", False, None, "Job failed")),  # no `ok`: a failure, never a result
    ({"t": "done", "ok": True, "result": 1, "next": 5, "started": "soon"}, wire.Done("", True, 1)),
    ({"t": "started", "id": 3, "at": 1.0}, None), ({"t": "dropped"}, None),
    ({"t": "started", "id": "j", "at": True}, wire.Started("j", None)),
    ({"t": "ready", "pid": 1, "keeper": "k", "about": [1]}, wire.Ready(1, None, None)),
    ({"t": "boot_error"}, wire.BootError("")), ({"t": "<script>"}, None), ([1, 2], None), ("done", None),
])
def test_what_a_hostile_child_sends_is_read_safely_or_ignored(sent, read):
    assert wire.decode_up(sent) == read


def test_a_job_frame_without_a_job_the_child_can_run_is_ignored():
    assert wire.decode_down({"t": "job", "job": {"id": "j"}}) is None  # no lease id
    assert wire.decode_down({"t": "job"}) is None and wire.decode_down({"t": "drop", "id": 1}) is None
    assert wire.decode_down({"t": "who"}) is None


def test_the_cheap_makers_make_the_same_records_and_settled_frames_cross():
    """`encode_job` and `done_ok` (the frames made for every job) give what the records made by name do;
    `settled` and `ready`'s `wants_settled` cross both ways."""
    job = Job.parse({"id": "j", "lease_id": "L", "payload": {"n": 2**70}})
    small = Job.parse({"id": "j", "lease_id": "L", "payload": {"n": 2**60}})
    assert wire.encode_job(job) == wire.encode(wire.JobFrame(job))
    assert wire.encode_job(small) == wire.encode(wire.JobFrame(small))
    assert wire.done_ok("j", 1) == wire.Done("j", True, 1) and type(wire.done_ok("j", 1)) is wire.Done
    settled = wire.Settled("j", "failed", "boom", "fail")
    assert settled.wire() == {"t": "settled", "id": "j", "as": "failed", "error": "boom", "operation": "fail"}
    assert wire.decode_down(settled.wire()) == settled and wire.decode_down({"t": "settled", "id": 1}) is None
    assert wire.Ready(7, wants_settled=True).wire()["wants_settled"] is True
    assert wire.decode_up(wire.Ready(7, 8, None, True).wire()) == wire.Ready(7, 8, None, True)
    assert wire.decode_up({"t": "ready", "pid": 7, "wants_settled": "yes"}) == wire.Ready(7)  # only a JSON true
    done = wire.Done("j", True, 1, None, "k", 3.0)
    assert wire.decode_up(done.wire()) == done


def test_a_job_record_keeps_only_what_has_its_type():
    """A field of the wrong type is left unset (a bool is no number), the id and lease id are required, and
    the raw job is kept as it came."""
    raw = {"id": "j", "lease_id": 7, "queue_name": 3, "timeout_seconds": True, "retry_count": "1",
           "max_retries": 2, "lease_expires_at": None, "payload": {"n": 2**70}}
    job = Job.parse(raw)
    assert job is not None and job[:7] == ("j", "7", "", None, None, 2, None)
    assert job.raw is raw and job.payload == {"n": 2**70}
    assert Job.parse({**raw, "timeout_seconds": 2.5}).timeout_seconds == 2.5
    assert Job.parse({"id": 1, "lease_id": "L"}) is None and Job.parse({"id": "j"}) is None
    assert Job.parse(["j"]) is None


def test_a_budget_bounds_what_one_receive_reads_and_the_rest_comes_next_time():
    """A child that sends a flood of frames holds the parent's loop for one budget a turn, and loses nothing."""
    Channel, encode = wire.Channel, wire.encode
    a, b = socket.socketpair()
    a.setblocking(False)
    b.setblocking(False)
    frame = encode(wire.Dropped("y" * 1000))
    sent = 0
    try:
        while True:
            sent += b.send(frame)
    except BlockingIOError:
        pass
    whole = sent // len(frame)
    chan = Channel(a)
    first = chan.receive(budget=64 * 1024)
    assert 0 < len(first) <= 64 * 1024 // len(frame) + 1
    rest = []
    while len(first) + len(rest) < whole:
        got = chan.receive(budget=64 * 1024)
        assert got or len(first) + len(rest) == whole
        rest += got
    assert len(first) + len(rest) == whole and all(m == wire.Dropped("y" * 1000) for m in first + rest)
    a.close()
    b.close()


def test_the_header_says_which_frames_may_hold_wide_integers():
    """The header's top bit is set exactly when the JSON may hold an integer past 64 bits: a job whose payload
    has one, a result the child encoded with one; such frames are read exactly and the others by orjson alone,
    with the same values."""
    def flagged(data: bytes) -> bool:
        return bool(wire.HEADER.unpack_from(data)[0] & wire.WIDE)

    wide = Job.parse({"id": "j", "lease_id": "L", "payload": {"n": 2**70}})
    narrow = Job.parse({"id": "j", "lease_id": "L"})
    assert flagged(wire.encode_job(wide)) and not flagged(wire.encode_job(narrow))
    text, wide_text = exactjson.dumps_strict_wide({"n": -(2**70)})
    assert wide_text and exactjson.dumps_strict_wide({"n": 2**63}) == (b'{"n":9223372036854775808}', False)
    fragment = wire.done_ok("j", wire.WideJSON(text))
    assert flagged(wire.encode(fragment)) and not flagged(wire.encode(wire.done_ok("j", orjson.Fragment(b"[1,2]"))))
    assert not flagged(wire.encode(wire.done_ok("j", {"n": 2**63})))  # orjson writes and reads it exactly
    buf = bytearray(wire.encode_job(wide) + wire.encode(fragment) + wire.encode(wire.Done("j", True, 2**64 - 1)))
    sent, done, last = wire.unpack(buf)
    assert sent["job"]["payload"]["n"] == 2**70 and done["result"] == {"n": -(2**70)} and last["result"] == 2**64 - 1
    assert buf == bytearray()


def test_what_is_no_frame_ends_the_stream_with_bad_frame():
    """A body that is not JSON, or a length over the limit, raises BadFrame (an EOFError); the parent's
    channel then reads nothing more, and the whole frames before it came out on an earlier call."""
    parent, child = socket.socketpair()
    with parent, child:
        chan = wire.Channel(parent)
        child.sendall(wire.encode(wire.Done("a", True, 1)))
        wait = time.monotonic() + 5
        got: list = []
        while not got and time.monotonic() < wait:
            got = chan.receive()
        assert got == [wire.Done("a", True, 1)]
        child.sendall(wire.HEADER.pack(3) + b"{x}")
        with pytest.raises(wire.BadFrame, match="not JSON"):
            while time.monotonic() < wait:
                chan.receive()
        with pytest.raises(EOFError):
            chan.receive()
    with pytest.raises(wire.BadFrame, match="over the"):
        wire.unpack(bytearray(wire.HEADER.pack(wire.MAX_FRAME + 1) + b"{}"))


def test_a_done_frame_without_a_string_id_names_no_job_and_its_error_is_made_a_string():
    """A child is not trusted: a `done` whose id is no string names no job (the child is free, nothing
    settles), and an error that is not a string is turned into one, so the job's failure report can be built."""
    assert wire.decode_up({"t": "done", "id": ["j"], "ok": True, "result": 1}) == wire.Done("", True, 1)
    assert wire.decode_up({"t": "done", "id": {}, "ok": False, "next": "k"}).id == ""
    assert wire.decode_up({"t": "done", "id": "j", "ok": False, "error": {"x": 1}}).error == "{'x': 1}"
    assert wire.decode_up({"t": "done", "id": "j", "ok": False, "error": 7, "next": "k"}).error == "7"
    assert wire.decode_up({"t": "done", "id": "j", "ok": False}).error == "Job failed"
