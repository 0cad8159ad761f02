"""A webhook delivery is attempted once at a time: while an attempt is still running (a slow DNS lookup is not
bounded by the timeout) its lapsed lease never hands the same delivery to a second sender, and the sender
does not spin on it meanwhile."""

from __future__ import annotations

import threading
import time

import pytest

from supervisor.devserver import webhooks
from supervisor.devserver.store import Store

pytestmark = pytest.mark.timeout(30)


def test_a_delivery_whose_lease_lapses_mid_attempt_is_not_sent_twice(tmp_path, monkeypatch):
    store = Store(str(tmp_path / "w.db"))
    release = threading.Event()
    calls: list[str] = []

    def slow_post(url, payload, headers, timeout):
        calls.append(url)
        release.wait(10)  # the attempt outlives its lease
        return 200, b""

    monkeypatch.setattr(webhooks, "post", slow_post)
    hooks = webhooks.Webhooks(store, timeout=0.5, backoff=0.05)
    try:
        hooks.create("org", {"name": "h", "url": "http://127.0.0.1:9/h", "events": '["job.completed"]',
                             "enabled": 1})
        hooks.on_fact("org", "job.completed", {"job_id": "j", "queue_name": "q", "duration_ms": 1, "result": None})
        deadline = time.monotonic() + 10
        while not calls and time.monotonic() < deadline:
            time.sleep(0.01)
        assert calls == ["http://127.0.0.1:9/h"]
        with store._tx() as db:  # the lease lapses while the attempt still runs
            db.execute("UPDATE outgoing_webhook_deliveries SET next_attempt_at=?", (time.time() - 1,))
        assert hooks._dispatch_due() > 0.5  # nothing else due: no spin on the running one
        (lease,) = store.read("SELECT next_attempt_at FROM outgoing_webhook_deliveries")[0]
        assert lease < time.time() and len(calls) == 1  # not leased again: not handed out again
        release.set()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            (status,) = store.read("SELECT status FROM outgoing_webhook_deliveries")[0]
            if status == "success":
                break
            time.sleep(0.02)
        assert status == "success" and len(calls) == 1
        assert store.read("SELECT attempts FROM outgoing_webhook_deliveries")[0][0] == 1
    finally:
        release.set()
        store.close()
