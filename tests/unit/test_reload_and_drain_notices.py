"""In-process: when the arbiter tells systemd a reload began and ended, and how long a drain may still take.

A reload ends once every child was started after the SIGHUP (a busy child is replaced after its job);
meanwhile, and while draining, the hooks hear every turn how much longer it may take (for systemd's timeouts).
"""

from __future__ import annotations

import signal

import pytest
from support.arbiter_rig import T0
from support.arbiter_rig import Rig as ArbiterRig
from support.pool_rig import Rig as PoolRig

from supervisor.ops.budget import DEREGISTER_TIMEOUT, REAP_AFTER_KILL
from supervisor.parent.arbiter import RELOAD_EXTEND, Phase


@pytest.fixture
def rig(monkeypatch):
    r = ArbiterRig(monkeypatch)
    for name in ("reloading", "extend_timeout"):
        monkeypatch.setattr(r.hooks, name, lambda *args, name=name: r.hooks.events.append((name, *args)),
                            raising=False)
    try:
        yield r
    finally:
        r.close()


def test_the_pool_is_up_since_a_time_only_once_every_child_started_after_it(monkeypatch):
    pool = PoolRig(monkeypatch, procs=2)
    a, b = pool.up(T0)
    assert pool.pool.all_up_since(T0) and not pool.pool.all_up_since(T0 + 1)
    pool.pool.replace_all("reload")
    pool.give(b)  # busy: replaced after its job
    pool.converge(T0 + 1)
    assert a.stopping and not b.stopping
    pool.exit(a, 0, T0 + 1)
    pool.converge(T0 + 2)  # respawns a's slot
    new_a = pool.pool.children[a.slot]
    pool.ready(new_a, T0 + 2)
    assert new_a is not a and not pool.pool.all_up_since(T0 + 1)  # b is still the old child
    pool.done(b, "a", T0 + 3)
    pool.converge(T0 + 3)
    assert b.stopping and b.stop_reason == "reload"
    pool.exit(b, 0, T0 + 3)
    pool.converge(T0 + 3)
    assert not pool.pool.all_up_since(T0 + 1)  # the new b is still starting
    pool.ready(pool.pool.children[b.slot], T0 + 4)
    assert pool.pool.all_up_since(T0 + 1)


def test_sighup_after_ready_announces_reloading_and_ready_once_the_children_are_new(rig, monkeypatch):
    rig.running()
    assert rig.hooks.named("ready")  # the start's READY=1
    new_since: list[float] = []
    monkeypatch.setattr(rig.arb.pool, "all_up_since", lambda since: bool(new_since) and new_since[0] >= since)
    rig.signal(signal.SIGHUP, now=T0 + 1)
    assert rig.hooks.named("reloading") == [("reloading", T0 + 1)]
    assert "reloading" in rig.arb.status_line()
    rig.arb.check_reload(T0 + 2)
    assert len(rig.hooks.named("ready")) == 1  # children not all new yet
    assert rig.hooks.named("extend_timeout") == [("extend_timeout", T0 + 2, RELOAD_EXTEND)]  # systemd: keep waiting
    new_since.append(T0 + 1)
    rig.arb.check_reload(T0 + 3)
    assert len(rig.hooks.named("ready")) == 2 and rig.arb.reload_began is None
    assert "reloading" not in rig.arb.status_line()
    rig.arb.check_reload(T0 + 4)
    assert len(rig.hooks.named("ready")) == 2  # once per reload


def test_a_reload_whose_children_fail_to_start_stops_asking_for_time(rig, monkeypatch):
    """New code that does not import: systemd's reload timeout is left to run out, so the reload fails."""
    rig.running()
    monkeypatch.setattr(rig.arb.pool, "all_up_since", lambda since: False)
    monkeypatch.setattr(rig.arb.pool, "degraded", lambda now: True)
    rig.signal(signal.SIGHUP, now=T0 + 1)
    rig.arb.check_reload(T0 + 2)
    assert rig.hooks.named("extend_timeout") == [] and rig.arb.reload_began == T0 + 1


def test_a_second_sighup_restarts_the_wait(rig, monkeypatch):
    rig.running()
    monkeypatch.setattr(rig.arb.pool, "all_up_since", lambda since: since <= T0 + 1)  # new since the first only
    rig.signal(signal.SIGHUP, now=T0 + 1)
    rig.signal(signal.SIGHUP, now=T0 + 2)
    rig.arb.check_reload(T0 + 3)
    assert len(rig.hooks.named("ready")) == 1 and rig.arb.reload_began == T0 + 2


def test_sighup_before_ready_leaves_it_to_the_start(rig):
    rig.start()  # children up, not registered: no READY=1 yet
    rig.signal(signal.SIGHUP, now=T0 + 1)
    assert rig.hooks.named("reloading") == [] and rig.arb.reload_began is None
    assert rig.arb.reloads == 1  # the children are still replaced


def test_a_drain_ends_a_reload_without_ready(rig, monkeypatch):
    rig.running()
    monkeypatch.setattr(rig.arb.pool, "all_up_since", lambda since: False)
    rig.signal(signal.SIGHUP, now=T0 + 1)
    rig.signal(signal.SIGTERM, now=T0 + 2)
    rig.arb.check_reload(T0 + 2)
    assert rig.arb.reload_began is None and len(rig.hooks.named("ready")) == 1


def test_a_drain_reports_the_time_the_stop_may_still_take(rig):
    rig.running()
    rig.arb.feed_children(T0)
    rig.answer("claim", [{"id": "j", "lease_id": "L", "queue_name": "q"}], now=T0)  # something to drain
    rig.signal(signal.SIGTERM, now=T0 + 1)
    assert rig.arb.phase is Phase.DRAINING
    rig.arb.check_drain(T0 + 4)
    cfg = rig.arb.cfg
    after = cfg.kill_grace + REAP_AFTER_KILL + 2 * DEREGISTER_TIMEOUT
    assert rig.arb.stop_after_drain() == after
    assert rig.hooks.named("extend_timeout") == [("extend_timeout", T0 + 4, cfg.drain_timeout - 3 + after)]
