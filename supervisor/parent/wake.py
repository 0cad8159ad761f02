"""Wake on work: while running, listen to the API's events stream and claim as soon as a job is created.

`Wake` decides, without I/O, from what it is told (`now` passed in): when to open the stream, that a
`job.created` event means "claim from this queue now" (`WorkCreated`), that the stream went live or
down (`Listening`: claiming re-checks every queue then, since events may have been missed, and
polls an empty queue only every SAFETY_POLL seconds while the stream is live), when a silent stream
is dead, and how long to wait before reopening (back-off). A server without the route (404/405) or a
key refused the queue (403) turns listening off for good, said once: the daemon polls as before.

A stream that misbehaves (floods: over FLOOD_BYTES or FLOOD_COMMENTS within FLOOD_WINDOW; or ends within
STEADY seconds of going live SHORT_LIVES times in a row, as one that answers 200 and closes at once does)
is backed off exponentially (from REOPEN_BASE, doubling) and, once found misbehaving, reopened only every
SUSPECT_REOPEN/2 to SUSPECT_REOPEN seconds, said once at WARNING with why. While it misbehaves it is a
`suspect`: its flaps tell claiming nothing, so claiming keeps polling empty queues at
the safety poll instead of re-checking every queue at each flap; once a stream stays live for STEADY
seconds it is trusted again (`Listening(True)`: every queue re-checked once).

`Listener` carries those decisions out on one `EventsConnection` (supervisor.client.events) in the
loop's selector; the arbiter calls `turn` every loop turn, `on_ready` when the socket is ready,
`next_deadline` for its wait, and `close` on exit. It listens only while the daemon may claim, so a
drain drops the stream.
"""

from __future__ import annotations

import json
import logging
import selectors
from collections.abc import Callable
from logging import DEBUG, INFO, WARNING

from supervisor import exitcodes
from supervisor.backoff import backoff
from supervisor.client.events import EventsConnection, events_path
from supervisor.client.transport import LoopTransport, Transport
from supervisor.config import Config
from supervisor.ops.logs import log_event
from supervisor.parent.facts import Fatal, Heard, Listening, WorkCreated

log = logging.getLogger("supervisor")

SAFETY_POLL = 15.0  # seconds between claims on an empty queue while the stream is live (at least --poll-interval)
SILENCE = 45.0  # seconds without a byte after which a live stream is dead (the server sends one every 10 s)
REOPEN_BASE, REOPEN_CAP = 0.5, 60.0  # back-off between attempts to open the stream
STEADY = 120.0  # seconds a stream must stay live to be trusted (real servers end one after 30 minutes)
SHORT_LIVES = 3  # streams in a row that end within STEADY: the stream misbehaves
SUSPECT_REOPEN = 300.0  # a misbehaving stream is reopened after 150-300 s (the safety poll finds jobs meanwhile)
FLOOD_WINDOW = 10.0  # seconds over which a stream's traffic is counted
FLOOD_BYTES = 1024 * 1024  # bytes within FLOOD_WINDOW beyond which a stream floods (a job.created is ~180)
FLOOD_COMMENTS = 100  # comment lines within FLOOD_WINDOW beyond which it floods (a server sends one per 10 s)
ADDRESS_WAIT = 0.2  # seconds between looks at whether the API's host name is resolved yet
CREATED = "job.created"


