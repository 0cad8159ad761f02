"""In-process tests of the child pool's decisions: starting, reaping, respawn back-off, resizing,
reloading, recycling, memory caps and kill escalation.

No process is started: `spawn_child` hands out fake children (a fake proc and channel), `signal_child`
records, and a fake selector records what is watched. The clock is plain floats.
"""

from __future__ import annotations

import selectors
import signal

import pytest
from support.parent_fakes import MiB
from support.pool_rig import T0, Rig

from supervisor.ops.procmem import TreeMemory
from supervisor.parent.childproc import ChildState
from supervisor.parent.facts import ChildLost, ChildReady, JobDone
from supervisor.parent.pool import BOOT_TIMEOUT, CONVERGE_EVERY, MAX_PROCS, HandlerImportFailed

TERM, KILL = signal.SIGTERM, signal.SIGKILL


@pytest.fixture
def rig(monkeypatch) -> Rig:
    return Rig(monkeypatch)


# ------------------------------------------------------------------ starting

def test_converge_starts_every_missing_slot_and_watches_it(rig):
    rig.converge(T0)
    assert sorted(rig.spawner.slots()) == [0, 1]
    for child in rig.spawner.spawned:
        assert rig.sel.events_of(child.chan.sock) == selectors.EVENT_READ
        assert rig.sel.events_of(child.proc.sentinel) == selectors.EVENT_READ
    assert not rig.pool.all_up()  # still starting
    rig.converge(T0 + 0.01)  # nothing changed and not yet time: no work
    assert len(rig.spawner.spawned) == 2


def test_ready_frames_make_children_idle_and_the_first_one_says_so(rig):
    rig.converge(T0)
    first, second = rig.spawner.spawned
    assert rig.ready(first) == [ChildReady(first.slot, True)]
    assert rig.ready(second) == [ChildReady(second.slot, False)]
    assert rig.pool.all_up() and len(rig.pool.idle_children()) == 2


def test_stopping_for_good_starts_nothing(rig):
    rig.converge(T0, stopping=True)
    assert rig.spawner.spawned == []


def test_a_child_that_cannot_be_started_is_retried_after_a_back_off(rig):
    rig.spawner.fail = True
    rig.converge(T0)
    assert rig.pool.children == {}
    assert all(T0 + 0.25 <= rig.pool.respawn_at[s] <= T0 + 0.5 for s in (0, 1))
    rig.spawner.fail = False
    rig.pool.resize(0)  # something changed: converge looks at once
    rig.converge(T0 + 0.249)
    assert rig.spawner.spawned == []
    rig.converge(T0 + 0.5)
    assert sorted(rig.pool.children) == [0, 1]


# ------------------------------------------------------------------ reaping

def test_a_crash_is_a_lost_child_counted_and_restarted_at_once(rig):
    a, b = rig.up()
    rig.give(a)
    facts = rig.exit(a, -KILL, T0 + 5)
    assert len(facts) == 1 and isinstance(facts[0], ChildLost)
    assert facts[0].slot == a.slot and facts[0].outcome == "crashed"
    assert facts[0].error == f"ChildProcessDied: the child process running this job (pid {a.pid}) killed by signal 9 " \
                             "(not by the daemon); possibly out of memory"
    assert rig.pool.restarts == {a.slot: 1} and ("child_restarted", "crashed") in rig.hooks.events
    assert a.slot not in rig.pool.children and a.chan.closed and a.proc.closed
    assert rig.sel.events_of(a.chan.sock) is None and rig.sel.events_of(a.proc.sentinel) is None
    assert rig.pool.next_deadline(T0 + 5) == T0 + 5  # converge must look at it now
    rig.converge(T0 + 5)
    assert rig.pool.children[a.slot] is rig.spawner.spawned[-1] and rig.pool.children[a.slot] is not a


def test_reaping_a_child_stops_what_is_left_of_its_process_group_before_a_new_child_starts(rig):
    a, _ = rig.up()
    rig.exit(a, 0, T0 + 1)
    assert rig.signals.groups_killed == [a.slot] and a.slot not in rig.pool.children
    rig.converge(T0 + 1)
    assert rig.pool.children[a.slot] is not a


def test_a_result_sent_just_before_dying_still_counts(rig):
    a, _ = rig.up()
    rig.give(a, "j1")
    a.chan.inbox.append({"t": "done", "id": "j1", "ok": True, "result": {"v": 1}})
    facts = rig.exit(a, 1, T0 + 1)
    assert facts[0] == JobDone(a.slot, "j1", True, {"v": 1}) and isinstance(facts[1], ChildLost)


