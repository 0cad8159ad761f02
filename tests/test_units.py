"""Unit tests: framing, the in-flight table, configuration, error text, death causes, API error classes."""

from __future__ import annotations

import math
import random
import signal
import socket
import threading

import pytest

from supervisor.child import wire
from supervisor.child.main import format_error
from supervisor.client import rest as api
from supervisor.config import ConfigError, clean_worker_id, load_config
from supervisor.parent.childproc import death_cause, job_quota
from supervisor.parent.inflight import InFlight, Outcome

ENV = {"SPOOLED_API_KEY": "sp_test_0123456789abcdef"}


@pytest.mark.timeout(20)
def test_frames_of_several_mib_cross_a_socketpair_without_deadlock():
    parent, child = socket.socketpair()
    chan = wire.Channel(parent)
    big = {"t": "job", "job": {"id": "j", "payload": "x" * (6 * 2**20)}}
    received = []
    reader = threading.Thread(target=lambda: received.append(wire.read_frame(child)))
    reader.start()
    chan.send(big)
    while chan.wants_write:  # non-blocking: the parent writes in pieces as the reader drains
        chan.flush()
    reader.join(10)
    assert received == [big]
    wire.write_frame(child, {"t": "done", "id": "j", "ok": True, "result": 1})
    wire.write_frame(child, {"t": "ready", "pid": 1})
    messages = []
    while len(messages) < 2:
        messages += chan.receive()
    assert [m["t"] for m in messages] == ["done", "ready"]
    child.close()
    with pytest.raises(EOFError):
        while True:
            chan.receive()


def test_inflight_schedule_renewals_and_timeouts():
    table = InFlight(lease_secs=30)
    entry = table.add({"id": "a", "lease_id": "L", "timeout_seconds": 5}, now=100.0)
    assert table.renewals_due(109.9) == [] and table.renewals_due(110.0) == [entry]
    assert table.waiting() == [entry]
    table.start(entry, slot=0, pid=42, now=101.0)
    assert table.waiting() == [] and table.on_child(0) is entry
    assert table.timed_out(105.9) == [] and table.timed_out(106.0) == [entry]
    table.renewed(entry, sent_at=110.0)
    assert entry.lease_until == 140.0 and entry.renew_at == 120.0
    assert table.next_deadline() == 106.0
    table.finish(entry, Outcome(True, {"ok": 1}, "completed"), now=103.5)
    assert entry.outcome.label == "completed" and entry.outcome.verb == "complete" and entry.duration == 2.5
    assert table.on_child(0) is None and table.timed_out(1e9) == []
    assert table.pop("a") is entry and len(table) == 0


def test_inflight_waiting_follows_every_change_of_an_entry():
    """The table keeps its reserved jobs apart (not rescanned each turn): each way out of waiting is seen."""
    table = InFlight(lease_secs=30)
    a, b, c = (table.add({"id": i, "lease_id": f"L-{i}"}, now=0.0) for i in "abc")
    assert table.waiting() == [a, b, c] and table.waiting_count() == 3
    table.start(a, slot=0, pid=1, now=1.0)  # given to a child
    table.finish(b, Outcome(False, "lease lost", "lease_lost"), now=1.0)  # dropped before it started
    assert table.waiting() == [c]
    a2 = table.add({"id": "a", "lease_id": "L-a2"}, now=2.0)  # re-issued under a new lease while a runs
    assert table.waiting() == [c, a2]
    table.finish(a, Outcome(True, None, "completed"), now=3.0)  # the old copy ending leaves the new one waiting
    assert table.waiting() == [c, a2]
    table.replace_outcome(c, Outcome(False, "stopped", "lease_lost"))
    assert table.pop("a") is a2 and table.waiting() == [] and table.waiting_count() == 0


