"""In-process tests of membership's decisions: registration answers and retries, heartbeats."""

from __future__ import annotations

import pytest
from support.parent_fakes import Submit, body, error, make_api, make_cfg, timeout_error

from supervisor import exitcodes
from supervisor.parent.facts import ExitNow, Fatal, Registered
from supervisor.parent.membership import Membership

T0 = 100.0


class Rig:
    def __init__(self, **cfg) -> None:
        self.submit = Submit()
        self.members = Membership(make_cfg(**cfg), make_api(), self.submit)

    def register(self, now: float = T0, procs: int = 2):
        self.members.register(procs, now)
        return self.submit.take("register")

    def registered(self, now: float = T0, interval: int = 10) -> None:
        _, followup, _ = self.register(now)
        assert followup.answer({"heartbeat_interval_secs": interval}, None, now) == [Registered()]

    def heartbeat(self, now: float):
        self.members.send_heartbeat(now, current_jobs=1, status="healthy", procs=2, busy=1, children=2, cpu=1.0,
                                   mem=2.0)
        return self.submit.take("worker_heartbeat")


@pytest.fixture
def rig() -> Rig:
    return Rig()


def worker_error(status: int, code: str = "", retry_after: float | None = None):
    return error(status, code, retry_after, job_route=False)


# ------------------------------------------------------------------ registering

def test_register_sends_the_worker_and_its_concurrency(rig):
    call, _, first = rig.register(procs=3)
    sent = body(call)
    assert sent["queue_name"] == "q" and sent["worker_id"] == "w-1" and sent["hostname"] == "host"
    assert sent["max_concurrency"] == 3 and sent["metadata"]["procs"] == 3 and not first


def test_register_ok_takes_the_heartbeat_interval_from_the_answer(rig):
    _, followup, _ = rig.register()
    assert followup.answer({"heartbeat_interval_secs": 7}, None, T0 + 0.5) == [Registered()]
    members = rig.members
    assert members.registered and members.heartbeat_interval == 7.0 and members.api_ok_at == T0 + 0.5
    assert members.next_heartbeat_at == T0 + 7.5 and members.next_deadline() == T0 + 7.5
    assert not members.heartbeat_due(T0 + 7.49) and members.heartbeat_due(T0 + 7.5)


def test_register_ok_without_an_interval_heartbeats_every_10_s(rig):
    _, followup, _ = rig.register()
    followup.answer({}, None, T0)
    assert rig.members.heartbeat_interval == 10.0


def test_one_registration_at_a_time(rig):
    rig.register()
    rig.members.register(2, T0)
    assert rig.submit.calls == []


def test_register_401_is_fatal(rig):
    _, followup, _ = rig.register()
    facts = followup.answer(None, worker_error(401), T0)
    assert facts == [Fatal(exitcodes.AUTH, facts[0].error)] and not rig.members.registered


def test_register_409_means_the_worker_id_is_taken(rig):
    _, followup, _ = rig.register()
    assert followup.answer(None, worker_error(409, "CONFLICT"), T0) == [ExitNow(exitcodes.WORKER_ID_CONFLICT)]
    assert exitcodes.WORKER_ID_CONFLICT == 5


def test_register_400_is_a_configuration_error(rig):
    _, followup, _ = rig.register()
    assert followup.answer(None, worker_error(400, "VALIDATION_ERROR"), T0) == [ExitNow(exitcodes.CONFIG)]
    assert exitcodes.CONFIG == 2


@pytest.mark.parametrize("answer", [worker_error(503), timeout_error(), worker_error(429, "QUOTA_EXCEEDED")],
                         ids=["503", "timeout", "quota-exceeded"])
def test_register_failure_is_retried_with_a_growing_back_off(rig, answer):
    now = T0
    for attempt in range(1, 9):
        _, followup, _ = rig.register(now) if attempt == 1 else rig.submit.take("register")
        assert followup.answer(None, answer, now) == []
        wait = rig.members.register_at - now
        top = min(60.0, 1.0 * 2 ** (attempt - 1))
        assert top / 2 <= wait <= top
        assert rig.members.next_deadline() == rig.members.register_at
        rig.members.register_if_due(rig.members.register_at - 0.001, 2)
        assert rig.submit.calls == []
        now = rig.members.register_at
        rig.members.register_if_due(now, 2)
        assert rig.submit.routes() == ["register"] and rig.members.register_at is None
    assert not rig.members.registered


def test_register_429_waits_at_least_retry_after(rig):
    _, followup, _ = rig.register()
    followup.answer(None, worker_error(429, "RATE_LIMIT_EXCEEDED", retry_after=30), T0)
    assert rig.members.register_at >= T0 + 30


def test_a_successful_registration_resets_the_back_off(rig):
    _, followup, _ = rig.register()
    followup.answer(None, worker_error(502), T0)
    rig.members.register_if_due(rig.members.register_at, 2)
    _, followup, _ = rig.submit.take("register")
    followup.answer({}, None, T0 + 2)
    assert rig.members.register_attempts == 0 and rig.members.register_at is None


