"""A child's SIGKILL named for what it is: the cgroup's OOM kill counter (fake files here) tells the kernel
OOM killer from a signal 9 sent by someone else; the daemon's own SIGKILL says so; metrics count OOM kills."""

from __future__ import annotations

import signal
from pathlib import Path

from support.pool_rig import T0, Rig

from supervisor.ops.cgroup import MemorySource
from supervisor.ops.metrics import DaemonMetrics
from supervisor.parent.facts import ChildLost


def events(path: Path, oom_kills: int) -> None:
    path.write_text(f"low 0\nhigh 0\nmax 0\noom {oom_kills}\noom_kill {oom_kills}\noom_group_kill 0\n")


def oom_rig(monkeypatch, tmp_path: Path) -> tuple[Rig, Path]:
    cg = tmp_path / "cg"
    cg.mkdir()
    events(cg / "memory.events", 4)  # kills before the daemon started are not ours
    rig = Rig(monkeypatch)
    rig.pool.memory = MemorySource(cg, 2)
    rig.pool.oom_seen = rig.pool.memory.oom_kills()
    return rig, cg / "memory.events"


def died(rig: Rig, child, now: float) -> str:
    facts = rig.exit(child, -signal.SIGKILL, now)
    lost = [f for f in facts if isinstance(f, ChildLost)]
    assert len(lost) == 1
    return lost[0].error


def test_a_sigkill_with_the_oom_counter_risen_is_the_kernel_oom_killer(monkeypatch, tmp_path):
    rig, counter = oom_rig(monkeypatch, tmp_path)
    a, b = rig.up()
    rig.give(a)
    events(counter, 5)
    assert died(rig, a, T0 + 1).endswith(f"(pid {a.pid}) killed by the kernel OOM killer (SIGKILL)")
    assert rig.pool.oom_kills == 1 and ("oom_killed",) in rig.hooks.events


def test_a_sigkill_without_the_counter_rising_is_signal_9_from_someone_else(monkeypatch, tmp_path):
    rig, counter = oom_rig(monkeypatch, tmp_path)
    a, b = rig.up()
    assert died(rig, a, T0 + 1).endswith("killed by signal 9 (not by the daemon)")
    assert rig.pool.oom_kills == 0


def test_two_children_oom_killed_at_once_are_both_named(monkeypatch, tmp_path):
    rig, counter = oom_rig(monkeypatch, tmp_path)
    a, b = rig.up()
    events(counter, 6)
    assert "kernel OOM killer" in died(rig, a, T0 + 1)
    assert "kernel OOM killer" in died(rig, b, T0 + 1)
    c = rig.up(T0 + 2)[0]
    assert "not by the daemon" in died(rig, c, T0 + 3)  # no new OOM kill since


def test_an_oom_kill_of_some_other_process_is_not_blamed_on_a_later_child(monkeypatch, tmp_path):
    rig, counter = oom_rig(monkeypatch, tmp_path)
    a, _ = rig.up()
    events(counter, 5)  # say, a handler's subprocess: its child lives on
    assert rig.pool.enforce(T0 + 1) == []  # the memory sample takes the counter as its new baseline
    assert "not by the daemon" in died(rig, a, T0 + 2)


def test_the_daemons_own_sigkill_says_so(monkeypatch, tmp_path):
    rig, counter = oom_rig(monkeypatch, tmp_path)
    a, _ = rig.up()
    rig.give(a)
    rig.pool.stop_job_child(a.slot, "a", "timeout", T0)
    rig.pool.enforce(T0 + 4)  # past the grace: SIGKILL
    assert (a.slot, signal.SIGKILL) in rig.signals.sent
    events(counter, 9)
    assert died(rig, a, T0 + 5).endswith("killed by SIGKILL (by the daemon, after the grace period)")
    assert rig.pool.oom_kills == 0


def test_metrics_count_oom_kills_and_show_memory():
    m = DaemonMetrics(queues=["q"])
    m.oom_kills.inc()
    m.memory({"state": "high", "used_bytes": 5, "limit_bytes": 10}, [{"slot": 0, "memory_bytes": 7},
                                                                    {"slot": 1, "memory_bytes": None}])
    text = m.render()
    assert "spooled_supervisor_oom_kills_total 1" in text
    assert 'spooled_supervisor_memory_pressure{state="high"} 1' in text
    assert 'spooled_supervisor_memory_pressure{state="ok"} 0' in text
    assert "spooled_supervisor_memory_used_bytes 5" in text and "spooled_supervisor_memory_limit_bytes 10" in text
    assert 'spooled_supervisor_child_memory_bytes{slot="0"} 7' in text and 'slot="1"' not in text
