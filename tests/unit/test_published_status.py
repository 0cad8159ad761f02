"""What /status and /healthz read: a frozen snapshot the loop publishes (from each part's `stats()`), never
the parts themselves; its ages computed when it is read, so a loop that stopped turning shows it."""

from __future__ import annotations

import signal
import time

import pytest
from support.arbiter_rig import T0, Rig

from supervisor.ops.health import Published, liveness
from supervisor.parent.arbiter import PUBLISH_EVERY

STATUS_KEYS = ["worker_id", "queue", "pid", "version", "registered", "draining", "status", "phase", "loop_age_secs",
               "api_age_secs", "api_silence_secs", "children_down_secs", "procs", "busy", "inflight", "reserved",
               "held", "queues", "requests_sent", "jobs_settled", "requests_per_job", "rate_limit_rps",
               "rate_limited_answers", "claim_rtt_ms", "reserve_wait_ms", "memory", "wake", "children", "failing"]
CHILD_KEYS = ["slot", "pid", "state", "job_id", "job_runtime_secs", "rss_bytes", "jobs_done", "restarts",
              "memory_bytes", "subprocesses", "memory_kind"]


@pytest.fixture
def rig(monkeypatch):
    r = Rig(monkeypatch)
    try:
        yield r
    finally:
        r.close()


def test_status_keeps_its_keys_in_their_order(rig):
    rig.running()
    rig.run_job("a")
    rig.arb.publish(T0)
    snap = rig.arb.snapshot()
    assert list(snap) == STATUS_KEYS
    assert [list(child) for child in snap["children"]] == [CHILD_KEYS, CHILD_KEYS]
    assert snap["inflight"] == 1 and snap["busy"] == 1 and snap["queues"] == {"q": {"inflight": 1, "reserved": 0,
                                                                                     "empty": True}}


def test_ages_are_computed_when_read_so_a_frozen_loop_shows_it():
    row = {"slot": 0, "job_runtime_secs": None}
    pub = Published({"loop_age_secs": None, "api_age_secs": None, "api_silence_secs": None,
                     "children_down_secs": None, "children": None}, ((row, 7.0), ({"slot": 1}, None)),
                    loop_at=10.0, started_at=1.0, api_ok_at=None, children_up_at=9.0)
    early, late = pub.status(10.5), pub.status(30.0)
    assert early["loop_age_secs"] == 0.5 and late["loop_age_secs"] == 20.0  # nothing republished: it grows
    assert late["api_age_secs"] is None and late["api_silence_secs"] == 29.0 and late["children_down_secs"] == 21.0
    assert late["children"] == [{"slot": 0, "job_runtime_secs": 23.0}, {"slot": 1, "job_runtime_secs": None}]
    assert liveness(early, 10.0, 120.0) is None and "has not turned for 20.0s" in liveness(late, 10.0, 120.0)
    assert row == {"slot": 0, "job_runtime_secs": None}  # reading never changes what was published


def test_the_snapshot_changes_only_when_published_or_at_a_phase_change(rig):
    rig.running()
    rig.arb.publish(T0)
    assert rig.arb.next_publish_at == T0 + PUBLISH_EVERY
    rig.run_job("a")
    assert rig.arb.snapshot()["inflight"] == 0  # the job came after the last publish
    rig.signal(signal.SIGTERM, now=T0 + 0.01)  # a phase change is published at once
    snap = rig.arb.snapshot()
    assert snap["phase"] == "draining" and snap["draining"] and snap["inflight"] == 1


def test_reading_the_snapshot_touches_no_part(rig, monkeypatch):
    rig.running()
    rig.arb.publish(T0)

    def boom(*args):
        raise AssertionError("the health thread reached into a part")

    for part in (rig.arb.pool, rig.arb.jobs.claiming, rig.arb.jobs.settling, rig.arb.jobs.inflight, rig.arb.membership,
                 rig.arb.pacer, rig.arb.pressure, rig.arb.listener):
        monkeypatch.setattr(part, "stats", boom)
    monkeypatch.setattr(rig.arb, "worker_status", boom)
    before = time.monotonic()
    snap = rig.arb.snapshot()
    assert snap["registered"] and snap["phase"] == "running"
    assert snap["loop_age_secs"] >= round(before - rig.arb.loop_at, 3)


def test_what_a_turn_changed_is_published_within_publish_every(rig):
    rig.start()
    rig.arb.publish(T0)
    rig.arb.publish_if_due(T0 + 0.01)  # a turn's end, too soon after the last publish
    assert rig.arb.publish_stale and rig.arb.next_wakeup(T0 + 0.01) <= T0 + PUBLISH_EVERY  # the loop wakes for it
    rig.arb.pool.resize(+1)
    rig.arb.publish_if_due(T0 + PUBLISH_EVERY)
    assert rig.arb.snapshot()["procs"] == 3 and not rig.arb.publish_stale
    rig.arb.publish_if_due(T0 + PUBLISH_EVERY + 0.5)  # an idle turn a while later publishes too, and then nothing is
    assert not rig.arb.publish_stale                   # left to wake for


def test_a_dead_child_shows_at_the_end_of_the_turn_that_reaped_it(rig):
    rig.running()
    rig.run_job("a")
    rig.arb.publish(T0)
    child = rig.child_of("a")
    child.proc.exitcode = -9
    rig.arb.reap(child, T0 + 0.01)
    rig.arb.publish_if_due(T0 + 0.01)
    snap = rig.arb.snapshot()
    assert snap["inflight"] == 1 and all(c["job_id"] != "a" for c in snap["children"])


def test_a_failing_slot_is_published_with_its_error_and_when_it_retries():
    pub = Published({"children": None, "failing": [{"slot": 1, "failures": 2, "last_error": "ImportError: x",
                                                    "retry_at": 14.5}]}, (), loop_at=10.0, started_at=1.0,
                    api_ok_at=None, children_up_at=9.0)
    assert pub.status(12.0)["failing"] == [{"slot": 1, "failures": 2, "last_error": "ImportError: x",
                                            "retry_in_secs": 2.5}]
    assert pub.status(20.0)["failing"][0]["retry_in_secs"] == 0.0  # due: it is being tried