def _earliest_due(table: InFlight) -> float:
    """What enforce acts on, from scratch: renewals, a waiting job's lease, timeouts, reports to resend."""
    times = [math.inf]
    for e in table.jobs.values():
        if not e.renewing:
            times.append(e.renew_at)
            if e in table.waiting():
                times.append(e.lease_until)
        if e.timeout_at is not None and e.outcome is None:
            times.append(e.timeout_at)
        if e.report_due_at is not None:
            times.append(e.report_due_at)
    return min(times)


def test_inflight_deadline_bound_is_never_later_than_any_deadline_and_exact_after_a_rescan():
    """Random lives of jobs: after every change the table's bound is at or before the earliest deadline
    (so skipping the scans before it misses nothing), and a rescan makes it exact."""
    rng = random.Random(7)
    table, now, n = InFlight(lease_secs=30), 0.0, 0
    for _ in range(3000):
        now += rng.uniform(0.0, 2.0)
        entries = list(table.jobs.values())
        e = rng.choice(entries) if entries else None
        op = rng.randrange(9)
        if op == 0 or e is None:
            n += 1
            table.add({"id": f"j{n}", "lease_id": "L", "timeout_seconds": rng.choice([None, 0, 1, 5, 60])}, now)
        elif op == 1 and e in table.waiting():
            table.start(e, slot=0, pid=1, now=now)
        elif op == 2 and e.outcome is None:
            table.finish(e, Outcome(True, None, "completed"), now)
        elif op == 3 and e.outcome is not None:
            table.begin_report(e)
        elif op == 4 and e.reporting:
            table.report_answered(e, retry_at=rng.choice([None, now + rng.uniform(0.0, 20.0)]))
        elif op == 5 and not e.renewing:
            table.begin_renewal(e)
        elif op == 6 and e.renewing:
            table.renewed(e, sent_at=now - rng.uniform(0.0, 0.5))
        elif op == 7 and e.renewing:
            table.renewal_failed(e, now + rng.uniform(0.0, 40.0))  # may land past the lease
        elif op == 8:
            table.pop(e.id)
        bound = table.next_deadline()
        assert (math.inf if bound is None else bound) <= _earliest_due(table)
        if rng.random() < 0.1:
            table.rescan()
            assert (table.next_deadline() or math.inf) == _earliest_due(table)
            assert table.due(now) == (_earliest_due(table) <= now)


def test_config_defaults_and_one_line_errors(monkeypatch):
    cfg = load_config(["--queue", "q", "--handler", "m:f"], ENV)
    assert cfg.lease == 30 and cfg.drain_timeout == 25.0 and cfg.procs >= 1
    assert "sp_test" not in repr(cfg)
    cases = [
        (["--queue", "q"], "--handler is required"),
        (["--queue", "q", "--handler", "nocolon"], "--handler must look like"),
        (["--queue", ".q", "--handler", "m:f"], "not a valid queue name"),
        (["--queue", "q", "--handler", "m:f", "--worker-id", "bad id!"], "--worker-id must be"),
        (["--queue", "q", "--handler", "m:f", "--api-url", "http://10.0.0.1:8080"], "refusing plain http://"),
        (["--queue", "q", "--handler", "m:f", "--ca-bundle", "/nonexistent.pem"], "--ca-bundle"),
        (["--queue", "q", "--handler", "m:f", "--api-key", "sp_test_0123456789"], "--api-key is not accepted"),
    ]
    for argv, text in cases:
        with pytest.raises(ConfigError) as err:
            load_config(argv, ENV)
        assert text in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="no API key"):
        load_config(["--queue", "q", "--handler", "m:f"], {})
    insecure = load_config(
        ["--queue", "q", "--handler", "m:f", "--api-url", "http://10.0.0.1", "--allow-insecure-http"], ENV
    )
    assert insecure.api_url == "http://10.0.0.1"
    from_env = load_config([], {**ENV, "SPOOLED_QUEUE": "q2", "SPOOLED_HANDLER": "m:g", "SPOOLED_PROCS": "3"})
    assert (from_env.queue, from_env.handler, from_env.procs) == ("q2", "m:g", 3)