def test_recover_register_tries_again_in_5_s(rig):
    _, followup, _ = rig.register()
    assert followup.recover(T0) is None
    assert not rig.members.registration.busy and rig.members.register_at == T0 + 5


# ------------------------------------------------------------------ heartbeats

def test_heartbeat_is_sent_on_the_interval_one_at_a_time(rig):
    rig.registered(T0, interval=10)
    assert not rig.members.heartbeat_due(T0 + 9.9)
    call, followup, _ = rig.heartbeat(T0 + 10)
    sent = body(call)
    assert sent["current_jobs"] == 1 and sent["status"] == "healthy" and sent["cpu_percent"] == 1.0
    assert not rig.members.heartbeat_due(T0 + 25)  # one on the wire
    assert rig.members.next_deadline() is None
    assert followup.answer({}, None, T0 + 10.1) == []
    assert rig.members.heartbeat_due(T0 + 20) and not rig.members.heartbeat_due(T0 + 19.9)


def test_the_heartbeat_metadata_is_built_by_membership_from_the_values_the_loop_passes(rig):
    rig.registered(T0, interval=10)
    reading = {"used_bytes": 5, "limit_bytes": 10, "source": "cgroup2", "pressure": "ok"}
    rig.members.send_heartbeat(T0 + 10, current_jobs=3, status="draining", procs=4, busy=2, children=3, cpu=7.5,
                               mem=1.25, memory=reading)
    sent = body(rig.submit.take("worker_heartbeat")[0])
    meta = sent["metadata"]
    assert sent["current_jobs"] == 3 and sent["status"] == "draining" and sent["memory_percent"] == 1.25
    assert (meta["procs"], meta["busy"], meta["children"], meta["cpu_percent"]) == (4, 2, 3, 7.5)
    assert meta["memory"] == reading and meta["heartbeat_interval"] == 10.0 and meta["queues"] == ["q"]
    assert meta["instance_id"] == rig.members.identity["instance_id"]  # who the daemon is: membership's own


def test_heartbeat_404_registers_again(rig):
    rig.registered(T0)
    _, followup, _ = rig.heartbeat(T0 + 10)
    assert followup.answer(None, worker_error(404, "NOT_FOUND"), T0 + 10.1) == []
    assert not rig.members.registered and not rig.members.heartbeat_due(T0 + 1000)
    assert rig.members.register_at == T0 + 10.1 and rig.members.next_deadline() == T0 + 10.1
    rig.members.register_if_due(T0 + 10.1, 3)  # the arbiter passes the pool's current size
    call, followup, _ = rig.submit.take("register")
    assert body(call)["max_concurrency"] == 3
    followup.answer({"heartbeat_interval_secs": 5}, None, T0 + 11)
    assert rig.members.registered and rig.members.next_heartbeat_at == T0 + 16


@pytest.mark.parametrize("answer", [worker_error(503), timeout_error(), worker_error(429, "RATE_LIMIT_EXCEEDED")],
                         ids=["503", "timeout", "429"])
def test_heartbeat_error_sends_the_next_one_soon(rig, answer):
    rig.registered(T0, interval=10)
    _, followup, _ = rig.heartbeat(T0 + 10)
    assert followup.answer(None, answer, T0 + 10.5) == []
    assert rig.members.next_heartbeat_at == T0 + 12.5 and rig.members.registered


def test_heartbeat_401_is_fatal(rig):
    rig.registered(T0)
    _, followup, _ = rig.heartbeat(T0 + 10)
    facts = followup.answer(None, worker_error(401), T0 + 10.1)
    assert [type(f) for f in facts] == [Fatal] and facts[0].code == exitcodes.AUTH


def test_recover_heartbeat_frees_the_next_one(rig):
    rig.registered(T0)
    _, followup, _ = rig.heartbeat(T0 + 10)
    assert followup.recover(T0 + 10.1) is None
    assert rig.members.heartbeat_due(T0 + 20)


def test_heartbeat_soon_moves_the_next_one_to_now(rig):
    rig.registered(T0, interval=10)
    rig.members.heartbeat_soon(T0 + 3)
    assert rig.members.heartbeat_due(T0 + 3)
    rig.members.heartbeat_soon(T0 + 50)  # never later
    assert rig.members.next_heartbeat_at == T0 + 3


def test_deregistered_stops_heartbeats(rig):
    rig.registered(T0)
    rig.members.deregistered()
    assert not rig.members.registered and not rig.members.heartbeat_due(T0 + 1000)


# ------------------------------------------------------------------ heartbeat answers and the worker row

