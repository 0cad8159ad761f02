"""Back-off after very many attempts in a row stays at its cap: an idle daemon polling an empty queue counts
an empty claim every few seconds, and after about a thousand of them (an hour at --poll-interval 5) the
doubling once outgrew a float, so every claim's answer raised."""

from __future__ import annotations

from supervisor.backoff import backoff
from supervisor.parent.jobs.intake import QueueIntake


def test_backoff_stays_within_half_the_cap_and_the_cap_however_many_attempts():
    for attempt in (1, 2, 10, 1074, 1100, 10**6):
        delay = backoff(attempt, 0.05, 5.0)
        full = min(5.0, 0.05 * 2 ** (min(attempt, 64) - 1))
        assert full / 2 <= delay <= full


def test_an_empty_queue_polled_for_hours_keeps_its_back_off():
    intake = QueueIntake("q")
    now = 0.0
    for _ in range(5000):  # about five hours of empty claims at --poll-interval 5
        intake.answered(asked=1, got=0, now=now, poll_interval=5.0, sent_at=now)
        assert 2.5 <= intake.next_claim_at - now <= 5.0 or intake.empty_claims < 8
        now = intake.next_claim_at
    assert intake.empty_claims == 5000
