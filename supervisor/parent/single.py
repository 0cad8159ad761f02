"""One call of a kind on the wire at a time, with recovery.

A claim, a registration, a heartbeat, a worker-row check, one job's report and one job's lease renewal
each go out at most once at a time. `OneAtATime` is that rule for one kind: `start()` takes the turn,
and the `Followup` it wraps (`followup`) gives the turn back before the answer (or, if handling the
answer raised, the recovery) runs, so no bug in an answer can leave a kind of call blocked for ever.
A job's report and renewal (one of each per job: the hot path) skip the wrapping: the in-flight table
takes and gives back their turn (`begin_report` / `report_answered`, `begin_renewal` / `renewed` /
`renewal_failed`) on every path of their answers and recoveries.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from supervisor.client.calls import ApiError
from supervisor.parent.facts import Fact, Followup

Answer = Callable[[Any, ApiError | None, float], Sequence[Fact] | None]
Recover = Callable[[float], Sequence[Fact] | None]


class OneAtATime:
    """Whether a call of one kind is on the wire (`busy`). `start` takes the turn (False while one is out);
    `done` gives it back; `followup` makes the call's Followup, which gives it back before anything else."""

    __slots__ = ("busy",)

    def __init__(self) -> None:
        self.busy = False

    def start(self) -> bool:
        """Take the turn: True if no call of this kind was out (it is now), False if one still is."""
        if self.busy:
            return False
        self.busy = True
        return True

    def done(self) -> None:
        """The call's answer came (or it was given up): another may go out."""
        self.busy = False

    def followup(self, answer: Answer, recover: Recover | None = None) -> Followup:
        """The Followup of the call that took the turn: both of its paths give the turn back first, then
        run `answer(result, error, now)` or `recover(now)` (if given)."""
        def on_answer(result: Any, error: ApiError | None, now: float) -> Sequence[Fact] | None:
            self.busy = False
            return answer(result, error, now)

        def on_recover(now: float) -> Sequence[Fact] | None:
            self.busy = False
            return recover(now) if recover is not None else None

        return Followup(on_answer, on_recover)