def test_reaping_a_child_twice_does_nothing(rig):
    a, _ = rig.up()
    rig.exit(a, -KILL, T0 + 1)
    assert rig.pool.reap(a, T0 + 2) == []
    assert rig.pool.restarts == {a.slot: 1}


def test_three_crashes_within_a_minute_mean_degraded(rig):
    rig.up()
    for n, at in enumerate((T0 + 10, T0 + 20, T0 + 30)):
        assert not rig.pool.degraded(at)
        child = rig.pool.children[0]
        rig.exit(child, -signal.SIGSEGV, at)
        rig.converge(at)
        rig.ready(rig.pool.children[0], at)
        assert rig.pool.restarts[0] == n + 1
    assert rig.pool.degraded(T0 + 30) and rig.pool.degraded(T0 + 69.9)
    assert not rig.pool.degraded(T0 + 70.1)  # the first crash is over a minute old
    assert [e for e in rig.hooks.events if e[0] == "child_restarted"] == [("child_restarted", "crashed")] * 3


def test_stops_the_pool_asked_for_are_no_crash(rig):
    a, b = rig.up()
    rig.give(a)
    rig.pool.stop_job_child(a.slot, "a", "timeout", T0 + 1)
    facts = rig.exit(a, -TERM, T0 + 1.5)
    assert [f.outcome for f in facts] == ["crashed"]  # the job flow has already failed the job on that slot
    assert ("child_restarted", "timeout") in rig.hooks.events and rig.pool.recent_crashes == []
    b.begin_stop("reload", T0 + 2, 3.0, graceful=True)
    rig.exit(b, 0, T0 + 2.5)
    assert ("child_restarted", "reload") in rig.hooks.events and not rig.pool.degraded(T0 + 3)


def test_a_child_that_exits_while_starting_backs_off_doubling_up_to_30_s(rig):
    rig.up()  # some child has been ready: boot failures are not an import error
    rig.exit(rig.pool.children[0], -KILL, T0)  # a crash; its replacement is starting
    now = T0
    rig.converge(now)
    for failures in range(1, 10):
        child = rig.pool.children[0]
        rig.exit(child, 3, now)
        delay = rig.pool.respawn_at[0] - now
        top = min(30.0, 0.5 * 2 ** (failures - 1))
        assert top / 2 <= delay <= top and rig.pool.boot_failures[0] == failures
        before = len(rig.spawner.spawned)
        rig.converge(now)
        rig.converge(now + CONVERGE_EVERY * 0.999)
        rig.pool.resize(0)  # something changed: converge looks again
        rig.converge(rig.pool.respawn_at[0] - 0.001)
        assert len(rig.spawner.spawned) == before, "started before its back-off"
        due = rig.pool.next_deadline(now + 0.001)  # what the loop sleeps until
        assert due >= rig.pool.respawn_at[0]
        now = due
        rig.converge(now)
        assert len(rig.spawner.spawned) == before + 1
    assert rig.pool.degraded(now) and ("child_restarted", "boot_failed") in rig.hooks.events
    rig.ready(rig.pool.children[0], now)
    assert rig.pool.boot_failures == {}


def test_the_first_child_failing_to_import_the_handler_is_fatal(rig):
    rig.converge(T0)
    child = rig.spawner.spawned[0]
    child.chan.inbox.append({"t": "boot_error", "error": "Traceback ...\nModuleNotFoundError: No module named 'x'"})
    with pytest.raises(HandlerImportFailed, match="ModuleNotFoundError"):
        rig.exit(child, 3, T0 + 0.5)


def test_a_first_child_dying_at_start_without_a_boot_error_backs_off(rig):
    rig.converge(T0)
    child = rig.spawner.spawned[0]
    facts = rig.exit(child, -KILL, T0 + 0.5)
    assert isinstance(facts[0], ChildLost) and rig.pool.boot_failures == {child.slot: 1}


def test_a_child_not_ready_in_time_is_killed(rig):
    rig.converge(T0)
    rig.ready(rig.spawner.spawned[1])
    slow = rig.spawner.spawned[0]
    rig.converge(T0 + BOOT_TIMEOUT)
    assert rig.signals.sent == []
    rig.converge(T0 + BOOT_TIMEOUT + CONVERGE_EVERY)
    assert rig.signals.sent == [(slow.slot, TERM), (slow.slot, KILL)] and slow.stop_reason == "boot_failed"
    rig.exit(slow, -KILL, T0 + BOOT_TIMEOUT + 1)
    assert rig.pool.boot_failures == {slow.slot: 1}