class Wake:
    """The stream's state: `off` (never, or given up), `down` (open at `reopen_at`), `opening`, `live`."""

    def __init__(self, enabled: bool, queues: list[str], open_timeout: float):
        self.state = "down" if enabled else "off"
        self.queues = set(queues)
        self.open_timeout = open_timeout  # seconds the server has to answer the stream's request
        self.reopen_at = 0.0
        self.failures = 0  # attempts in a row that did not go live
        self.connects = 0  # streams opened (each counts as a request)
        self.created_seen = 0  # job.created events for our queues
        self.lives = 0  # times the stream went live
        self.live_since = 0.0  # when the stream last went live
        self.suspect = False  # it misbehaved and has not stayed live for STEADY since: its flaps say nothing
        self.announced = False  # the last Listening told to claiming was live
        self.misbehaved = 0  # times a stream was found misbehaving
        self.short_lives = 0  # streams in a row that ended within STEADY of going live
        self.window_at = 0.0  # the start of the current FLOOD_WINDOW
        self.window_bytes = self.window_comments = 0

    @property
    def live(self) -> bool:
        return self.state == "live"

    def open_due(self, now: float, may_claim: bool) -> bool:
        return self.state == "down" and may_claim and now >= self.reopen_at

    def opening(self, now: float) -> None:
        self.state = "opening"
        self.connects += 1

    def dead(self, now: float, last_read_at: float) -> bool:
        """A stream that has said nothing for too long (opening: the API timeout; live: SILENCE)."""
        if self.state == "opening":
            return now - last_read_at > self.open_timeout
        return self.state == "live" and now - last_read_at > SILENCE

    def next_deadline(self, now: float, may_claim: bool) -> float | None:
        """When to open the stream: only while the daemon may claim (else nothing is due)."""
        return self.reopen_at if self.state == "down" and may_claim else None

    def unresolved(self, now: float) -> None:
        """The API's addresses are not known yet: try again shortly."""
        self.reopen_at = now + ADDRESS_WAIT

    def opened(self, now: float) -> list[Heard | Fatal]:
        self.state, self.live_since = "live", now
        self.window_at, self.window_bytes, self.window_comments = now, 0, 0
        self.lives += 1
        if self.suspect:  # trusted again only once it stays live (steady)
            log_event(log, DEBUG, "events stream open again; trusted once it stays up", streams=self.lives,
                      steady_secs=STEADY)
            return []
        if not self.short_lives:
            self.failures = 0  # (streams that keep ending soon keep doubling the back-off)
        log_event(log, INFO if self.lives == 1 else DEBUG, "listening for new jobs on the events stream",
                  streams=self.lives)
        return self._say(True)

    def steady(self, now: float) -> list[Heard | Fatal]:
        """Called while live: a suspect stream that stayed live for STEADY seconds is trusted again, and
        every queue is re-checked (events may have been missed while it flapped)."""
        if not (self.suspect and self.state == "live" and now - self.live_since >= STEADY):
            return []
        self.suspect, self.failures, self.short_lives = False, 0, 0
        log_event(log, INFO, "the events stream is steady again: listening for new jobs", steady_secs=STEADY)
        self.announced = True
        return [Listening(True)]

    def traffic(self, now: float, nbytes: int, comments: int) -> str | None:
        """Count what a read brought; why the stream floods (then close it and call `lost` with `flood`),
        or None."""
        if now - self.window_at > FLOOD_WINDOW:
            self.window_at, self.window_bytes, self.window_comments = now, 0, 0
        self.window_bytes += nbytes
        self.window_comments += comments
        if self.window_bytes > FLOOD_BYTES:
            return f"it sent over {FLOOD_BYTES} bytes within {FLOOD_WINDOW:.0f} s"
        if self.window_comments > FLOOD_COMMENTS:
            return f"it sent over {FLOOD_COMMENTS} comment lines within {FLOOD_WINDOW:.0f} s"
        return None

    def _say(self, live: bool) -> list[Heard | Fatal]:
        """Tell claiming the stream went live or down, if that is news to it."""
        if self.announced == live and not live:
            return []
        self.announced = live
        return [Listening(live)]

    def received(self, name: str, data: str, now: float) -> list[Heard | Fatal]:
        """A server-sent event: a job created on one of our queues means claim there now."""
        if name != CREATED:
            return []
        if len(self.queues) == 1 and not log.isEnabledFor(DEBUG):
            self.created_seen += 1  # the server filtered the stream by our one queue: no need to read it
            return [WorkCreated(next(iter(self.queues)))]
        try:
            envelope = json.loads(data)
            queue = envelope["data"]["queue_name"]
        except (ValueError, TypeError, KeyError):
            return [WorkCreated(None)]  # unreadable: look in every queue rather than miss the job
        if queue not in self.queues:
            return []
        self.created_seen += 1
        log_event(log, DEBUG, "job announced", job_id=envelope["data"].get("job_id"), queue=queue)
        return [WorkCreated(queue)]

    def lost(self, now: float, reason: str, flood: str | None = None) -> list[Heard | Fatal]:
        """The stream failed or ended: reopen after a back-off (short after a stream that was live and
        steady). One that floods (`flood` says why) or ended within STEADY of going live misbehaves: it
        backs off as a failed attempt would and becomes a suspect (see the module docstring)."""
        was_live = self.state == "live"
        lived = now - self.live_since if was_live else 0.0
        self.state = "down"
        short = was_live and lived < STEADY
        self.short_lives = self.short_lives + 1 if short else 0 if was_live else self.short_lives
        why = flood or (f"{self.short_lives} streams in a row ended within {STEADY:.0f} s, the last after "
                        f"{lived:.1f} s" if short and self.short_lives >= SHORT_LIVES else None)
        if was_live and not short:
            self.suspect = False  # a stream that stayed up long enough is trusted again
        self.failures = self.failures + 1 if flood or short or not was_live else 1
        wait = backoff(self.failures, REOPEN_BASE, REOPEN_CAP)
        if why is not None or self.suspect:
            wait = max(wait, backoff(2, SUSPECT_REOPEN / 2, SUSPECT_REOPEN))
        self.reopen_at = now + wait
        if why is not None and not self.suspect:
            self.suspect = True
            self.misbehaved += 1
            log_event(log, WARNING, f"the events stream misbehaves ({why}): reopening it every "
                                    f"{SUSPECT_REOPEN / 2:.0f}-{SUSPECT_REOPEN:.0f} s until one stays up "
                                    f"{STEADY:.0f} s; empty queues are polled every {SAFETY_POLL:.0f} s meanwhile",
                      error=reason, retry_in=round(wait, 2))
            return []
        quiet = was_live or self.suspect or self.failures > 3 and self.failures % 20 != 0
        log_event(log, DEBUG if quiet else WARNING, "events stream lost; reopening", error=reason,
                  retry_in=round(wait, 2), failures=self.failures)
        return [] if self.suspect else self._say(False) if was_live else []

    def refused(self, status: int, message: str, now: float) -> list[Heard | Fatal]:
        """The server answered the stream's request with `status`, not a stream. A 401 is the key's
        refusal, as on any route: fatal (stop claiming, deliver what is in flight, exit)."""
        if status == 401:
            self.state, self.reopen_at = "down", now + REOPEN_CAP
            return [Fatal(exitcodes.AUTH, f"401 on the events stream: {message}")]
        if status not in (403, 404, 405):
            return self.lost(now, f"{status}: {message}")
        was_live = self.state == "live"
        self.state = "off"
        why = "the API offers no events stream" if status != 403 else "the API key may not listen to these queues"
        log_event(log, WARNING, f"{why} ({status}): finding new jobs by polling", error=message)
        return [Listening(False)] if was_live else []

    def stopped(self, now: float) -> list[Heard | Fatal]:
        """The daemon may not claim now (draining, not registered): the stream is closed until it may."""
        if self.state != "off":
            self.state, self.reopen_at = "down", now
        self.suspect = False
        return self._say(False)


