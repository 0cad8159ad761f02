"""What an idle daemon costs the API beyond its heartbeats, in-process on a fake clock: the real `JobParts`,
`Wake` and `Membership` against a fake API one round trip away (tests/support/flow_sim.py), for an hour of fake
time on an empty queue. Listening to the events stream, its claims (the safety poll), the stream's connects and
the worker row's reads (the takeover check) stay under 0.1 requests/s, also when the stream floods or ends
at once every time; polling alone, the empty-queue back-off costs about three times that."""

from __future__ import annotations

import math

import pytest
from support.flow_sim import Sim
from support.job_parts import JobParts

from supervisor.devserver.realtime import MAX_STREAM
from supervisor.ops.nullhooks import NullHooks
from supervisor.parent.membership import Membership
from supervisor.parent.wake import FLOOD_BYTES, REOPEN_CAP, Wake

pytestmark = pytest.mark.timeout(60)

HOUR = 3600.0
BOUND = 0.1  # requests/s an idle daemon may spend beyond its heartbeats


class IdleDaemon(Sim):
    """`Sim` with an events stream: opened as `Wake` says, live one round trip later, ended by the server
    every MAX_STREAM seconds (as the real server does), its news handed to the job flow as the arbiter does."""

    def __init__(self, listen: bool, poll_interval: float, lives_for: float = MAX_STREAM, floods: bool = False,
                 **kw):
        super().__init__(jobs=0, **kw)
        self.lives_for = lives_for  # how long the server keeps a live stream open
        self.floods = floods  # the stream floods as soon as it is live
        self.row_reads = 0
        self.members = Membership(self.cfg, self.flow.claiming.api, self._member_call)
        self.members.registered, self.members.next_heartbeat_at = True, 0.0
        self.cfg = type(self.cfg)(**{**self.cfg.__dict__, "poll_interval": poll_interval})
        self.flow = JobParts(self.cfg, self.flow.claiming.api, self._submit, NullHooks())
        self.wake = Wake(listen, ["q"], open_timeout=10.0)
        self.live_at = math.inf  # when the stream being opened answers
        self.ends_at = math.inf  # when the server ends the live stream

    def listen(self) -> None:
        now = self.now
        if self.wake.open_due(now, True):
            self.wake.opening(now)
            self.live_at = now + self.rtt
        if now >= self.live_at:
            self.live_at, self.ends_at = math.inf, now + self.lives_for
            for fact in self.wake.opened(now):
                self.flow.heard(fact, now)
            if self.floods and self.wake.traffic(now, FLOOD_BYTES + 1, 0):
                self.ends_at = math.inf
                for fact in self.wake.lost(now, "the events stream floods", flood="it floods"):
                    self.flow.heard(fact, now)
        if now >= self.ends_at:
            self.ends_at = math.inf
            for fact in self.wake.lost(now, "the server ended the events stream"):
                self.flow.heard(fact, now)
        for fact in self.wake.steady(now):
            self.flow.heard(fact, now)
        if self.members.heartbeat_due(now):  # answered at once: heartbeats are not counted
            self.members.send_heartbeat(now, current_jobs=0, status="healthy", procs=4, busy=0, children=4,
                                        cpu=0.0, mem=0.0)
        self.members.check_row_if_due(now)

    def _member_call(self, call, followup, first: bool = False) -> None:
        """Heartbeats and the worker row's reads, answered at once (the row shows this daemon)."""
        if call.route == "get_worker":
            self.row_reads += 1
            followup.answer({"metadata": dict(self.members.identity)}, None, self.now)
        else:
            followup.answer(None, None, self.now)

    def idle_for(self, span: float) -> int:
        """Requests sent (claims and the stream's connects) over `span` seconds of fake time."""
        end = self.now + span
        while self.now < end:
            self.listen()
            self.turn()
            times = [self.next_time(), self.live_at, self.ends_at, self.wake.next_deadline(self.now, True) or math.inf,
                     self.members.next_deadline() or math.inf, self.now + 1.0]
            self.now = max(self.now + 1e-6, min(times))
        return len(self.sent) + self.wake.connects + self.row_reads


def test_a_listening_idle_daemon_spends_at_most_a_tenth_of_a_request_a_second():
    daemon = IdleDaemon(listen=True, poll_interval=5.0, procs=4, rtt=0.02)
    requests = daemon.idle_for(HOUR)
    assert requests / HOUR <= BOUND, f"{requests} requests in an idle hour"
    assert daemon.wake.connects >= HOUR / MAX_STREAM, "the stream was reopened each time the server ended it"
    assert daemon.claims(), "the safety poll still claims now and then"
    assert HOUR / 60 <= daemon.row_reads <= HOUR / 45, "the worker row is read back about every 50 s"


@pytest.mark.parametrize("lives_for,floods", [(0.0, False), (5.0, False), (60.0, False), (0.0, True)],
                         ids=["closes-at-once", "closes-after-5s", "closes-after-a-minute", "floods"])
def test_a_misbehaving_stream_keeps_an_idle_daemon_under_the_bound(lives_for, floods, caplog):
    daemon = IdleDaemon(listen=True, poll_interval=5.0, procs=4, rtt=0.02, lives_for=lives_for, floods=floods)
    with caplog.at_level("DEBUG", logger="supervisor"):
        requests = daemon.idle_for(HOUR)
    assert requests / HOUR < BOUND, f"{requests} requests in an idle hour ({daemon.wake.connects} connects)"
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "the events stream misbehaves" in warnings[0], warnings  # said once, with why
    assert daemon.wake.suspect and daemon.flow.claiming.listening  # the safety poll finds jobs meanwhile


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
