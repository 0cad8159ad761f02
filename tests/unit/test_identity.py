"""One live daemon per worker id: the pure decisions of supervisor.parent.identity, with a fake clock."""

from __future__ import annotations

from supervisor.parent import identity

T0 = 1_800_000_000.0
OURS = {"instance_id": "ours", "started_at": identity.rfc3339(T0), "pid": 100, "boot_id": "b1", "pid_ns": "pid:[1]"}


def row(beat_age: float | None, instance: str | None = "theirs", status: str = "healthy", **meta) -> dict:
    metadata = {"host": "web-1", "pid": 4242, "started_at": identity.rfc3339(T0 - 60), **meta}
    if instance is not None:
        metadata["instance_id"] = instance
    beat = None if beat_age is None else identity.rfc3339(T0 - beat_age)
    return {"id": "w", "status": status, "hostname": "web-1", "last_heartbeat": beat, "metadata": metadata}


def test_a_recent_heartbeat_from_another_instance_is_a_live_other():
    text = identity.other_live_instance(row(3.0), "ours", T0, 10.0)
    assert text is not None
    assert "instance theirs on host web-1, pid 4242, started" in text


def test_no_row_offline_stale_or_own_heartbeat_is_not_another_live_instance():
    assert identity.other_live_instance(None, "ours", T0, 10.0) is None
    assert identity.other_live_instance(row(1.0, status="offline"), "ours", T0, 10.0) is None  # deregistered
    assert identity.other_live_instance(row(20.5), "ours", T0, 10.0) is None  # over 2 intervals old
    assert identity.other_live_instance(row(19.5), "ours", T0, 10.0) is not None
    assert identity.other_live_instance(row(1.0, instance="ours"), "ours", T0, 10.0) is None
    assert identity.other_live_instance(row(None), "ours", T0, 10.0) is None


def test_a_row_without_an_instance_id_counts_as_another_instance():
    text = identity.other_live_instance(row(1.0, instance=None), "ours", T0, 10.0)
    assert text is not None and "(no instance id)" in text


def test_the_interval_comes_from_the_rows_metadata_and_bounds_the_watch():
    assert identity.row_heartbeat_interval(row(1.0, heartbeat_interval=2.0)) == 2.0
    assert identity.row_heartbeat_interval(row(1.0)) == identity.DEFAULT_HEARTBEAT_INTERVAL
    assert identity.row_heartbeat_interval(row(1.0, heartbeat_interval="x")) == identity.DEFAULT_HEARTBEAT_INTERVAL
    assert identity.row_heartbeat_interval(row(1.0, heartbeat_interval=True)) == identity.DEFAULT_HEARTBEAT_INTERVAL
    assert identity.watch_deadline(2.0) == 3.5
    assert identity.watch_deadline(10.0) == 13.5
    assert identity.watch_deadline(3600.0) == identity.MAX_WAIT


def test_heartbeat_advanced_compares_the_two_reads():
    assert identity.heartbeat_advanced(row(5.0), row(1.0))
    assert not identity.heartbeat_advanced(row(5.0), row(5.0))
    assert not identity.heartbeat_advanced(row(None), row(1.0))
    assert not identity.heartbeat_advanced(None, row(1.0))


def test_a_predecessor_in_this_pid_namespace_whose_process_is_gone_need_not_be_waited_for():
    here = dict(OURS)
    same = row(1.0, boot_id="b1", pid_ns="pid:[1]", pid_start=77)
    assert identity.predecessor_gone(same, here, gone=lambda pid, start: (pid, start) == (4242, 77))
    assert not identity.predecessor_gone(same, here, gone=lambda pid, start: False)
    other_ns = row(1.0, boot_id="b1", pid_ns="pid:[2]")
    assert not identity.predecessor_gone(other_ns, here, gone=lambda pid, start: True)  # another container
    other_boot = row(1.0, boot_id="b0", pid_ns="pid:[1]")
    assert not identity.predecessor_gone(other_boot, here, gone=lambda pid, start: True)
    assert not identity.predecessor_gone(row(1.0), here, gone=lambda pid, start: True)  # no facts: can't tell
    our_pid = row(1.0, boot_id="b1", pid_ns="pid:[1]", pid=100)
    assert identity.predecessor_gone(our_pid, here, gone=lambda pid, start: False)  # it had our pid: gone


