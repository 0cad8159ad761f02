"""Memory pressure: the decision in-process with fake readings and a fake clock (pause, hand back, shed the
newest, one at a time, hysteresis, resume), the arbiter acting on it with a fake memory source (renewals
and reports go on while paused), and the readings themselves from fake cgroup files."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from support.arbiter_rig import T0, Rig
from support.parent_fakes import body

from supervisor.config import ConfigError, load_config
from supervisor.ops.cgroup import MemoryReading, MemorySource
from supervisor.parent.facts import HandBack, ShedJob
from supervisor.parent.memory import SHED_PAUSE, Level, MemoryPressure, Running

MiB = 2**20
LIMIT = 1000 * MiB


def reading(used_mib: float) -> MemoryReading:
    return MemoryReading(int(used_mib * MiB), LIMIT, "cgroup2")


def pressure() -> MemoryPressure:
    return MemoryPressure(Level(85, True), Level(95, True))  # 850 and 950 MiB of 1000; resume below 800


RUNNING = [Running(0, "old", T0 - 10), Running(1, "newest", T0 - 1), Running(2, "middle", T0 - 5)]


# ------------------------------------------------------------------ the decision

def test_below_high_nothing_happens():
    p = pressure()
    assert p.observe(reading(849), T0, reserved=3, running=RUNNING) == []
    assert not p.paused and p.state == "ok"
    assert p.observe(None, T0 + 1, reserved=3, running=RUNNING) == []  # no reading: no change


def test_above_high_pauses_and_hands_the_reserved_jobs_back():
    p = pressure()
    facts = p.observe(reading(850), T0, reserved=2, running=RUNNING)
    assert p.paused and p.state == "high"
    assert len(facts) == 1 and isinstance(facts[0], HandBack)
    assert facts[0].error == ("MemoryPressure: handed back unstarted: this worker's memory is at 850 MiB of 1000 MiB, "
                              "over its high threshold (850 MiB)")
    assert p.observe(reading(860), T0 + 1, reserved=0, running=RUNNING) == []  # nothing reserved: nothing to do
    assert isinstance(p.observe(reading(860), T0 + 2, reserved=1, running=RUNNING)[0], HandBack)  # a late claim


def test_above_max_sheds_the_newest_running_job_one_at_a_time():
    p = pressure()
    facts = p.observe(reading(960), T0, reserved=0, running=RUNNING)
    assert p.paused and p.state == "max"
    assert facts == [ShedJob(1, "newest", facts[0].error)]
    assert facts[0].error.startswith("MemoryPressure: this worker's memory reached 960 MiB of 1000 MiB, over its max "
                                     "threshold (950 MiB); this job, the newest running, was stopped")
    left = [r for r in RUNNING if r.job_id != "newest"]
    assert p.observe(reading(960), T0 + SHED_PAUSE / 2, reserved=0, running=left) == []  # a pause to re-measure
    facts = p.observe(reading(955), T0 + SHED_PAUSE, reserved=0, running=left)
    assert [(f.slot, f.job_id) for f in facts if isinstance(f, ShedJob)] == [(2, "middle")]
    assert p.stats()["shed_jobs"] == 2


def test_between_high_and_max_nothing_running_is_shed():
    p = pressure()
    facts = p.observe(reading(940), T0, reserved=0, running=RUNNING)
    assert facts == [] and p.paused and p.state == "high"


def test_resumes_only_below_high_minus_the_hysteresis_band():
    p = pressure()
    p.observe(reading(900), T0, reserved=0, running=[])
    assert p.observe(reading(820), T0 + 1, reserved=0, running=[]) == []
    assert p.paused and p.state == "ok"  # below high, but within the band: still paused
    p.observe(reading(799), T0 + 2, reserved=0, running=[])
    assert not p.paused and p.state == "ok"
    p.observe(reading(849), T0 + 3, reserved=0, running=[])
    assert not p.paused  # climbing back under high does not pause


def test_thresholds_in_mib_and_the_status_figures():
    p = MemoryPressure(Level(300, False), Level(400, False))
    assert p.thresholds(LIMIT) == (300 * MiB, 400 * MiB, 250 * MiB)
    p.observe(reading(350), T0, reserved=0, running=[])
    status = p.stats()
    assert status["state"] == "high" and status["paused"] and status["used_bytes"] == 350 * MiB
    assert status["limit_bytes"] == LIMIT and status["high"] == "300 MiB" and status["source"] == "cgroup2"


def test_memory_thresholds_are_checked_at_start():
    base = {"SPOOLED_API_KEY": "sp_test_0123456789abcdef", "SPOOLED_QUEUE": "q", "SPOOLED_HANDLER": "m:f"}
    cfg = load_config(["--memory-high", "70%", "--memory-max", "2048"], base)
    assert cfg.memory_high == (70.0, True) and cfg.memory_max == (2048.0, False)
    assert load_config([], base).memory_high == (85.0, True) and load_config([], base).memory_max == (95.0, True)
    with pytest.raises(ConfigError, match=r"^--memory-high must be below --memory-max, got 96% and 95%$"):
        load_config(["--memory-high", "96%"], base)
    with pytest.raises(ConfigError, match=r"^SPOOLED_MEMORY_MAX must be a percent"):
        load_config([], {**base, "SPOOLED_MEMORY_MAX": "0%"})


# ------------------------------------------------------------------ the arbiter acting on it

class FakeSource:
    """Stands in for the cgroup reader: `used` MiB of LIMIT, as the test sets it."""

    def __init__(self) -> None:
        self.used = 100.0

    def read(self) -> MemoryReading:
        return reading(self.used)

    def oom_kills(self) -> int | None:
        return 0


@pytest.fixture
def rig(monkeypatch):
    r = Rig(monkeypatch)
    r.source = FakeSource()
    monkeypatch.setattr(r.arb, "memory", r.source)
    try:
        yield r
    finally:
        r.close()


def check(rig, now: float) -> None:
    rig.arb.check_memory(now)
    rig.arb.jobs.settling.send_reports()


def test_paused_the_arbiter_claims_nothing_hands_reserved_jobs_back_and_still_renews_and_reports(rig):
    rig.running()
    arb = rig.arb
    arb.feed_children(T0)
    jobs = [{"id": j, "lease_id": f"L-{j}", "queue_name": "q"} for j in ("a", "b", "c")]
    rig.answer("claim", jobs, now=T0)  # two children, three jobs: one is reserved
    arb.feed_children(T0)
    assert arb.jobs.claiming.reserved() == 1 and arb.pool.busy_count() == 2
    rig.submit.calls.clear()

    rig.source.used = 900
    check(rig, T0 + 1)
    assert arb.pressure.paused and not arb.may_claim()
    call, _, _ = rig.submit.take("fail")  # the reserved job, handed back
    assert body(call)["error"].startswith("MemoryPressure: handed back unstarted") and "/c/" in call.path
    assert arb.jobs.claiming.reserved() == 0

    child = rig.child_of("a")
    child.chan.inbox.append({"t": "done", "id": "a", "ok": True, "result": 1})
    arb.route(arb.pool.read(child, T0 + 2), T0 + 2)
    arb.feed_children(T0 + 2)  # a child is free, but nothing is claimed or started while paused
    assert rig.submit.routes() == ["complete"]  # the report goes out
    rig.submit.calls.clear()
    arb.route(arb.jobs.settling.enforce(T0 + 10), T0 + 10)  # a third of the lease: what is held is renewed
    renewed = [c.path for c, _, _ in rig.submit.calls if c.route == "job_heartbeat"]
    assert set(rig.submit.routes()) == {"job_heartbeat"} and any("/b/" in path for path in renewed)

    rig.source.used = 700
    check(rig, T0 + 11)
    assert not arb.pressure.paused and arb.may_claim()
    arb.feed_children(T0 + 11)
    assert "claim" in rig.submit.routes()


def test_above_max_the_newest_job_is_failed_and_its_child_stopped(rig):
    rig.running()
    arb = rig.arb
    rig.run_job("a", now=T0)
    rig.run_job("b", now=T0 + 1)
    newest = rig.child_of("b")
    rig.submit.calls.clear()
    rig.source.used = 990
    check(rig, T0 + 2)
    call, _, _ = rig.submit.take("fail")
    assert "/b/" in call.path and body(call)["error"].startswith("MemoryPressure: this worker's memory reached 990 MiB")
    assert newest.stopping and newest.stop_reason == "memory_pressure"
    assert (newest.slot, signal.SIGTERM) in rig.signals.sent
    assert not rig.child_of("a").stopping  # one at a time
    arb.publish(T0 + 2)  # the loop publishes what /status shows
    snap = arb.snapshot()
    assert snap["memory"]["state"] == "max" and snap["memory"]["used_bytes"] == 990 * MiB


def test_heartbeats_carry_the_cgroup_memory(rig):
    rig.running()
    rig.source.used = 300
    check(rig, T0)
    rig.arb.membership.heartbeat_soon(T0)
    rig.arb.send_heartbeat(T0)
    call, _, _ = rig.submit.take("worker_heartbeat")
    memory = body(call)["metadata"]["memory"]
    assert memory == {"used_bytes": 300 * MiB, "limit_bytes": LIMIT, "source": "cgroup2", "pressure": "ok"}


# ------------------------------------------------------------------ reading the cgroup

def write(path: Path, **files: str) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (path / name.replace("_", ".", 1)).write_text(text)
    return path


def test_cgroup_v2_limit_usage_and_oom_kills(tmp_path):
    proc = tmp_path / "cgroup"
    proc.write_text("0::/pod/app\n")
    write(tmp_path / "fs" / "pod" / "app", memory_current="104857600\n", memory_max="209715200\n",
          memory_events="low 0\nhigh 0\nmax 3\noom 1\noom_kill 2\n")
    source = MemorySource.detect(proc, tmp_path / "fs")
    assert source.version == 2
    assert source.read() == MemoryReading(100 * MiB, 200 * MiB, "cgroup2")
    assert source.oom_kills() == 2


def test_cgroup_v1_and_no_limit_falls_back_to_the_host(tmp_path):
    proc = tmp_path / "cgroup"
    proc.write_text("5:cpu,cpuacct:/x\n4:memory:/docker/abc\n0::/\n")
    cg = write(tmp_path / "fs" / "memory" / "docker" / "abc", memory_usage_in_bytes="1048576",
               memory_limit_in_bytes="9223372036854771712", memory_oom_control="oom_kill_disable 0\nunder_oom 0\n"
                                                                                 "oom_kill 5\n")
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       2048000 kB\nMemFree:  1 kB\nMemAvailable:   1024000 kB\n")
    source = MemorySource.detect(proc, tmp_path / "fs")
    source.meminfo = meminfo
    assert source.version == 1 and source.dir == cg
    assert source.read() == MemoryReading((2048000 - 1024000) * 1024, 2048000 * 1024, "host")  # no limit set
    assert source.oom_kills() == 5
    (cg / "memory.limit_in_bytes").write_text("4194304\n")
    assert source.read() == MemoryReading(MiB, 4 * MiB, "cgroup1")


def test_no_cgroup_at_all_reads_the_host(tmp_path):
    proc = tmp_path / "cgroup"
    proc.write_text("")
    vmstat = tmp_path / "vmstat"
    vmstat.write_text("nr_free_pages 1\noom_kill 7\n")
    source = MemorySource.detect(proc, tmp_path / "fs")
    source.vmstat = vmstat
    assert source.version == 0 and source.dir is None and source.oom_kills() == 7
    assert source.read() is not None and source.read().source == "host"  # the real /proc/meminfo