def test_eof_on_a_channel_stops_watching_it(rig):
    a, _ = rig.up()
    a.chan.eof = True
    assert rig.pool.read(a, T0) == []
    assert rig.sel.events_of(a.chan.sock) is None and rig.sel.events_of(a.proc.sentinel) is not None


# ------------------------------------------------------------------ jobs on children

def test_give_job_sends_the_job_and_marks_the_child_busy(rig):
    a, _ = rig.up()
    rig.give(a, "j1")
    assert a.chan.sent == [{"t": "job", "job": {"id": "j1", "lease_id": "L"}}]
    assert a.busy and a.job_id == "j1" and rig.pool.busy_count() == 1 and a not in rig.pool.idle_children()


def test_give_job_to_a_dead_socket_fails_and_leaves_the_child_idle(rig):
    a, _ = rig.up()
    a.chan.broken = True
    assert not rig.pool.give_job(a, {"id": "j1"})
    assert a.idle and a.job_id is None


def test_a_frame_still_going_out_is_watched_for_writability_until_flushed(rig):
    a, _ = rig.up()
    a.chan.wants_write = True
    rig.give(a)
    assert rig.sel.events_of(a.chan.sock) == selectors.EVENT_READ | selectors.EVENT_WRITE
    a.chan.wants_write = False
    rig.pool.flush(a)
    assert rig.sel.events_of(a.chan.sock) == selectors.EVENT_READ


def test_flushing_to_a_dead_child_leaves_it_to_its_sentinel(rig):
    a, _ = rig.up()
    a.chan.wants_write = True
    rig.give(a)
    a.chan.broken = True
    rig.pool.flush(a)
    assert rig.sel.events_of(a.chan.sock) == selectors.EVENT_READ | selectors.EVENT_WRITE and a.busy


def test_done_frame_is_a_job_done_fact_and_the_child_is_idle_again(rig):
    a, _ = rig.up()
    rig.give(a, "j1")
    a.chan.inbox.append({"t": "done", "id": "j1", "ok": False, "error": "ValueError: x"})
    assert rig.pool.read(a, T0) == [JobDone(a.slot, "j1", False, "ValueError: x")]
    assert a.idle and a.jobs_done == 1


def test_stop_job_child_ignores_a_child_that_moved_on(rig):
    a, _ = rig.up()
    rig.give(a, "j2")
    rig.pool.stop_job_child(a.slot, "j1", "timeout", T0)
    rig.pool.stop_job_child(9, "j2", "timeout", T0)
    assert a.busy and rig.signals.sent == []


def test_kill_escalates_to_sigkill_once_the_grace_passes(rig):
    a, _ = rig.up()
    rig.give(a, "j1")
    rig.pool.stop_job_child(a.slot, "j1", "lease_lost", T0)
    assert rig.signals.sent == [(a.slot, TERM)] and a.stopping and a.kill_at == T0 + 3.0
    assert rig.pool.next_deadline(T0) == T0  # changed; and the kill time is a deadline
    rig.converge(T0)
    assert rig.pool.next_deadline(T0) == T0 + 3.0
    rig.pool.enforce(T0 + 2.99)
    assert rig.signals.sent == [(a.slot, TERM)]
    rig.pool.enforce(T0 + 3.0)
    assert rig.signals.sent == [(a.slot, TERM), (a.slot, KILL)] and a.kill_at is None
    rig.pool.enforce(T0 + 10)
    assert rig.signals.sent.count((a.slot, KILL)) == 1


# ------------------------------------------------------------------ resizing

def test_resize_up_starts_a_new_slot(rig):
    rig.up()
    assert rig.pool.resize(+1) == 3
    rig.converge(T0 + 0.01)
    assert sorted(rig.pool.children) == [0, 1, 2]


def test_resize_is_kept_within_bounds(rig):
    assert rig.pool.resize(-5) == 1
    assert rig.pool.resize(MAX_PROCS + 5) == MAX_PROCS


def test_resize_down_stops_an_idle_child_gracefully(rig):
    _, b = rig.up()
    rig.pool.resize(-1)
    rig.converge(T0 + 1)
    assert b.stopping and b.stop_reason == "resize" and b.chan.sent == [{"t": "stop"}] and rig.signals.sent == []
    rig.exit(b, 0, T0 + 1.5)
    rig.converge(T0 + 2)
    assert sorted(rig.pool.children) == [0] and rig.pool.all_up()


def test_resize_down_replaces_a_busy_child_after_its_job(rig):
    _, b = rig.up()
    rig.give(b, "j1")
    rig.pool.resize(-1)
    rig.converge(T0 + 1)
    assert b.busy and b.replace_reason == "resize" and rig.signals.sent == []
    rig.done(b, "j1", T0 + 2)
    assert b not in rig.pool.idle_children()  # takes no new job
    rig.converge(T0 + 2)
    assert b.stopping and b.chan.sent[-1] == {"t": "stop"}


