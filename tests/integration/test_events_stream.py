"""`GET /api/v1/events` end to end: the dev server's route as the real server answers it (named SSE events,
the {"type","data"} envelope, the queue and event filters, the organization's scope), read by the daemon's
own non-blocking client (supervisor.client.events), and the client's SSE framing however bytes are cut."""

from __future__ import annotations

import json
import selectors
import socket
import time

import pytest
import requests
from conftest import DevServer, wait_until

from supervisor.client.events import EventsConnection, SseParser, events_path
from supervisor.client.rest import Secret, SpooledAPI

pytestmark = pytest.mark.timeout(60)


class Reader:
    """The daemon's events client on its own selector, collecting notes."""

    def __init__(self, server: DevServer, queues: list[str], key: str | None = None, names: str = "job.created"):
        self.api = SpooledAPI(server.url, Secret(key or server.api_key))
        self.sel = selectors.DefaultSelector()
        self.conn = EventsConnection(self.api, self.sel, events_path(self.api, queues, names))
        self.notes: list[tuple] = []
        addr = socket.getaddrinfo("127.0.0.1", server.port, type=socket.SOCK_STREAM)[0]
        self.notes += self.conn.connect(addr, time.monotonic())

    def pump(self, timeout: float = 0.05) -> None:
        for key, mask in self.sel.select(timeout):
            self.notes += key.data[1].on_ready(mask, time.monotonic())

    def wait(self, predicate, what: str, timeout: float = 10.0):
        def check():
            self.pump()
            return predicate(self.notes)
        return wait_until(check, timeout=timeout, interval=0.0, what=what)

    def events(self) -> list[tuple[str, dict]]:
        return [(n[1], json.loads(n[2])) for n in self.notes if n[0] == "event"]

    def close(self) -> None:
        self.conn.close()
        self.sel.close()


@pytest.fixture
def reader(dev_server):
    made: list[Reader] = []

    def make(queues: list[str], **kw) -> Reader:
        r = Reader(dev_server, queues, **kw)
        made.append(r)
        r.wait(lambda notes: ("open",) in notes, "the stream to open")
        return r

    yield make
    for r in made:
        r.close()


def test_job_created_events_carry_the_real_servers_envelope_and_fields(dev_server, reader):
    r = reader(["ev-a"])
    single = dev_server.enqueue("ev-a", {"n": 1}, priority=7)
    bulk = dev_server.request("POST", "/api/v1/jobs/bulk", json={"queue_name": "ev-a", "jobs": [{"payload": 2}]})
    [bulk_id] = [s["job_id"] for s in bulk.json()["succeeded"]]

    r.wait(lambda notes: len([n for n in notes if n[0] == "event"]) >= 2, "two job.created events")
    (name, first), (_, second) = r.events()[:2]
    assert name == "job.created"
    assert first["type"] == "JobCreated" and set(first["data"]) == {"job_id", "queue_name", "priority", "timestamp"}
    assert first["data"]["job_id"] == single and first["data"]["queue_name"] == "ev-a"
    assert first["data"]["priority"] == 7 and first["data"]["timestamp"].endswith("Z")
    assert second["data"]["job_id"] == bulk_id and second["data"]["priority"] == 0


def test_the_queue_filter_and_the_event_filter_keep_only_what_was_asked(dev_server, reader):
    only_a = reader(["flt-a"])
    every_queue = reader(["flt-a", "flt-b"])  # several queues: no server-side queue filter
    completions = reader(["flt-a"], names="job.completed")
    dev_server.enqueue("flt-b", {"n": 1})
    job = dev_server.enqueue("flt-a", {"n": 2})

    every_queue.wait(lambda notes: len([n for n in notes if n[0] == "event"]) >= 2, "both queues' events")
    only_a.wait(lambda notes: any(n[0] == "event" for n in notes), "queue a's event")
    assert [e["data"]["queue_name"] for _, e in every_queue.events()] == ["flt-b", "flt-a"]
    assert [e["data"]["job_id"] for _, e in only_a.events()] == [job]
    completions.pump(0.2)
    assert completions.events() == []


def test_an_organization_hears_only_its_own_jobs(dev_server, reader):
    org = dev_server.request("POST", "/api/v1/organizations", json={"name": "Listener", "slug": "listener-org"})
    other_key = org.json()["api_key"]["key"]
    theirs = reader(["shared"], key=other_key)
    ours = reader(["shared"])
    job = dev_server.enqueue("shared", {"n": 1})

    ours.wait(lambda notes: any(n[0] == "event" for n in notes), "our event")
    theirs.pump(0.3)
    assert [e["data"]["job_id"] for _, e in ours.events()] == [job]
    assert theirs.events() == []