class Listener:
    """The events stream of the parent's loop: `Wake`'s decisions carried out on one connection."""

    def __init__(self, cfg: Config, connection: EventsConnection | None, addresses: Callable[[], list | None]):
        enabled = connection is not None and cfg.wake == "events"
        self.wake = Wake(enabled, list(cfg.queues), cfg.api_timeout)
        self.conn = connection
        self.addresses = addresses  # the API's resolved addresses (None until known)
        self.next_addr = 0
        if cfg.wake == "events" and connection is None:
            log_event(log, INFO, "no REST API to listen to for new jobs (--api-url): finding them by polling")

    @classmethod
    def for_loop(cls, cfg: Config, api: Transport, sel: selectors.BaseSelector, http: LoopTransport,
                 wake_fd: int) -> Listener:
        """The listener of the arbiter's loop, where the transport says the events stream is read."""
        source = api.events_source(http, wake_fd)
        if source is None:
            return cls(cfg, None, lambda: None)
        conn = EventsConnection(source.api, sel, events_path(source.api, list(cfg.queues)))
        return cls(cfg, conn, source.addresses)

    def stats(self) -> dict:
        """Plain data for the published snapshot: the stream's state, streams opened, jobs announced."""
        wake = self.wake
        return {"stream": wake.state, "connects": wake.connects, "jobs_announced": wake.created_seen,
                "suspect": wake.suspect, "misbehaved": wake.misbehaved}

    def turn(self, now: float, may_claim: bool) -> list[Heard | Fatal]:
        """Open, reopen or drop the stream as `Wake` says."""
        wake, conn = self.wake, self.conn
        if conn is None or wake.state == "off":
            return []
        if wake.state in ("opening", "live"):
            if not may_claim:
                conn.close()
                return wake.stopped(now)
            if wake.dead(now, conn.last_read_at):
                conn.close()
                return wake.lost(now, f"nothing from the events stream for {now - conn.last_read_at:.0f} s")
            return wake.steady(now)
        if not wake.open_due(now, may_claim):
            return []
        addrs = self.addresses()
        if not addrs:
            wake.unresolved(now)  # being looked up (by the loop's HTTP client or a Resolver)
            return []
        wake.opening(now)
        addr = addrs[self.next_addr % len(addrs)]
        return self._notes(conn.connect(addr, now), now)

    def on_ready(self, mask: int, now: float) -> list[Heard | Fatal]:
        """Read what the socket has (at most READ_BUDGET a turn); a stream that floods is closed."""
        conn = self.conn
        if conn is None:
            return []
        facts = self._notes(conn.on_ready(mask, now), now)
        nbytes, comments = conn.take_traffic()
        why = self.wake.traffic(now, nbytes, comments) if conn.open else None
        if why is not None:
            conn.close()
            self.next_addr += 1
            facts += self.wake.lost(now, "the events stream floods", flood=why)
        return facts

    def next_deadline(self, now: float, may_claim: bool) -> float | None:
        return self.wake.next_deadline(now, may_claim) if self.conn is not None else None

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()

    def _notes(self, notes: list[tuple], now: float) -> list[Heard | Fatal]:
        facts: list[Heard | Fatal] = []
        for note in notes:
            kind = note[0]
            if kind == "open":
                facts += self.wake.opened(now)
            elif kind == "event":
                facts += self.wake.received(note[1], note[2], now)
            elif kind == "refused":
                facts += self.wake.refused(note[1], note[2], now)
            elif kind == "lost":
                self.next_addr += 1
                facts += self.wake.lost(now, note[1])
        return facts