def test_a_slot_resized_away_forgets_its_back_off(rig):
    rig.converge(T0)
    rig.ready(rig.pool.children[0])
    rig.exit(rig.pool.children[1], 3, T0 + 1)  # failed while starting
    assert 1 in rig.pool.respawn_at
    rig.pool.resize(-1)
    rig.converge(T0 + 1)
    assert rig.pool.respawn_at == {} and rig.pool.boot_failures == {}


# ------------------------------------------------------------------ reloading and recycling

def test_reload_replaces_one_child_first_then_the_others_at_once(monkeypatch):
    rig = Rig(monkeypatch, procs=3)
    children = rig.up()
    rig.pool.replace_all("reload")
    assert len(rig.pool.idle_children()) == 3  # due for a reload, they still work until it is proven
    rig.converge(T0 + 1)
    stopping = [c for c in children if c.stopping]
    assert len(stopping) == 1 and stopping[0].stop_reason == "reload" and stopping[0].chan.sent == [{"t": "stop"}]
    rig.converge(T0 + 2)
    assert [c for c in children if c.stopping] == stopping  # the next waits while one is being stopped
    rig.exit(stopping[0], 0, T0 + 2)
    rig.converge(T0 + 2)  # respawns the slot ...
    new = rig.pool.children[stopping[0].slot]
    rig.converge(T0 + 3)
    assert sum(c.stopping for c in children) == 1  # ... and waits while the new child starts
    rig.ready(new, T0 + 3)
    assert rig.pool.idle_children() == [new]  # proven: the children due for it take no more work ...
    rig.converge(T0 + 3)
    assert sum(c.stopping for c in children) == 3  # ... and are replaced together


def test_reload_waits_for_a_busy_child_to_finish(rig):
    a, b = rig.up()
    rig.give(a)
    rig.give(b, "b")
    rig.pool.replace_all("reload")
    rig.converge(T0 + 1)
    assert not a.stopping and not b.stopping
    rig.done(a, "a", T0 + 2)
    rig.converge(T0 + 2)
    assert a.stopping and a.stop_reason == "reload"


def test_max_jobs_recycles_a_child_after_its_quota(rig):
    a, _ = rig.up()
    a.job_quota = 2  # as spawn_child sets it (max_jobs plus jitter)
    for n in range(2):
        rig.give(a, f"j{n}")
        rig.done(a, f"j{n}", T0 + n)
    assert a.replace_reason == "max_jobs" and a not in rig.pool.idle_children()
    rig.converge(T0 + 3)
    assert a.stopping and a.stop_reason == "max_jobs" and a.chan.sent[-1] == {"t": "stop"}
    rig.exit(a, 0, T0 + 3.5)
    assert ("child_restarted", "max_jobs") in rig.hooks.events and rig.pool.recent_crashes == []


def test_max_jobs_quota_comes_from_the_config(monkeypatch):
    rig = Rig(monkeypatch, max_jobs_per_child=5)
    rig.converge(T0)
    assert {c.job_quota for c in rig.spawner.spawned} == {5}


# ------------------------------------------------------------------ memory

class Trees:
    """Stands in for the pool's `measure`: each pid's tree memory, as the test sets it."""

    def __init__(self) -> None:
        self.sizes: dict[int, TreeMemory] = {}
        self.asked: list[tuple[int, frozenset, int | None]] = []

    def set(self, child, mib: int, subprocesses: int = 0) -> None:
        self.sizes[child.pid] = TreeMemory(mib * MiB, subprocesses)

    def __call__(self, pid: int, exclude: frozenset, pss_above: int | None) -> TreeMemory | None:
        self.asked.append((pid, exclude, pss_above))
        return self.sizes.get(pid)


def memory_rig(monkeypatch, cap_mb: int = 100) -> tuple[Rig, Trees]:
    rig = Rig(monkeypatch, max_memory_per_child_mb=cap_mb)
    trees = Trees()
    rig.pool.measure = trees
    return rig, trees


def test_a_child_over_the_memory_cap_is_replaced_after_its_job(monkeypatch):
    rig, trees = memory_rig(monkeypatch)
    a, _ = rig.up()
    rig.give(a)
    trees.set(a, 150)
    rig.done(a, "a", T0 + 1)
    assert a.replace_reason == "max_memory"
    rig.converge(T0 + 1)
    assert a.stopping and a.stop_reason == "max_memory" and a.chan.sent[-1] == {"t": "stop"}


