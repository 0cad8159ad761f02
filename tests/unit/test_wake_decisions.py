"""`Wake`'s decisions and the job flow's answer to them, in-process with `now` passed in: what an event
means, when the stream is (re)opened, when it is given up, and how an empty claim is timed around it."""

from __future__ import annotations

import json

import pytest
from support.flow_sim import Sim

from supervisor.parent.facts import Listening, WorkCreated
from supervisor.parent.wake import (
    FLOOD_BYTES,
    FLOOD_COMMENTS,
    REOPEN_BASE,
    SAFETY_POLL,
    SHORT_LIVES,
    SILENCE,
    STEADY,
    SUSPECT_REOPEN,
    Wake,
)

pytestmark = pytest.mark.timeout(30)


def created(queue: str, job_id: str = "j1") -> str:
    return json.dumps({"type": "JobCreated", "data": {"job_id": job_id, "queue_name": queue, "priority": 0,
                                                      "timestamp": "2026-12-01T00:00:00.000000Z"}})


def live_wake(now: float = 100.0) -> Wake:
    wake = Wake(True, ["a", "b"], open_timeout=10.0)
    assert wake.open_due(now, True)
    wake.opening(now)
    assert wake.opened(now) == [Listening(True)]
    return wake


def test_a_job_created_on_one_of_our_queues_means_claim_there():
    wake = live_wake()
    assert wake.received("job.created", created("b"), 101.0) == [WorkCreated("b")]
    assert wake.received("job.created", created("other"), 101.0) == []
    assert wake.received("system.health", '{"type":"SystemHealth","data":{}}', 101.0) == []
    assert wake.received("job.created", "not json", 101.0) == [WorkCreated(None)]  # look everywhere
    assert wake.created_seen == 1


def test_nothing_is_due_while_the_daemon_may_not_claim():
    wake = Wake(True, ["a"], open_timeout=10.0)
    assert wake.next_deadline(0.0, may_claim=False) is None and not wake.open_due(0.0, False)
    wake.unresolved(5.0)
    assert wake.next_deadline(5.0, may_claim=True) > 5.0, "an unresolved host is retried later, not every turn"


def test_a_lost_live_stream_reopens_soon_and_says_so():
    wake = live_wake()
    assert wake.lost(200.0, "reset") == [Listening(False)]
    assert 200.0 < wake.next_deadline(200.0, True) <= 200.0 + REOPEN_BASE
    wake.opening(201.0)
    assert wake.lost(201.0, "refused") == [], "a failed attempt was never live"
    assert wake.dead(201.0 + 11.0, 201.0) is False  # down, not opening


def test_silence_and_a_slow_answer_are_dead_streams():
    wake = Wake(True, ["a"], open_timeout=10.0)
    wake.opening(0.0)
    assert not wake.dead(9.0, 0.0) and wake.dead(10.5, 0.0)
    wake.opened(1.0)
    assert not wake.dead(1.0 + SILENCE - 1, 1.0) and wake.dead(1.0 + SILENCE + 1, 1.0)


@pytest.mark.parametrize("status", [403, 404, 405])
def test_a_server_without_the_stream_turns_listening_off_for_good(status):
    wake = Wake(True, ["a"], open_timeout=10.0)
    wake.opening(0.0)
    assert wake.refused(status, "nope", 0.0) == []
    assert wake.state == "off" and wake.next_deadline(1.0, True) is None and not wake.open_due(1e9, True)


def test_other_refusals_are_retried():
    wake = Wake(True, ["a"], open_timeout=10.0)
    wake.opening(0.0)
    wake.refused(503, "busy", 0.0)
    assert wake.state == "down" and wake.next_deadline(0.0, True) is not None


def test_a_drain_closes_the_stream():
    wake = live_wake()
    assert wake.stopped(300.0) == [Listening(False)]
    assert not wake.open_due(301.0, may_claim=False)


def test_an_empty_claim_waits_for_the_safety_poll_unless_a_job_was_announced_meanwhile():
    sim = Sim(procs=2, jobs=0, rtt=0.02)
    flow, now = sim.flow, sim.now
    flow.heard(Listening(True), now)
    flow.maybe_claim(now, 2, 2, True)
    assert flow.claiming.claim.busy
    claims = lambda: [p for p in sim.pending if p[2].route == "claim"]  # noqa: E731 (the queue's statistics go too)
    [(_, _, call, (followup, _))] = claims()
    flow.heard(WorkCreated("q"), now + 0.01)  # announced while the claim was on the wire
    followup.answer([], None, now + 0.02)
    assert flow.claiming.queues["q"].next_claim_at == now + 0.02, "claim again at once: the answer may predate the job"

    flow.maybe_claim(now + 0.02, 2, 2, True)
    [_, (_, _, _, (again, _))] = claims()
    again.answer([], None, now + 0.04)
    wait = flow.claiming.queues["q"].next_claim_at - (now + 0.04)
    assert 0.8 * SAFETY_POLL <= wait <= SAFETY_POLL, "nothing announced: the slow safety poll"

    flow.heard(WorkCreated("q"), now + 1.0)
    assert flow.claiming.queues["q"].next_claim_at == now + 1.0
    flow.heard(Listening(False), now + 2.0)
    assert not flow.claiming.listening


def test_a_one_queue_stream_is_filtered_by_the_server_so_its_events_are_not_read(monkeypatch):
    import logging

    monkeypatch.setattr(logging.getLogger("supervisor"), "level", logging.INFO)
    wake = Wake(True, ["only"], open_timeout=10.0)
    assert wake.received("job.created", "{not even json", 1.0) == [WorkCreated("only")]
    assert wake.received("job.status", created("only"), 1.0) == []
    assert wake.created_seen == 1