def test_process_gone_is_true_only_for_a_pid_that_is_really_gone():
    import os
    import subprocess

    me = os.getpid()
    assert not identity.process_gone(me, identity.process_start(me))
    assert identity.process_gone(me, identity.process_start(me) + 1)  # same pid, another process: reused
    proc = subprocess.Popen(["true"])
    proc.wait()
    assert identity.process_gone(proc.pid, None)
    assert not identity.process_gone(1, None)  # init: alive (and maybe not ours to signal)


def test_of_two_live_instances_only_the_older_yields():
    newer = row(1.0, instance="zz", started_at=identity.rfc3339(T0 + 5))
    older = row(1.0, instance="aa", started_at=identity.rfc3339(T0 - 5))
    assert identity.taken_over_by(newer, OURS) is not None  # a newer one took the row: we go
    assert identity.taken_over_by(older, OURS) is None  # it is older: it goes, we stay
    assert identity.taken_over_by(row(1.0, instance="ours"), OURS) is None
    assert identity.taken_over_by(row(1.0, instance=None), OURS) is None
    assert identity.taken_over_by(None, OURS) is None
    tie = row(1.0, instance="zz", started_at=OURS["started_at"])
    assert identity.taken_over_by(tie, OURS) is not None  # equal start: the larger instance id wins
    assert identity.taken_over_by(tie, dict(OURS, instance_id="zzz")) is None


def test_instance_metadata_is_made_once_per_process():
    first = identity.instance_metadata()
    second = identity.instance_metadata(T0)
    assert first == second
    assert set(first) >= {"host", "pid", "started_at", "instance_id", "boot_id", "pid_ns", "pid_start"}
    assert len(first["instance_id"]) == 16 and identity.parse_time(first["started_at"]) is not None


def test_the_in_use_line_names_the_fix():
    line = identity.in_use_message("web-1", "instance x on host h, pid 1, started s")
    assert "\n" not in line and "--worker-id" in line and "SPOOLED_WORKER_ID" in line and "'web-1'" in line


# --- the pre-register check in commands/run.py, with a fake API and a fake clock -------------------------

class FakeAPI:
    """Answers GET /api/v1/workers/{id} from a function of the fake time; counts the calls."""

    def __init__(self, clock, answer):
        self.clock, self.answer, self.calls = clock, answer, 0

    def get(self, path: str):
        self.calls += 1
        result = self.answer(self.clock.now)
        if isinstance(result, Exception):
            raise result
        return result


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def sleep(self, secs: float) -> None:
        self.now += secs


def check(answer, own=None):
    from types import SimpleNamespace

    from supervisor.commands.run import worker_id_in_use

    clock = FakeClock()
    api = FakeAPI(clock, answer)
    cfg = SimpleNamespace(worker_id="w")
    result = worker_id_in_use(api, cfg, own or OURS, sleep=clock.sleep, wall=lambda: T0 + clock.now,
                              clock=lambda: clock.now)
    return result, clock.now, api.calls


def live_row(started: float, interval: float = 2.0):
    """A row whose owner heartbeats every `interval` seconds of fake time, the last one at `started`."""
    def answer(now):
        beats = int((now + 0.5) // interval)
        return row(-(started + beats * interval), heartbeat_interval=interval)
    return answer


def test_api_trouble_before_registering_never_blocks_the_start():
    from supervisor.client.rest import Unavailable

    result, waited, calls = check(lambda now: Unavailable(0, "CONNECTION_REFUSED", "down"))
    assert (result, waited, calls) == (None, 0.0, 1)


def test_an_advancing_heartbeat_is_a_live_daemon_found_within_one_interval():
    result, waited, calls = check(live_row(-0.5))
    assert result is not None and "instance theirs" in result
    assert waited <= 2.0 + 0.5  # found at the first heartbeat after the first read


def test_a_heartbeat_that_does_not_advance_is_taken_over_after_the_watch():
    frozen = row(1.0, heartbeat_interval=2.0)
    result, waited, calls = check(lambda now: frozen)
    assert result is None
    assert waited == identity.watch_deadline(2.0) == 3.5 and calls > 2


def test_a_row_deregistered_during_the_watch_is_free():
    result, waited, _ = check(lambda now: row(1.0, heartbeat_interval=2.0, ) if now < 1 else
                              row(1.0, status="offline", heartbeat_interval=2.0))
    assert result is None and waited < 2.0