def test_an_idle_child_over_the_cap_is_replaced_at_the_memory_check(monkeypatch):
    rig, trees = memory_rig(monkeypatch)
    a, b = rig.up()
    trees.set(a, 101)
    trees.set(b, 99)
    assert rig.pool.enforce(T0) == []
    assert a.replace_reason == "max_memory" and b.replace_reason is None and a.rss == 101 * MiB


def test_a_job_whose_tree_stays_over_the_cap_for_the_grace_samples_is_failed_and_its_child_stopped(monkeypatch):
    rig, trees = memory_rig(monkeypatch)
    a, _ = rig.up()
    a.keeper_pid = 77
    rig.give(a)
    trees.set(a, 150, subprocesses=2)
    assert rig.pool.enforce(T0) == []  # over the cap once: a spike is forgiven, the job goes on
    assert (a.pid, frozenset({77}), 100 * MiB) in trees.asked  # the keeper is not counted; PSS above the cap
    assert a.busy and a.replace_reason == "max_memory"
    trees.set(a, 90)
    assert rig.pool.enforce(T0 + 1) == []  # back under: the count starts again
    trees.set(a, 150, subprocesses=2)
    assert rig.pool.enforce(T0 + 2) == [] and rig.pool.enforce(T0 + 2.5) == []  # sampled once a second only
    assert rig.pool.enforce(T0 + 3) == []
    facts = rig.pool.enforce(T0 + 4)  # the third sample in a row over the cap
    assert len(facts) == 1 and isinstance(facts[0], ChildLost) and facts[0].slot == a.slot
    assert facts[0].outcome == "failed"
    assert facts[0].error == ("MemoryLimitExceeded: the job used 150 MiB, 50 MiB over the cap of 100 MiB (child and 2 "
                              "subprocesses); its processes were stopped")
    assert a.stopping and rig.signals.sent == [(a.slot, TERM)]  # its whole group (signal_child signals the group)
    assert rig.pool.enforce(T0 + 5) == []  # a stopping child is not checked again


def test_no_memory_cap_means_no_replacement_yet_memory_is_sampled(monkeypatch):
    rig, trees = memory_rig(monkeypatch, cap_mb=0)
    a, _ = rig.up()
    rig.give(a)
    trees.set(a, 10_000, subprocesses=1)
    for second in range(5):
        assert rig.pool.enforce(T0 + second) == []
    assert a.replace_reason is None and a.memory == TreeMemory(10_000 * MiB, 1)


# ------------------------------------------------------------------ the end

def test_shutdown_stops_idle_children_gracefully_busy_ones_by_signal_and_kills_the_rest(rig):
    a, b = rig.up()
    rig.give(b)
    a.proc.exit_on_join = 0
    rig.pool.shutdown()  # b never exits: SIGKILL after the grace
    assert a.chan.sent == [{"t": "stop"}] and (a.slot, TERM) not in rig.signals.sent
    assert rig.signals.sent == [(b.slot, TERM), (b.slot, KILL)]
    assert rig.pool.children == {} and a.chan.closed and b.proc.closed
    assert sorted(rig.signals.groups_killed) == [a.slot, b.slot]


def test_kill_all_sends_sigkill_to_every_child(rig):
    a, b = rig.up()
    rig.pool.kill_all()
    assert sorted(rig.signals.sent) == [(a.slot, KILL), (b.slot, KILL)]


def test_child_state_changes_only_through_its_methods(rig):
    a, _ = rig.up()
    assert a.state is ChildState.IDLE
    a.begin_stop("resize", T0, 3.0, graceful=True)
    a.begin_stop("timeout", T0 + 1, 0.0)  # a second stop changes nothing
    assert a.stop_reason == "resize" and a.kill_at == T0 + 3.0 and rig.signals.sent == []



def test_the_child_idle_longest_takes_the_next_job(rig):
    """With claims for idle children only (--prefetch 0) and one claim on the wire at a time, a child whose
    jobs end just as each claim's answer comes would otherwise take every job while the other one waits."""
    a, b = rig.up(T0)
    rig.give(a, "j1")
    rig.give(b, "j2")
    rig.done(b, "j2", now=T0 + 1.0)
    assert rig.pool.idle_children() == [b]
    rig.done(a, "j1", now=T0 + 1.5)  # a is free again just as the job claimed for b arrives
    assert rig.pool.idle_children() == [b, a] and rig.pool.idle_count() == 2  # b has waited longest: it takes that job
    rig.give(b, "j3")
    rig.done(b, "j3", now=T0 + 2.0)
    assert rig.pool.idle_children() == [a, b]
