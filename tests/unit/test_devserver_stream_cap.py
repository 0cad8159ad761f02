"""The per-organization cap on open streams holds under parallel opens: counting and adding happen under one
lock (Broadcaster.subscribe_capped), so no burst of opens gets past it."""

from __future__ import annotations

import threading

import pytest

from supervisor.devserver.realtime import Broadcaster

pytestmark = pytest.mark.timeout(30)


def test_parallel_opens_never_pass_the_cap():
    b = Broadcaster()
    start = threading.Barrier(40)
    got: list = []

    def open_one(raw: bool) -> None:
        start.wait()
        got.append((raw, b.subscribe_capped("org", None, None, None, raw, 5)))

    threads = [threading.Thread(target=open_one, args=(i % 2 == 0,)) for i in range(40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    for raw in (True, False):
        opened = [s for r, s in got if r == raw and s is not None]
        assert len(opened) == 5 and b.count_for("org", raw) == 5
    assert b.subscribe_capped("other", None, None, None, False, 5) is not None  # another organization's own cap
    b.unsubscribe(next(s for r, s in got if s is not None and not r))
    assert b.subscribe_capped("org", None, None, None, False, 5) is not None  # a closed stream frees its place


def test_a_scoped_subscriber_sees_only_its_queues_whatever_its_filter():
    b = Broadcaster()
    sub = b.subscribe_capped("org", None, None, None, True, 5, scope=frozenset({"mine"}))
    assert sub is not None
    for queue in ("theirs", None, "mine"):
        b.publish("org", "job.created", "JobCreated", {"job_id": str(queue), "queue_name": queue})
    assert sub.buffer.get_nowait()[2]["queue_name"] == "mine" and sub.buffer.empty()
    assert not sub.expired(0.0)
    timed = b.subscribe_capped("org", None, None, None, True, 5, expires_at=100.0)
    assert timed is not None and not timed.expired(99.9) and timed.expired(100.0)