def test_heartbeat_answer_may_set_the_interval_within_1_to_300_s(rig):
    rig.registered(T0, interval=10)
    for asked, interval in ((4, 4.0), (0.2, 1.0), (9999, 300.0)):
        now = rig.members.next_heartbeat_at
        _, followup, _ = rig.heartbeat(now)
        followup.answer({"acknowledged": True, "next_heartbeat_seconds": asked}, None, now)
        assert rig.members.heartbeat_interval == interval and rig.members.next_heartbeat_at == now + interval


@pytest.mark.parametrize("answer", [None, {}, {"next_heartbeat_seconds": True}, {"next_heartbeat_seconds": -5},
                                    {"next_heartbeat_seconds": "7"}], ids=["empty", "dict", "bool", "negative", "text"])
def test_heartbeat_answer_without_a_usable_interval_keeps_it(rig, answer):
    rig.registered(T0, interval=10)
    _, followup, _ = rig.heartbeat(T0 + 10)
    assert followup.answer(answer, None, T0 + 10.1) == []
    assert rig.members.heartbeat_interval == 10.0 and rig.members.next_heartbeat_at == T0 + 20


def test_unknown_heartbeat_commands_are_noted_once(rig, caplog):
    rig.registered(T0)
    for n in range(3):
        _, followup, _ = rig.heartbeat(T0 + 10 * (n + 1))
        followup.answer({"commands": [{"type": "pause"}, "resume"]}, None, T0 + 10 * (n + 1))
    assert rig.members.commands_seen == {"pause", "resume"}
    assert sum("command this daemon does not know" in r.getMessage() for r in caplog.records) == 2


def test_the_worker_row_is_read_back_just_before_a_heartbeat_about_every_50_s(rig):
    rig.registered(T0, interval=10)
    reads = []
    for n in range(1, 13):  # two minutes of heartbeats
        beat = T0 + 10 * n
        _, followup, _ = rig.heartbeat(beat)
        followup.answer(None, None, beat + 0.2)
        due = rig.members.row_check_at
        if due is not None:
            assert due == beat + 9  # just before the next heartbeat: the row shows any other daemon's of this interval
            rig.members.check_row_if_due(due - 0.1)
            assert rig.submit.calls == []
            rig.members.check_row_if_due(due)
            call, followup, _ = rig.submit.take("get_worker")
            assert call.method == "GET" and call.path.endswith("/workers/w-1")
            followup.answer({"metadata": dict(rig.members.identity)}, None, due + 0.1)
            reads.append(due)
            rig.members.check_row_if_due(due + 0.5)
            assert rig.submit.calls == []  # once
    assert reads[0] == T0 + 19  # the first heartbeat's interval is checked
    assert [b - a for a, b in zip(reads, reads[1:], strict=False)] == [50.0, 50.0]  # 0.02 requests/s


def newer_row(members, seconds_later: float = 60.0) -> dict:
    from supervisor.parent import identity

    own = members.identity
    started = identity.parse_time(own["started_at"]) + seconds_later
    return {"id": "w-1", "status": "healthy", "metadata": {"instance_id": "f" * 16,
                                                           "started_at": identity.rfc3339(started), "pid": 1}}


def test_a_newer_instance_on_the_row_makes_this_daemon_yield(rig):
    rig.registered(T0)
    _, followup, _ = rig.heartbeat(T0 + 10)
    followup.answer(None, None, T0 + 10)
    rig.members.check_row_if_due(T0 + 19)
    _, followup, _ = rig.submit.take("get_worker")
    facts = followup.answer(newer_row(rig.members), None, T0 + 15.1)
    assert [type(f).__name__ for f in facts] == ["TakenOver"] and "f" * 16 in facts[0].other
    assert rig.members.yielded and not rig.members.heartbeat_due(T0 + 1000)
    assert rig.members.next_deadline() is None


@pytest.mark.parametrize("row", ["own", "older", "error", "junk"])
def test_the_row_of_this_or_an_older_instance_or_a_failed_read_changes_nothing(rig, row):
    rig.registered(T0)
    _, followup, _ = rig.heartbeat(T0 + 10)
    followup.answer(None, None, T0 + 10)
    rig.members.check_row_if_due(T0 + 19)
    _, followup, _ = rig.submit.take("get_worker")
    answer, err = {
        "own": ({"metadata": dict(rig.members.identity)}, None),
        "older": (newer_row(rig.members, seconds_later=-60.0), None),
        "error": (None, worker_error(503)),
        "junk": (["not", "a", "row"], None),
    }[row]
    assert followup.answer(answer, err, T0 + 15.1) == []
    assert not rig.members.yielded and rig.members.heartbeat_due(T0 + 20)


def test_recover_row_allows_the_next_check(rig):
    rig.registered(T0)
    _, followup, _ = rig.heartbeat(T0 + 10)
    followup.answer(None, None, T0 + 10)
    rig.members.check_row_if_due(T0 + 19)
    _, followup, _ = rig.submit.take("get_worker")
    assert followup.recover(T0 + 15.1) is None and not rig.members.row_check.busy