def test_a_dropped_stream_is_reported_lost(dev_server, reader):
    r = reader(["drop-q"])
    assert dev_server.request("POST", "/_dev/events/drop").json()["dropped"] >= 1
    r.wait(lambda notes: any(n[0] == "lost" for n in notes), "the stream to be lost")
    assert not r.conn.open


def test_refusals_are_answers_not_streams(dev_server, tmp_path):
    bad_key = Reader(dev_server, ["q"], key="sp_test_wrong")
    bad_key.wait(lambda notes: any(n[0] == "refused" for n in notes), "401")
    assert [n[1] for n in bad_key.notes if n[0] == "refused"] == [401]
    bad_key.close()
    answer = requests.get(dev_server.url + "/api/v1/events?queue=no%20spaces", headers=dev_server.headers(),
                          timeout=5)
    assert answer.status_code == 400 and answer.json()["code"] == "VALIDATION_ERROR"

    old = DevServer(str(tmp_path / "old.db"), extra=["--events", "off"]).start()
    try:
        r = Reader(old, ["q"])
        r.wait(lambda notes: any(n[0] == "refused" for n in notes), "404")
        [(_, status, message)] = [n for n in r.notes if n[0] == "refused"]
        assert status == 404 and "NOT_FOUND" in message
        r.close()
    finally:
        old.stop()


# ------------------------------------------------------------------ framing
STREAM = (b": keepalive\r\n\r\nevent: job.created\r\ndata: {\"a\":1}\r\n\r\n"
          b"event: two\ndata: line one\ndata: line two\n\n"
          b"id: 5\rretry: 10\revent: cr\rdata:nospace\r\r"
          b"event: no-data\n\n"
          b"data: unnamed\n\n")
EXPECTED = [("job.created", '{"a":1}'), ("two", "line one\nline two"), ("cr", "nospace"), ("message", "unnamed")]


@pytest.mark.parametrize("cut", [1, 2, 3, 7, len(STREAM)])
def test_sse_framing_holds_however_the_bytes_are_cut(cut):
    parser = SseParser()
    got = []
    for start in range(0, len(STREAM), cut):
        got += parser.feed(STREAM[start:start + cut])
    assert got == EXPECTED


def test_an_event_that_never_ends_is_malformed():
    parser = SseParser()
    with pytest.raises(ValueError):
        for _ in range(2000):
            parser.feed(b"data: " + b"x" * 1000 + b"\n")


def test_a_flooding_stream_holds_the_reader_for_one_bounded_read_per_turn():
    """A peer that answers 200 and then sends comment lines as fast as the socket takes them: each turn
    reads at most READ_BUDGET bytes and returns, so the loop goes on turning."""
    import threading

    from supervisor.client import events

    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def flood():
        conn, _ = listener.accept()
        conn.recv(65536)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n")
        block = b":\n" * 32768
        try:
            while not stop.is_set():
                conn.sendall(block)
        except OSError:
            pass
        conn.close()

    server = threading.Thread(target=flood, daemon=True)
    server.start()
    api = SpooledAPI(f"http://127.0.0.1:{listener.getsockname()[1]}", Secret("sp_test_abcdefghijkl"))
    sel = selectors.DefaultSelector()
    conn = EventsConnection(api, sel, events_path(api, ["q"]))
    try:
        conn.connect(socket.getaddrinfo("127.0.0.1", listener.getsockname()[1], type=socket.SOCK_STREAM)[0],
                     time.monotonic())
        turns, longest, most, opened = 0, 0.0, 0, False
        deadline = time.monotonic() + 20  # the flood runs until the reader has turned 30 times, on a busy host too
        while turns < 30 and time.monotonic() < deadline:
            for key, mask in sel.select(0.1):
                began = time.thread_time()  # this thread's CPU: a busy host's preemption is not the reader's hold
                opened |= ("open",) in key.data[1].on_ready(mask, time.monotonic())
                longest = max(longest, time.thread_time() - began)
                most = max(most, conn.take_traffic()[0])
                turns += 1
        assert opened and turns >= 30
        assert 0 < most <= events.READ_BUDGET, most  # the bound itself: bytes read in one turn
        # and what it costs: ~35 ms of CPU for a turn of 32,768 comment lines here, twice that under coverage's
        # tracer (CI), more on a loaded host; an unbounded reader would never return at all
        assert longest < 0.5, f"one turn held the reader {longest:.3f}s of CPU (budget {events.READ_BUDGET} bytes)"
    finally:
        stop.set()
        conn.close()
        sel.close()
        listener.close()