def test_key_from_file_and_systemd_credentials(tmp_path):
    key_file = tmp_path / "key"
    key_file.write_text("sp_test_fromfile123456\n")
    cfg = load_config(["--queue", "q", "--handler", "m:f", "--api-key-file", str(key_file)], {})
    assert cfg.api_key.value == "sp_test_fromfile123456"
    (tmp_path / "spooled-api-key").write_text("sp_test_credential1234")
    cfg = load_config(["--queue", "q", "--handler", "m:f"], {"CREDENTIALS_DIRECTORY": str(tmp_path)})
    assert cfg.api_key.value == "sp_test_credential1234"


def test_worker_id_from_hostname_is_cleaned():
    assert clean_worker_id("pod_name.example.com") == "pod_name.example.com"
    assert clean_worker_id("my host/with:odd*chars") == "my-host-with-odd-chars"
    assert len(clean_worker_id("h" * 300)) == 128


def test_error_text_is_type_message_and_traceback_tail_within_2048():
    def deep(n):
        if n == 0:
            raise KeyError("missing field 'x'")
        deep(n - 1)

    try:
        deep(60)
    except KeyError as exc:
        text = format_error(exc)
    assert text.startswith("KeyError: \"missing field 'x'\"")
    assert len(text) <= 2048 and "in deep" in text and text.rstrip().endswith("KeyError: \"missing field 'x'\"")


def test_death_causes_and_job_quota_jitter():
    assert death_cause(-signal.SIGKILL) == "killed by signal 9 (not by the daemon); possibly out of memory"
    assert death_cause(-signal.SIGKILL, oom=False) == "killed by signal 9 (not by the daemon)"
    assert death_cause(-signal.SIGKILL, oom=True) == "killed by the kernel OOM killer (SIGKILL)"
    assert death_cause(-signal.SIGKILL, killed_by_daemon=True) == "killed by SIGKILL (by the daemon, after the grace " \
                                                                  "period)"
    assert death_cause(-signal.SIGSEGV) == "killed by SIGSEGV (segmentation fault)"
    assert death_cause(7) == "exited with code 7"
    quotas = {job_quota(100) for _ in range(200)}
    assert min(quotas) >= 100 and max(quotas) <= 110 and len(quotas) > 1
    assert job_quota(0) == 0


def test_api_errors_are_classified_for_the_loop():
    assert isinstance(api.classify(409, {"code": "LEASE_EXPIRED"}, job_route=True), api.LeaseLost)
    assert isinstance(api.classify(404, {"code": "NOT_FOUND"}, job_route=True), api.LeaseLost)
    assert isinstance(
        api.classify(409, {"code": "CONFLICT", "message": "Job is already completed"}, job_route=True),
        api.AlreadyFinished,
    )
    assert isinstance(api.classify(409, {"code": "CONFLICT"}), api.Conflict)
    assert isinstance(api.classify(429, {"code": "QUOTA_EXCEEDED"}), api.QuotaExceeded)
    limited = api.classify(429, {"code": "RATE_LIMIT_EXCEEDED"}, {"Retry-After": "7"})
    assert isinstance(limited, api.RateLimited) and limited.retry_after == 7.0
    assert isinstance(api.classify(503, {}), api.Unavailable) and api.classify(503, {}).retryable
    assert isinstance(api.classify(401, {"code": "UNAUTHORIZED"}), api.Unauthorized)
    assert isinstance(api.classify(400, {"code": "VALIDATION_ERROR"}), api.Rejected)
    secret = api.Secret("sp_test_supersecret")
    assert "supersecret" not in repr(secret) and "supersecret" not in str(secret)


@pytest.mark.timeout(20)
def test_unreachable_api_is_a_retryable_error_without_the_key():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = api.SpooledAPI(f"http://127.0.0.1:{port}", api.Secret("sp_test_neverprinted1"), timeout=1)
    with pytest.raises(api.Unavailable) as err:
        client.claim("q", "w", 1, 30)
    assert "neverprinted" not in str(err.value) and "neverprinted" not in repr(client)
