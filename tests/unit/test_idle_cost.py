"""What an idle daemon costs the API beyond its heartbeats, in-process on a fake clock: the real jobs wing
and `Wake` against a fake API one round trip away (tests/support/flow_sim.py), for an hour of fake time on an empty
queue. Listening to the events stream, its claims (the safety poll) plus the stream's connects stay at
most 0.1 requests/s; polling alone, the empty-queue back-off costs twice that."""

from __future__ import annotations

import math

import pytest
from support.flow_sim import Sim
from support.wing_rig import WingRig

from supervisor.devserver.realtime import MAX_STREAM
from supervisor.ops.nullhooks import NullHooks
from supervisor.parent.wake import REOPEN_CAP, Wake

pytestmark = pytest.mark.timeout(60)

HOUR = 3600.0
BOUND = 0.1  # requests/s an idle daemon may spend beyond its heartbeats


class IdleDaemon(Sim):
    """`Sim` with an events stream: opened as `Wake` says, live one round trip later, ended by the server
    every MAX_STREAM seconds (as the real server does), its news handed to the job flow as the arbiter does."""

    def __init__(self, listen: bool, poll_interval: float, **kw):
        super().__init__(jobs=0, **kw)
        self.cfg = type(self.cfg)(**{**self.cfg.__dict__, "poll_interval": poll_interval})
        self.flow = WingRig(self.cfg, self.flow.claiming.transport, self._submit, NullHooks())
        self.wake = Wake(listen, ["q"], open_timeout=10.0)
        self.live_at = math.inf  # when the stream being opened answers
        self.ends_at = math.inf  # when the server ends the live stream

    def listen(self) -> None:
        now = self.now
        if self.wake.open_due(now, True):
            self.wake.opening(now)
            self.live_at = now + self.rtt
        if now >= self.live_at:
            self.live_at, self.ends_at = math.inf, now + MAX_STREAM
            for fact in self.wake.opened(now):
                self.flow.take(fact, now)
        if now >= self.ends_at:
            self.ends_at = math.inf
            for fact in self.wake.lost(now, "the server ended the events stream"):
                self.flow.take(fact, now)

    def idle_for(self, span: float) -> int:
        """Requests sent (claims and the stream's connects) over `span` seconds of fake time."""
        end = self.now + span
        while self.now < end:
            self.listen()
            self.turn()
            times = [self.next_time(), self.live_at, self.ends_at, self.wake.next_deadline(self.now, True) or math.inf]
            self.now = max(self.now + 1e-6, min(times))
        return len(self.sent) + self.wake.connects


def test_a_listening_idle_daemon_spends_at_most_a_tenth_of_a_request_a_second():
    daemon = IdleDaemon(listen=True, poll_interval=5.0, procs=4, rtt=0.02)
    requests = daemon.idle_for(HOUR)
    assert requests / HOUR <= BOUND, f"{requests} requests in an idle hour"
    assert daemon.wake.connects >= HOUR / MAX_STREAM, "the stream was reopened each time the server ended it"
    assert daemon.claims(), "the safety poll still claims now and then"


def test_polling_alone_costs_more_than_the_bound():
    """The same hour without the stream: the measurement above would catch a return to polling."""
    daemon = IdleDaemon(listen=False, poll_interval=5.0, procs=4, rtt=0.02)
    assert daemon.idle_for(HOUR) / HOUR > BOUND


def test_a_stream_that_keeps_failing_reopens_on_a_capped_back_off():
    """A stream refused every time: its connects are bounded by the back-off's cap, not the loop's pace."""
    wake = Wake(True, ["q"], open_timeout=10.0)
    now, opens = 0.0, 0
    while now < HOUR:
        if wake.open_due(now, True):
            wake.opening(now)
            opens += 1
            wake.refused(503, "Service Unavailable", now)
        now = max(now + 0.001, wake.next_deadline(now, True) or now + 1.0)
    assert opens <= HOUR / (REOPEN_CAP / 2) + 12  # the doubling steps, then one per [cap/2, cap]
