"""The in-flight table: renewal and timeout schedules, the waiting count, and the deadline bound the loop sleeps to."""

from __future__ import annotations

import math
import random

from supervisor.job import Job
from supervisor.parent.jobs.inflight import InFlight, Outcome


def job(raw: dict) -> Job:
    parsed = Job.parse(raw)
    assert parsed is not None
    return parsed


def _earliest_due(table: InFlight) -> float:
    """What enforce acts on, from scratch: renewals, a waiting job's lease, timeouts, reports to resend."""
    times = [math.inf]
    for e in table.jobs.values():
        if not e.renewal.busy:
            times.append(e.renew_at)
            if e in table.unassigned():
                times.append(e.lease_until)
        if e.timeout_at is not None and e.outcome is None:
            times.append(e.timeout_at)
        if e.report_due_at is not None:
            times.append(e.report_due_at)
    return min(times)


def test_inflight_schedule_renewals_and_timeouts():
    table = InFlight(lease_secs=30)
    entry = table.add(job({"id": "a", "lease_id": "L", "timeout_seconds": 5}), now=100.0)
    assert table.renewals_due(109.9) == [] and table.renewals_due(110.0) == [entry]
    assert table.unassigned() == [entry]
    table.start(entry, slot=0, pid=42, now=101.0)
    assert table.unassigned() == [] and table.on_child(0) is entry
    assert table.timed_out(105.9) == [] and table.timed_out(106.0) == [entry]
    table.renewed(entry, sent_at=110.0)
    assert entry.lease_until == 140.0 and entry.renew_at == 120.0
    assert table.next_deadline() == 106.0
    table.record_outcome(entry, Outcome(True, {"ok": 1}, "completed"), now=103.5)
    assert entry.outcome.label == "completed" and entry.outcome.verb == "complete" and entry.duration == 2.5
    assert table.on_child(0) is None and table.timed_out(1e9) == []
    assert table.pop("a") is entry and len(table) == 0


def test_inflight_waiting_follows_every_change_of_an_entry():
    """The table keeps its reserved jobs apart (not rescanned each turn): each way out of waiting is seen."""
    table = InFlight(lease_secs=30)
    a, b, c = (table.add(job({"id": i, "lease_id": f"L-{i}"}), now=0.0) for i in "abc")
    assert table.unassigned() == [a, b, c] and table.unassigned_count() == 3
    table.start(a, slot=0, pid=1, now=1.0)  # given to a child
    table.record_outcome(b, Outcome(False, "lease lost", "lease_lost"), now=1.0)  # dropped before it started
    assert table.unassigned() == [c]
    a2 = table.add(job({"id": "a", "lease_id": "L-a2"}), now=2.0)  # re-issued under a new lease while a runs
    assert table.unassigned() == [c, a2]
    table.record_outcome(a, Outcome(True, None, "completed"), now=3.0)  # the old copy ending leaves the new one waiting
    assert table.unassigned() == [c, a2]
    table.replace_outcome(c, Outcome(False, "stopped", "lease_lost"))
    assert table.pop("a") is a2 and table.unassigned() == [] and table.unassigned_count() == 0


def test_inflight_deadline_bound_is_never_later_than_any_deadline_and_exact_after_a_rescan():
    """Random lives of jobs: after every change the table's bound is at or before the earliest deadline
    (so skipping the scans before it misses nothing), and a rescan makes it exact."""
    rng = random.Random(7)
    table, now, n = InFlight(lease_secs=30), 0.0, 0
    for _ in range(3000):
        now += rng.uniform(0.0, 2.0)
        entries = list(table.jobs.values())
        e = rng.choice(entries) if entries else None
        op = rng.randrange(9)
        if op == 0 or e is None:
            n += 1
            table.add(job({"id": f"j{n}", "lease_id": "L", "timeout_seconds": rng.choice([None, 0, 1, 5, 60])}), now)
        elif op == 1 and e in table.unassigned():
            table.start(e, slot=0, pid=1, now=now)
        elif op == 2 and e.outcome is None:
            table.record_outcome(e, Outcome(True, None, "completed"), now)
        elif op == 3 and e.outcome is not None:
            table.begin_report(e)
        elif op == 4 and e.report.busy:
            table.report_answered(e, retry_at=rng.choice([None, now + rng.uniform(0.0, 20.0)]))
        elif op == 5 and not e.renewal.busy:
            table.begin_renewal(e)
        elif op == 6 and e.renewal.busy:
            table.renewed(e, sent_at=now - rng.uniform(0.0, 0.5))
        elif op == 7 and e.renewal.busy:
            table.renewal_failed(e, now + rng.uniform(0.0, 40.0))  # may land past the lease
        elif op == 8:
            table.pop(e.id)
        bound = table.next_deadline()
        assert (math.inf if bound is None else bound) <= _earliest_due(table)
        if rng.random() < 0.1:
            table.rescan()
            assert (table.next_deadline() or math.inf) == _earliest_due(table)
            assert table.due(now) == (_earliest_due(table) <= now)
