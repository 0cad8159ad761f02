"""Firing due schedules walks their cron expressions outside the store's write lock (a rare expression's walk
takes a while, and every claim waits on that lock), and fires each due schedule exactly once (fake clock)."""

from __future__ import annotations

import threading

import pytest

from supervisor.devserver import cron, schedules_store
from supervisor.devserver.store import Store

pytestmark = pytest.mark.timeout(20)


def _lock_free(store: Store) -> bool:
    got: list[bool] = []

    def probe() -> None:
        ok = store._lock.acquire(timeout=0.5)
        got.append(ok)
        if ok:
            store._lock.release()

    t = threading.Thread(target=probe)
    t.start()
    t.join(5)
    return got == [True]


def test_the_next_runs_are_walked_outside_the_write_transaction(tmp_path, monkeypatch):
    store = Store(str(tmp_path / "s.db"))
    try:
        schedules_store.ensure_tables(store)
        for name in ("a", "b"):
            schedules_store.create(store, "org", {"name": name, "description": None, "cron_expression": "0 * * * *",
                                                  "timezone": "UTC", "queue_name": "q", "payload_template": "{}",
                                                  "priority": None, "max_retries": None, "timeout_seconds": None,
                                                  "tags": None, "metadata": None}, 1000.0, 900.0)
        walks: list[bool] = []
        real = cron.next_after

        def watched(spec, now):
            walks.append(_lock_free(store))
            return real(spec, now)

        monkeypatch.setattr(cron, "next_after", watched)
        made = schedules_store.fire_due(store, 1000.0)
        assert len(made) == 2 and walks == [True, True]
        assert schedules_store.fire_due(store, 1000.0) == []  # each fired once: the next run is an hour on
        (runs,) = store.read("SELECT count(*) FROM schedule_runs")[0]
        assert runs == 2
    finally:
        store.close()