def test_a_job_failed_with_retries_left_is_claimed_when_its_back_off_ends_not_at_the_safety_poll():
    sim = Sim(procs=1, jobs=0, rtt=0.02)
    flow, now = sim.flow, sim.now
    flow.heard(Listening(True), now)
    intake = flow.claiming.queues["q"]
    intake.retry_due(now + 2.55)  # what a fail of a job on its second try (retry_count 1) expects
    intake.answered(1, 0, now + 0.1, 5.0, listening=True, sent_at=now + 0.05)
    assert intake.next_claim_at == now + 2.55
    intake.answered(1, 0, now + 2.6, 5.0, listening=True, sent_at=now + 2.56)
    assert intake.next_claim_at - (now + 2.6) >= 0.8 * SAFETY_POLL and intake.retries_due == []


def test_the_retry_time_follows_the_servers_back_off():
    from supervisor.parent.facts import JobDone

    sim = Sim(procs=1, jobs=0, rtt=0.02)
    flow, now = sim.flow, sim.now
    flow.heard(Listening(True), now)
    for retry_count, delay in ((0, 1), (3, 8), (9, 60)):
        job = {"id": f"j{retry_count}", "lease_id": "L", "queue_name": "q", "retry_count": retry_count,
               "max_retries": 10}
        flow.claiming.on_claim(flow.claiming.queues["q"], 1, now, [job], None, now)
        [(child, entry)] = flow.claiming.assignments(sim.children[:1])
        flow.started(entry, child, now)
        flow.job_done(JobDone(child.slot, entry.id, False, "boom"), now)
        flow.send_reports()
        [(_, _, call, (followup, _))] = [p for p in sim.pending if p[2].route == "fail"]
        sim.pending.clear()
        flow.route(followup.answer(None, None, now), now)
        assert max(flow.claiming.queues["q"].retries_due) == pytest.approx(now + delay + 0.55)


def test_a_refused_key_on_the_stream_is_fatal_as_on_any_route():
    from supervisor import exitcodes
    from supervisor.parent.facts import Fatal

    wake = Wake(True, ["a"], open_timeout=10.0)
    wake.opening(0.0)
    [fact] = wake.refused(401, "Invalid API key", 0.0)
    assert isinstance(fact, Fatal) and fact.code == exitcodes.AUTH and "events stream" in fact.error


# ------------------------------------------------------------------ a stream that misbehaves

def test_one_stream_that_ends_early_is_a_restart_not_a_misbehaving_stream():
    wake = live_wake(100.0)
    assert wake.lost(101.0, "the server ended the events stream") == [Listening(False)]
    assert not wake.suspect and wake.reopen_at <= 101.0 + REOPEN_BASE
    wake.opening(wake.reopen_at)
    assert wake.opened(wake.reopen_at) == [Listening(True)]  # every queue re-checked, as after any reconnect


def test_streams_that_keep_closing_at_once_back_off_and_are_said_once(caplog):
    wake = live_wake(100.0)
    now, facts, waits = 100.0, [], []
    with caplog.at_level("DEBUG", logger="supervisor"):
        for _ in range(SHORT_LIVES + 3):
            facts += wake.lost(now, "the server ended the events stream")
            waits.append(wake.reopen_at - now)
            now = wake.reopen_at
            wake.opening(now)
            facts += wake.opened(now)
    assert wake.suspect and wake.misbehaved == 1
    # exponential while it might be a restart, then SUSPECT_REOPEN apart
    assert waits[0] <= waits[1] * 2 and all(w >= SUSPECT_REOPEN / 2 for w in waits[SHORT_LIVES - 1:]), waits
    # the first flaps re-check the queues; once it is a suspect, its flaps say nothing (the safety poll goes on)
    assert facts == [Listening(False), Listening(True)] * (SHORT_LIVES - 1)
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "misbehaves" in warnings[0] and "ended within" in warnings[0], warnings


def test_a_suspect_stream_that_stays_up_is_trusted_again():
    wake = live_wake(0.0)
    wake.traffic(1.0, FLOOD_BYTES + 1, 0)
    assert wake.lost(1.0, "floods", flood="it sent too much") == [] and wake.suspect
    at = wake.reopen_at
    wake.opening(at)
    assert wake.opened(at) == [] and wake.steady(at + STEADY - 1) == []
    assert wake.steady(at + STEADY + 0.001) == [Listening(True)] and not wake.suspect and wake.failures == 0
    assert wake.steady(at + STEADY + 1) == []  # said once


def test_a_flood_is_counted_over_a_window_in_bytes_and_comment_lines():
    wake = live_wake(0.0)
    assert wake.traffic(0.5, FLOOD_BYTES // 2, FLOOD_COMMENTS // 2) is None
    assert "bytes" in (wake.traffic(1.0, FLOOD_BYTES // 2 + 1, 0) or "")
    wake = live_wake(0.0)
    assert wake.traffic(1.0, 100, FLOOD_COMMENTS) is None  # a keepalive every 10 s is far below
    assert "comment lines" in (wake.traffic(2.0, 100, 1) or "")
    wake = live_wake(0.0)
    for t in range(0, 100, 11):  # the same traffic spread over windows never floods
        assert wake.traffic(float(t), FLOOD_BYTES // 2, FLOOD_COMMENTS // 2) is None
