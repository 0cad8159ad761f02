"""The UI's throughput read (history.throughput) is an indexed range over the organization's recent job
history, not a scan of every change ever recorded, so a long dev session's history does not slow the API that
waits on the store's lock."""

from __future__ import annotations

import time

import pytest

from supervisor.devserver.history import throughput
from supervisor.devserver.store import Store

pytestmark = pytest.mark.timeout(30)


def test_throughput_reads_the_window_through_the_org_and_time_index(tmp_path):
    store = Store(str(tmp_path / "h.db"))
    try:
        plans: list[str] = []

        def read(sql, args):
            plans.extend(str(r[-1]) for r in store.read("EXPLAIN QUERY PLAN " + sql, tuple(args)))
            return store.read(sql, tuple(args))

        now = time.time()
        assert throughput(read, "org", now) == {}
        assert any("job_events_org_at" in p for p in plans), plans
        assert not any(p.startswith("SCAN e") or p == "SCAN job_events" for p in plans), plans
    finally:
        store.close()
