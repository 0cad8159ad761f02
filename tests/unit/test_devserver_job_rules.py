"""The dev server's job rules as decisions of its Store under a fake clock: which job a claim takes
(priority, then oldest first), an expired job never claimed, a parent gating its child, the retry back-off
up to its 60 s cap and the dead-letter record a last failure leaves."""

from __future__ import annotations

import json
import time as real_time

import pytest

from supervisor.devserver import store as store_module
from supervisor.devserver.errors import HttpError
from supervisor.devserver.store import Store

pytestmark = pytest.mark.timeout(30)
T0 = 1_900_000_000.0


class FakeTime:
    """Stands in for the `time` module the Store reads: `time()` is whatever the test set."""

    def __init__(self, now: float):
        self.now = now

    def time(self) -> float:
        return self.now

    gmtime = staticmethod(real_time.gmtime)


@pytest.fixture()
def clock(monkeypatch):
    fake = FakeTime(T0)
    monkeypatch.setattr(store_module, "time", fake)
    return fake


@pytest.fixture()
def store(clock):
    s = Store(":memory:")
    s.bootstrap("sp_test_rules")
    yield s
    s.close()


def org(store: Store) -> str:
    found = store.org_for_key("sp_test_rules")
    assert found
    return found


def job(store: Store, queue: str = "q", **fields) -> str:
    jid, created = store.create_job(org(store), {"queue_name": queue, "payload": json.dumps(fields.pop("payload", {})),
                                                 **fields})
    assert created
    return jid


def claim_ids(store: Store, queue: str = "q", limit: int = 10) -> list[str]:
    return [j["id"] for j in store.claim(org(store), queue, "w1", limit, 30)]


def test_a_claim_takes_the_highest_priority_then_the_oldest(store, clock):
    ids = []
    for i in range(4):
        clock.now = T0 + i
        ids.append(job(store, priority=5 if i == 2 else 0))
    taken = [claim_ids(store, limit=1)[0] for _ in range(4)]
    assert taken == [ids[2], ids[0], ids[1], ids[3]]
    assert claim_ids(store) == []


def test_an_expired_job_is_never_claimed(store, clock):
    soon = job(store, expires_at=T0 + 10)
    later = job(store, expires_at=T0 + 1000)
    clock.now = T0 + 10  # the expiry instant itself: expired
    assert claim_ids(store) == [later]
    clock.now = T0 + 5000
    assert claim_ids(store) == []
    assert store.get_job(org(store), soon)["status"] == "pending"


def test_a_child_waits_for_its_parent_to_complete(store, clock):
    parent = job(store)
    child = job(store, parent_job_id=parent)
    assert store.get_job(org(store), child)["dependencies_met"] is False
    (leased,) = store.claim(org(store), "q", "w1", 10, 30)
    assert leased["id"] == parent  # the child is not claimable yet
    store.complete(org(store), parent, "w1", leased["lease_id"], None)
    assert store.get_job(org(store), child)["dependencies_met"] is True
    assert claim_ids(store) == [child]
    # a parent already completed releases a new child at once
    assert store.get_job(org(store), job(store, parent_job_id=parent))["dependencies_met"] is True


@pytest.mark.parametrize("where", ["unknown", "other queue"])
def test_a_parent_must_exist_in_the_same_queue(store, where):
    parent = job(store, queue="other") if where == "other queue" else "no-such-job"
    with pytest.raises(HttpError) as e:
        job(store, parent_job_id=parent)
    assert e.value.status == 400 and e.value.body["code"] == "VALIDATION_ERROR"
    assert e.value.body["details"][0]["field"] == "parent_job_id"


def test_the_retry_back_off_doubles_up_to_its_60_s_cap(store, clock):
    jid = job(store, max_retries=10)
    delays = []
    for attempt in range(10):
        (leased,) = store.claim(org(store), "q", "w1", 1, 30)
        assert leased["retry_count"] == attempt
        retried, delay = store.fail_job(org(store), jid, "w1", leased["lease_id"], f"boom {attempt}")
        assert retried
        row = store.job_raw(org(store), jid)
        assert row["status"] == "pending" and row["scheduled_at"] == pytest.approx(clock.now + delay)
        delays.append(delay)
        clock.now = row["scheduled_at"] - 0.001
        assert claim_ids(store) == []  # not before its back-off
        clock.now = row["scheduled_at"]
    assert [int(d) for d in delays] == [1, 2, 4, 8, 16, 32, 60, 60, 60, 60]
    assert all(0 <= d - int(d) < 0.5 for d in delays)  # 0-499 ms of jitter


def test_the_last_failure_leaves_a_dead_letter_record(store, clock):
    jid = job(store, queue="mail", max_retries=1, payload={"to": "a@example.com"})
    for attempt in range(2):
        (leased,) = store.claim(org(store), "mail", "w1", 1, 30)
        retried, _ = store.fail_job(org(store), jid, "w1", leased["lease_id"], f"smtp down {attempt}")
        assert retried is (attempt == 0)
        clock.now += 5
    final = store.get_job(org(store), jid)
    assert final["status"] == "deadletter" and final["last_error"] == "smtp down 1" and final["retry_count"] == 1
    assert final["assigned_worker_id"] is None and final["lease_id"] is None
    rows = store._read("SELECT organization_id, job_id, queue_name, reason, original_payload, error_details, "
                       "created_at FROM dead_letter_queue")
    assert len(rows) == 1
    org_id, job_id, queue, reason, payload, details, created = rows[0]
    assert (org_id, job_id, queue, reason) == (org(store), jid, "mail", "smtp down 1")
    assert json.loads(payload) == {"to": "a@example.com"}
    assert json.loads(details) == {"final_error": "smtp down 1", "total_retries": 1}
    assert created == clock.now - 5
    listed, more = store.list_jobs(org(store), "mail", ["deadletter"], None, 10, 0)
    assert [j["id"] for j in listed] == [jid] and not more and listed[0]["last_error"] == "smtp down 1"
