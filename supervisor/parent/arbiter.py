"""The parent process: one loop that routes between the child pool, the job's parts (claiming, settling,
the in-flight table) and membership.

Signal handlers only record the signal, and the health port's thread records a drain request the
same way. Each turn the loop waits (select) on the children's sockets and sentinels, the API
connections and one wake-up pipe (written by signal handlers, drain requests and the
name-resolving helper thread) for at most the earliest deadline any part offers, then in
order: reads children, reaps the dead, acts on signals, takes API answers, enforces deadlines
(job timeouts, kills, lease renewals, memory, heartbeat), converges the pool, hands reserved jobs
to idle children, claims for the idle ones left, and checks the drain.

The arbiter owns the lifecycle (`Phase`) and sets the exit code in one place (`exit_with`). The parts
never call each other: their methods return facts (supervisor.parent.facts) that `route` hands on.
"""

from __future__ import annotations

import enum
import logging
import os
import selectors
import signal
import time
from collections.abc import Sequence
from logging import INFO, WARNING
from queue import SimpleQueue
from types import FrameType, MappingProxyType

from supervisor import __version__, exitcodes
from supervisor.client import rest as api
from supervisor.client.transport import BuiltCall, Transport
from supervisor.config import Config
from supervisor.ops.budget import stop_budget
from supervisor.ops.cgroup import MemorySource
from supervisor.ops.health import Published
from supervisor.ops.logs import log_event, scrub
from supervisor.ops.nullhooks import NullHooks
from supervisor.parent import orphans
from supervisor.parent.childproc import Child
from supervisor.parent.claiming import Claiming
from supervisor.parent.facts import (
    ChildLost,
    ChildReady,
    DrainAsked,
    ExitNow,
    Fact,
    Fatal,
    Followup,
    HandBack,
    JobDone,
    JobReissued,
    JobReturned,
    JobSettled,
    JobStarted,
    Listening,
    QueueFreed,
    RecallJob,
    Registered,
    RetryDue,
    ShedJob,
    StopJob,
    TakenOver,
    WorkCreated,
)
from supervisor.parent.inflight import InFlight
from supervisor.parent.membership import Membership
from supervisor.parent.memory import Level, MemoryPressure, Running
from supervisor.parent.pacer import Pacer
from supervisor.parent.pool import ChildPool, HandlerImportFailed
from supervisor.parent.settling import Settling
from supervisor.parent.wake import Listener

log = logging.getLogger("supervisor")

TITLE_EVERY = 0.2
PUBLISH_EVERY = 0.1  # seconds between two snapshots published for the health server's thread (and each phase change)
PRESSURE_CHECK_EVERY = 1.0  # seconds between two readings of the memory the daemon has
RELOAD_EXTEND = 30.0  # while a reload waits for busy children, systemd is asked for this much more, again and again
MAX_CONNECTIONS = 64  # kept-alive API connections at most
MAX_LOOP_ERRORS = 100  # turns in a row that raise: this will not mend itself, exit 1
LOOP_ERROR_PAUSE = 0.1  # seconds after a turn that raised, so a bug every turn does not spin a core
HANDLED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGTTIN, signal.SIGTTOU, signal.SIGCHLD)


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


class Phase(enum.Enum):
    """The daemon's stage; only the arbiter changes it (and publishes the change at once)."""

    STARTING = "starting"  # children coming up; not registered yet
    RUNNING = "running"  # registered (or re-registering); claiming
    DRAINING = "draining"  # a stop signal or a fatal error: no more claims, finishing what is held
    STOPPED = "stopped"  # the exit code is set; the loop ends


