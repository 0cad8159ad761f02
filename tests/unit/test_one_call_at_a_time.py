"""`OneAtATime`: at most one call of a kind on the wire, and the turn always given back, whether the
answer is handled or handling it raised (the arbiter then runs the recovery)."""

from __future__ import annotations

import pytest

from supervisor.parent.facts import DrainAsked
from supervisor.parent.single import OneAtATime


def test_a_second_start_is_refused_until_done():
    one = OneAtATime()
    assert not one.busy and one.start() and one.busy
    assert not one.start() and one.busy  # one is out: no second
    one.done()
    assert not one.busy and one.start()


def test_the_answer_runs_with_the_turn_already_given_back():
    one = OneAtATime()
    seen = []
    followup = one.followup(lambda result, error, now: seen.append((result, error, now, one.busy)) or [DrainAsked()])
    assert one.start()
    assert followup.answer("r", None, 5.0) == [DrainAsked()]
    assert seen == [("r", None, 5.0, False)] and not one.busy


def test_an_answer_that_raises_leaves_the_turn_to_the_recovery_which_gives_it_back():
    one = OneAtATime()
    recovered = []

    def broken(result, error, now):
        one.start()  # whatever the handler did before it raised, the recovery frees the kind
        raise ValueError("an answer of a shape nobody foresaw")

    followup = one.followup(broken, lambda now: recovered.append(now))
    one.start()
    with pytest.raises(ValueError):
        followup.answer(None, None, 1.0)
    assert one.busy
    assert followup.recover(1.0) is None and recovered == [1.0] and not one.busy


def test_without_a_recovery_the_recovery_only_gives_the_turn_back():
    one = OneAtATime()
    followup = one.followup(lambda result, error, now: None)
    one.start()
    assert followup.recover(2.0) is None and not one.busy and one.start()