class Arbiter:
    """The parent's loop: waits on every part's sockets and deadlines, acts on signals, routes the facts the
    parts return (`route`), owns the phase and sets the exit code in one place (`exit_with`). It wires the
    parts and publishes their `stats()` as a frozen snapshot for the health server's thread."""

    def __init__(self, cfg: Config, client: Transport, hooks: NullHooks | None = None,
                 memory: MemorySource | None = None):
        self.cfg = cfg
        self.api = client
        self.hooks = hooks or NullHooks()
        self.phase = Phase.STARTING
        self.exit_code: int | None = None  # set by exit_with() only
        self.drain_code = exitcodes.OK  # the exit code once the drain ends
        self.drain_deadline: float | None = None
        self.announced_ready = False  # READY=1 sent
        self.logged_ready = False  # the `ready` line written
        self.ready_with = 0  # children up when it was
        self.reloads = 0
        self.reload_began: float | None = None  # the last SIGHUP, until every child is newer than it
        self.loop_errors = 0  # turns in a row that raised
        self.loop_at = time.monotonic()  # when the loop last turned (read by /healthz)
        self.started_at = self.loop_at
        self.children_up_at = self.loop_at  # when a child was last up (idle or busy), for /healthz
        self.signals: SimpleQueue = SimpleQueue()  # filled by signal handlers, emptied by the loop
        self.sel = selectors.DefaultSelector()
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)
        # Completes, claims and renewals overlap on kept-alive connections: with 50 ms answers, each
        # connection carries at most 20 requests/s, and 5 ms jobs on one child want 200 a second, so the
        # pool may grow to 8 connections a child (opened only while calls wait for one).
        self.http = client.loop_client(self.sel, self.wake_w, max_connections=min(MAX_CONNECTIONS, 8 + 8 * cfg.procs))
        self.pacer = Pacer(self._send, cfg.max_rps)  # the request budget in front of the HTTP client
        self.memory = memory if memory is not None else MemorySource.detect()
        self.pressure = MemoryPressure(Level(*cfg.memory_high), Level(*cfg.memory_max))
        self.next_pressure_check = 0.0
        self.pool = ChildPool(cfg, self.sel, self.hooks, memory=self.memory)
        self.inflight = InFlight(cfg.lease)  # every job this worker holds; Claiming fills it, Settling empties it
        self.claiming = Claiming(cfg, client, self.submit, self.hooks, self.inflight)
        self.settling = Settling(cfg, client, self.submit, self.hooks, self.inflight)
        self.membership = Membership(cfg, client, self.submit)
        self.listener = Listener.for_loop(cfg, client, self.sel, self.http, self.wake_w)
        self._title = ""
        self.next_title_at = 0.0
        self.next_publish_at = 0.0
        self.published_phase = self.phase  # the phase in the published snapshot
        self.publish_stale = False  # a turn since the last publish: publish again by next_publish_at
        self.publish_at_turn_end = False  # a child died: publish at the end of this turn
        self.published: Published  # the frozen snapshot the health server's thread reads (set by publish)
        self.publish(self.loop_at)

    # ------------------------------------------------------------------ entry
    def run(self) -> int:
        """Run until drained or stopped; return the process exit code. The caller has started the
        forkserver (`forkservers.start_forkserver`) before any thread of this process exists."""
        for sig in HANDLED_SIGNALS:
            signal.signal(sig, self._on_signal)
        signal.set_wakeup_fd(self.wake_w, warn_on_full_buffer=False)
        self.sel.register(self.wake_r, selectors.EVENT_READ, ("wake", None))
        log_event(log, INFO, "supervisor starting", worker_id=self.cfg.worker_id, queue=",".join(self.cfg.queues),
                  procs=self.pool.target, procs_source=self.cfg.procs_source, handler=self.cfg.handler,
                  api_url=self.cfg.api_url, prefetch="auto" if self.cfg.prefetch is None else self.cfg.prefetch,
                  max_rps=self.cfg.max_rps, version=__version__,
                  **({"queue_from": self.cfg.queue_source} if self.cfg.queue_source else {}))
        budget = stop_budget(self.cfg.drain_timeout, self.cfg.kill_grace, self.cfg.api_timeout)
        log_event(log, INFO, "stop budget: a stop takes at most this long; give TimeoutStopSec or "
                             "terminationGracePeriodSeconds more", **budget.fields(),
                  stop_budget_with_drain_request_secs=round(stop_budget(
                      self.cfg.drain_timeout, self.cfg.kill_grace, self.cfg.api_timeout, drain_request=True).total, 1))
        self.pool.converge(time.monotonic(), stopping_for_good=False)
        try:
            while self.exit_code is None:
                try:
                    self.turn()
                    self.loop_errors = 0
                except Exception:  # a bug must not take down the jobs in flight; log it and go on
                    log.exception("unexpected error in the main loop; carrying on")
                    self.loop_errors += 1
                    if self.loop_errors > MAX_LOOP_ERRORS:
                        raise
                    time.sleep(LOOP_ERROR_PAUSE)
        finally:
            self.pool.shutdown()
            signal.set_wakeup_fd(-1)
            self.listener.close()
            self.http.close()
        return self.exit_code

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.signals.put_nowait(signum)

    def ask_drain(self) -> None:
        """Ask for a drain that hands the reserve back (from the health port's thread): queued like a signal."""
        self.signals.put_nowait("DRAIN")
        try:
            os.write(self.wake_w, b"d")
        except BlockingIOError:
            pass  # the pipe is full: the loop is waking anyway

    def turn(self) -> None:
        """One pass of the loop (see the module docstring for the order)."""
        now = time.monotonic()
        timeout = max(0.0, min(self.next_wakeup(now), now + 1.0) - now)
        for key, mask in self.sel.select(timeout):
            self.on_event(key.data, mask)
        now = time.monotonic()
        self.loop_at = now
        self.handle_signals(now)
        self.http.expire(now)
        self.take_answers(now)
        self.route(self.listener.turn(now, self.may_claim()), now)
        self.pacer.release(now)
        self.membership.register_if_due(now, self.pool.target)
        self.membership.check_row_if_due(now)
        self.route(self.settling.enforce(now), now)
        self.route(self.pool.enforce(now), now)
        self.check_memory(now)
        self.send_heartbeat(now)
        if self.exit_code is not None:
            return
        self.pool.converge(now, stopping_for_good=self.stopping_for_good())
        if any(c.idle or c.busy for c in self.pool.children.values()):
            self.children_up_at = now
        self.feed_children(now)
        self.check_reload(now)
        self.check_drain(now)
        self.update_title(now)
        self.publish_if_due(now)
        self.hooks.tick(now)

    def on_event(self, data: tuple, mask: int) -> None:
        """A selector event; `data` is (source, object) as registered: the wake pipe, a child's socket or
        sentinel, or an API connection."""
        source, obj = data
        if source == "wake":
            self._drain_wake()
        elif source == "chan":
            if mask & selectors.EVENT_WRITE:
                self.pool.flush(obj)
            if mask & selectors.EVENT_READ:
                self.route(self.pool.read(obj, time.monotonic()), time.monotonic())
        elif source == "sentinel":
            self.reap(obj, time.monotonic())
        elif source == "http":
            self.http.on_ready(obj, mask, time.monotonic())
        elif source == "events":
            self.route(self.listener.on_ready(mask, time.monotonic()), time.monotonic())

    def next_wakeup(self, now: float) -> float:
        """The earliest deadline of any part (never later than a second from now)."""
        idle = self.pool.idle_count()
        may_claim = self.may_claim()
        claim_gate = self.pacer.claim_ready_at(now) if may_claim else 0.0
        times = [now + 1.0, self.pool.next_deadline(now), self.settling.next_deadline(),
                 self.claiming.next_deadline(now, may_claim, idle, claim_gate),
                 self.membership.next_deadline(), self.http.next_deadline(), self.drain_deadline,
                 self.pacer.next_deadline(now), self.listener.next_deadline(now, may_claim)]
        if self.next_title_at > now:
            times.append(self.next_title_at)
        if self.http.has_answers():
            times.append(now)
        if self.publish_stale:
            times.append(self.next_publish_at)
        return min(t for t in times if t is not None)

    def _drain_wake(self) -> None:
        try:
            while os.read(self.wake_r, 4096):
                pass
        except BlockingIOError:
            pass

    def submit(self, call: api.Call, followup: Followup, first: bool = False) -> None:
        """Send an API call within the request budget; its answer goes to `followup` (see take_answers)."""
        self.pacer.submit(call, followup, first, time.monotonic())

    def _send(self, call: BuiltCall, followup: Followup, first: bool) -> None:
        self.http.submit(followup, call, first)

    # ---------------------------------------------------------------- routing
    def take_answers(self, now: float) -> None:
        """Hand each finished API call to its followup; one that raises is logged and recovered, not lost."""
        for followup, result, error in self.http.done():
            if error is None or not isinstance(error, api.Unavailable):
                self.membership.api_answered(now)
            if isinstance(error, api.RateLimited):
                self.pacer.rate_limited(now, error.retry_after, _number(error.body.get("limit")))
            try:
                facts = followup.answer(result, error, now)
            except Exception:
                log.exception("error handling an API answer; recovering")
                facts = followup.recover(now)
            self.route(facts, now)

    def route(self, facts: Sequence[Fact] | None, now: float) -> None:
        """Hand each fact to the part that acts on it, and route in turn whatever that part returns: the
        job's facts here, the children's and memory's in `route_to_pool`, the lifecycle's in `route_lifecycle`."""
        if not facts:
            return
        for fact in facts:
            match fact:
                case JobDone():
                    self.route(self.settling.job_done(fact, now), now)
                case QueueFreed():
                    self.claiming.gave_work(fact.queue, now, fact.duration)
                case JobStarted():
                    self.route(self.claiming.job_started(fact, now), now)
                case JobReturned():
                    self.claiming.job_returned(fact, now)
                case ChildLost():
                    self.settling.child_lost(fact, now)
                case JobReissued():
                    self.route(self.settling.lease_lost(fact.old, "the server handed this job out again under a new "
                                                                  "lease", now), now)
                case RetryDue():
                    self.claiming.retry_due(fact.queue, fact.at)
                case WorkCreated() | Listening():
                    self.claiming.heard(fact, now)
                case _:
                    self.route_to_pool(fact, now)

    def route_to_pool(self, fact: Fact, now: float) -> None:
        """The facts that stop or recall a child's job (see `route`)."""
        match fact:
            case RecallJob():
                self.pool.recall_job(fact.slot, fact.job_id)
            case JobSettled():
                self.pool.tell_settled(fact)
            case StopJob():
                self.pool.stop_job_child(fact.slot, fact.job_id, fact.reason, now)
            case HandBack():
                self.settling.hand_back_reserved(fact.error, now)
            case ShedJob():
                self.pool.stop_job_child(fact.slot, fact.job_id, "memory_pressure", now)
                self.settling.child_lost(ChildLost(fact.slot, fact.error, "failed"), now)
            case _:
                self.route_lifecycle(fact, now)

    def route_lifecycle(self, fact: Fact, now: float) -> None:
        """The facts that change the daemon's phase or membership (see `route`); any other is a bug, said loudly."""
        match fact:
            case ChildReady():
                self.child_ready(fact, now)
            case Registered():
                self.phase = Phase.RUNNING if self.phase is Phase.STARTING else self.phase
                self.publish(now)
                self.announce_ready_if_up()
            case Fatal():
                self.fatal(fact, now)
            case ExitNow():
                self.exit_with(fact.code)
            case TakenOver():
                self.drain_with(now, exitcodes.WORKER_ID_IN_USE)
            case DrainAsked():
                self.begin_drain(now, exitcodes.OK)
            case _:
                log_event(log, logging.ERROR, "a fact no part acts on (a bug in the daemon); dropped",
                          fact=scrub(repr(fact))[:300])

    def reap(self, child: Child, now: float) -> None:
        """A child's sentinel fired: the pool reaps it (its job fails); /status shows it at the end of this turn."""
        self.publish_at_turn_end = True
        try:
            self.route(self.pool.reap(child, now), now)
        except HandlerImportFailed as exc:
            log_event(log, logging.ERROR, f"cannot import handler {self.cfg.handler}: {exc}")
            self.exit_with(exitcodes.HANDLER_IMPORT)

    def child_ready(self, fact: ChildReady, now: float) -> None:
        if fact.first:
            self.membership.register(self.pool.target, now)
        self.announce_ready_if_up()

    def feed_children(self, now: float) -> None:
        """Hand reserved jobs to idle children (not under memory pressure), send the outcomes recorded this
        turn, claim for the children that are idle or soon will be (the pacer puts outcomes ahead of
        claims), then send busy children their next job ahead while running (never during a drain or
        under memory pressure, which asks the held ones back)."""
        for child, entry in self.claiming.assignments([] if self.pressure.paused else self.pool.idle_children()):
            if self.pool.give_job(child, entry.job):
                self.claiming.started(entry, child, now)
        self.settling.send_reports()
        self.claiming.maybe_claim(now, self.pool.idle_count(), self.pool.target, self.may_claim(),
                                  self.pacer.allows_claim(now), self.pacer.rate)
        if self.pressure.paused:
            self.route(self.claiming.recall_held(), now)  # no child starts a job on its own under pressure
        elif self.phase is Phase.RUNNING:
            for child, entry in self.claiming.holds(self.pool.holding_children(), now):
                if self.pool.hold_job(child, entry.job, self.claiming.start_by(entry)):
                    self.claiming.hold(entry, child)

    def may_claim(self) -> bool:
        return self.membership.registered and self.phase is Phase.RUNNING and not self.pressure.paused

    def check_memory(self, now: float) -> None:
        """Every PRESSURE_CHECK_EVERY, read the memory the daemon has and act on the pressure part's say."""
        if now < self.next_pressure_check:
            return
        self.next_pressure_check = now + PRESSURE_CHECK_EVERY
        running = []
        for child in list(self.pool.children.values()):
            entry = self.inflight.get(child.job_id) if child.busy else None
            if entry is not None and entry.started_at is not None:
                running.append(Running(child.slot, entry.id, entry.started_at))
        self.route(self.pressure.observe(self.memory.read(), now, self.claiming.reserved(), running), now)

    def stopping_for_good(self) -> bool:
        return self.exit_code is not None or (self.phase is Phase.DRAINING and not self.inflight.jobs)

    # ---------------------------------------------------------------- signals
    def handle_signals(self, now: float) -> None:
        """Act on the signals (and drain requests) recorded since the last turn, by name: handle_SIGTERM,
        handle_DRAIN and so on."""
        while not self.signals.empty():
            item = self.signals.get_nowait()
            getattr(self, f"handle_{item if isinstance(item, str) else signal.Signals(item).name}")(now)

    def handle_SIGTERM(self, now: float, name: str = "SIGTERM") -> None:
        if self.phase is Phase.DRAINING:
            log_event(log, WARNING, "second stop signal: stopping at once", signal=name)
            self.pool.kill_all()
            self.exit_with(self.drain_code)
        else:
            log_event(log, INFO, "stop signal: draining", signal=name, inflight=len(self.inflight),
                      drain_timeout=self.cfg.drain_timeout)
            self.begin_drain(now, exitcodes.OK)

    def handle_DRAIN(self, now: float) -> None:
        """A drain request (`python -m supervisor drain`, e.g. a pod's preStop hook): stop claiming, start no
        more reserved jobs, let the running ones finish within the drain timeout, then deregister, which hands
        the reserve (and anything still running at the deadline) back to the queue unaltered, and exit. A stop
        signal that comes after it stops at once."""
        log_event(log, INFO, "drain requested: no more claims or starts; reserved jobs go back to the queue when "
                             "the running ones are done", running=len(self.inflight) - self.claiming.reserved(),
                  reserved=self.claiming.reserved(), drain_timeout=self.cfg.drain_timeout)
        self.claiming.stop_starting()
        self.begin_drain(now, exitcodes.OK)

    def handle_SIGINT(self, now: float) -> None:
        self.handle_SIGTERM(now, "SIGINT")

    def handle_SIGHUP(self, now: float) -> None:
        self.reloads += 1
        log_event(log, INFO, "SIGHUP: replacing children one at a time", reload=self.reloads)
        self.pool.reload()
        if self.announced_ready and self.phase is Phase.RUNNING:  # before READY=1 the start covers it
            self.reload_began = now
            self.hooks.reloading(now)

    def check_reload(self, now: float) -> None:
        """READY=1 again once every child was started after the last SIGHUP (a drain ends the reload)."""
        if self.reload_began is None:
            return
        if self.phase is not Phase.RUNNING:
            self.reload_began = None
        elif self.pool.all_up_since(self.reload_began):
            self.reload_began = None
            log_event(log, INFO, "reload complete: every child runs the reloaded handler", reload=self.reloads)
            self.hooks.ready(self.status_line())
        elif not self.pool.degraded(now):  # a busy child is replaced once its job ends, however long that takes
            self.hooks.extend_timeout(now, RELOAD_EXTEND)  # (but new code that fails to start lets systemd time out)

    def handle_SIGTTIN(self, now: float) -> None:
        log_event(log, INFO, "SIGTTIN: one more child", procs=self.pool.resize(+1))

    def handle_SIGTTOU(self, now: float) -> None:
        log_event(log, INFO, "SIGTTOU: one child fewer", procs=self.pool.resize(-1))

    def handle_SIGCHLD(self, now: float) -> None:
        """A process we adopted as subreaper (it escaped its child's group) exited: reap it. Children
        proper are reaped through their sentinels; multiprocessing's helpers are never touched."""
        orphans.reap_adopted()

    # ---------------------------------------------------------------- lifecycle
    def fatal(self, fact: Fatal, now: float) -> None:
        """An error the daemon cannot work past (401): stop claiming, deliver what is in flight, exit."""
        log_event(log, logging.ERROR, f"stopping: {exitcodes.NAMES.get(fact.code, fact.code)}", error=fact.error)
        if not self.membership.registered:
            self.exit_with(fact.code)
        else:
            self.drain_with(now, fact.code)

    def drain_with(self, now: float, code: int) -> None:
        """Drain (if not draining already) and exit with `code` once drained."""
        if self.phase is Phase.DRAINING:
            self.drain_code = code
        else:
            self.begin_drain(now, code)

    def begin_drain(self, now: float, code: int) -> None:
        if self.phase in (Phase.DRAINING, Phase.STOPPED):
            return
        self.phase = Phase.DRAINING
        self.publish(now)
        self.drain_code = code
        self.drain_deadline = now + self.cfg.drain_timeout
        self.hooks.stopping()
        self.membership.heartbeat_soon(now)  # tell the API `draining` now
        self.route(self.claiming.recall_held(), now)  # held jobs come back, to be handled as reserved ones

    def check_drain(self, now: float) -> None:
        if self.cfg.until_empty and self.phase is Phase.RUNNING and self.claiming.exhausted():
            log_event(log, INFO, "queues empty and no job in flight: stopping (--until-empty)",
                      queues=",".join(self.cfg.queues))
            self.begin_drain(now, exitcodes.OK)
        if self.phase is not Phase.DRAINING:
            return
        if self.drain_deadline is not None:
            self.hooks.extend_timeout(now, self.drain_deadline - now + self.stop_after_drain())
        if not self.membership.registered and self.membership.register_at is not None:
            log_event(log, WARNING, "draining while not registered: stopping")
            self.exit_with(self.drain_code)
        elif self.claiming.drained():
            log_event(log, INFO, "drained: no job in flight")
            self.exit_with(self.drain_code)
        elif self.drain_deadline is not None and now >= self.drain_deadline:
            busy = list(self.inflight.jobs)
            log_event(log, WARNING, "drain timeout: stopping busy children; deregistering hands their jobs back "
                                    "to the queue", jobs=busy)
            self.exit_with(self.drain_code)

    def stop_after_drain(self) -> float:
        """The longest `exit_with` may block: stopping the children (kill grace, then a SIGKILL's reaping) and
        two deregister attempts (supervisor.ops.budget)."""
        return stop_budget(self.cfg.drain_timeout, self.cfg.kill_grace, self.cfg.api_timeout).after_drain

    def exit_with(self, code: int) -> None:
        """Stop children, deregister (which releases any job still held) and set the exit code. The
        deregister blocks the loop, bounded: two attempts of at most DEREGISTER_TIMEOUT each, so a stop
        fits systemd's TimeoutStopSec; nothing else is left to serve by then."""
        if self.exit_code is not None:
            return
        self.pool.shutdown()
        self.membership.deregister()
        self.phase = Phase.STOPPED
        self.exit_code = code
        self.publish(time.monotonic())
        log_event(log, INFO, "supervisor stopped", exit_code=code)

    def announce_ready_if_up(self) -> None:
        """The `ready` line once registered (a child is up: the first claim can be made, jobs or not), and
        READY=1 once every child is up too, with an `every child is up` line when that came later (each once)."""
        if not self.membership.registered:
            return
        up = sum(1 for c in self.pool.children.values() if not c.starting)
        if not self.logged_ready:
            self.logged_ready = True
            log_event(log, INFO, "ready", worker_id=self.cfg.worker_id, children=up, procs=self.pool.target)
            self.ready_with = up
        if self.announced_ready or not self.pool.all_up():
            return
        self.announced_ready = True
        if up > self.ready_with:
            log_event(log, INFO, "every child is up", children=up)
        self.hooks.ready(self.status_line())

    # ------------------------------------------------------------ heartbeat
    def send_heartbeat(self, now: float) -> None:
        """When one is due: the heartbeat, from the pool's, the table's and the memory's plain values."""
        if not self.membership.heartbeat_due(now):
            return
        cpu, mem = self.pool.tree_usage()
        self.membership.send_heartbeat(now, current_jobs=len(self.inflight), status=self.worker_status(now),
                                       procs=self.pool.target, busy=self.pool.busy_count(),
                                       children=len(self.pool.children), cpu=cpu, mem=mem,
                                       memory=self.pressure.heartbeat_fields())

    def worker_status(self, now: float | None = None) -> str:
        """`draining`, `degraded` while children are crash-looping, else `healthy`."""
        if self.phase is Phase.DRAINING:
            return "draining"
        return "degraded" if self.pool.degraded(time.monotonic() if now is None else now) else "healthy"

    # ----------------------------------------------------------- observation
    def status_line(self) -> str:
        pool = self.pool
        text = f"queue={self.cfg.first_queue} busy={pool.busy_count()}/{pool.target} inflight={len(self.inflight)}"
        text += " reloading" if self.reload_began is not None else ""
        return text + (" draining" if self.phase is Phase.DRAINING else "")

    def update_title(self, now: float) -> None:
        """Refresh the process title (and systemd STATUS) at most every TITLE_EVERY seconds."""
        if now < self.next_title_at:
            return
        title = f"spooled-supervisor: parent {self.status_line()}"
        if title != self._title:
            self._title = title
            self.next_title_at = now + TITLE_EVERY
            self.hooks.status(title)

    def publish(self, now: float) -> None:
        """Publish a frozen snapshot of the daemon, built from each part's plain `stats()`, for the health
        server's thread (/status, /healthz) and the gauges: every PUBLISH_EVERY seconds of turns, and at once
        when the phase changes. Its ages are computed when it is read (`snapshot`)."""
        self.next_publish_at = now + PUBLISH_EVERY
        self.publish_stale = self.publish_at_turn_end = False
        pool, members, inflight = self.pool.stats(), self.membership.stats(), self.inflight.stats()
        claiming, settled, pacer = self.claiming.stats(), self.settling.stats()["jobs_settled"], self.pacer.stats()
        rows = pool["children"]
        started_at = inflight["started_at"]
        fields = {
            "worker_id": self.cfg.worker_id, "queue": self.cfg.first_queue, "pid": os.getpid(), "version": __version__,
            "registered": members["registered"], "draining": self.phase is Phase.DRAINING,
            "status": self.worker_status(now), "phase": self.phase.value,
            "loop_age_secs": None, "api_age_secs": None, "api_silence_secs": None, "children_down_secs": None,
            "procs": pool["procs"], "busy": sum(1 for row in rows if row["state"] == "busy"),
            "inflight": inflight["inflight"], "reserved": claiming["reserved"], "held": claiming["held"],
            "queues": claiming["queues"], "requests_sent": pacer["requests_sent"], "jobs_settled": settled,
            "requests_per_job": round(pacer["requests_sent"] / settled, 3) if settled else None,
            "rate_limit_rps": pacer["rate_limit_rps"], "rate_limited_answers": pacer["rate_limited_answers"],
            "claim_rtt_ms": claiming["claim_rtt_ms"], "reserve_wait_ms": claiming["reserve_wait_ms"],
            "memory": {**self.pressure.stats(), "oom_kills": pool["oom_kills"], "preload": self.cfg.preload},
            "wake": self.listener.stats(), "children": None, "failing": pool["failing"],
        }
        children = tuple((row, started_at.get(row["job_id"])) for row in rows)
        self.published = Published(MappingProxyType(fields), children, self.loop_at, self.started_at,
                                   members["api_ok_at"], self.children_up_at)
        self.published_phase = self.phase

    def publish_if_due(self, now: float) -> None:
        """At a turn's end: publish if PUBLISH_EVERY has passed, a child died or the phase changed; else leave
        it for the wake-up at `next_publish_at` (next_wakeup), so what this turn changed shows within it."""
        if now >= self.next_publish_at or self.publish_at_turn_end or self.phase is not self.published_phase:
            self.publish(now)
        else:
            self.publish_stale = True

    def snapshot(self) -> dict:
        """/status's document from the snapshot the loop last published, its ages as of now (called from the
        health server's thread: it reads one reference and touches no part)."""
        return self.published.status(time.monotonic())
