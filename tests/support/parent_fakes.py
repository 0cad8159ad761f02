"""Fakes for in-process tests of the parent's decisions: a Config, a recording `submit`, recording hooks,
children without processes, a selector that only records, and API errors as the REST client types them.

Nothing here opens a socket or starts a process: `SpooledAPI` only builds the calls, and the fake
child's proc and channel are plain objects.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from supervisor.child import wire
from supervisor.client import rest as api
from supervisor.client.rest import Secret, SpooledAPI
from supervisor.config import Config
from supervisor.ops.nullhooks import NullHooks
from supervisor.parent.childproc import Child
from supervisor.parent.facts import Followup

URL = "http://127.0.0.1:9"  # never contacted
KEY = Secret("sp_test_0123456789")
MiB = 2**20


def make_cfg(**overrides: Any) -> Config:
    fields: dict[str, Any] = dict(api_url=URL, api_key=KEY, queues=("q",), handler="tests.handlers:ok", worker_id="w-1",
                                  hostname="host", procs=2, lease=30, poll_interval=5.0, kill_grace=3.0,
                                  drain_timeout=25.0, prefetch=0,  # prefetch 0: claim only for idle children
                                  wake="poll")  # no events stream: these rigs never turn the listener
    fields.update(overrides)
    return Config(**fields)


def make_api() -> SpooledAPI:
    return SpooledAPI(URL, KEY)


def body(call: api.Call) -> dict:
    return orjson.loads(call.body) if call.body else {}


def error(status: int, code: str = "", retry_after: float | None = None, job_route: bool = True) -> api.ApiError:
    """The typed error the REST client makes of this answer (so the tests follow its classification)."""
    payload = {"code": code, "message": "m"} if code else {"message": "m"}
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
    return api.classify(status, payload, headers, job_route=job_route)


def timeout_error() -> api.Unavailable:
    return api.network_error(TimeoutError("timed out"), URL)


class Submit:
    """A recording `submit(call, followup, first=False)`."""

    def __init__(self) -> None:
        self.calls: list[tuple[api.Call, Followup, bool]] = []

    def __call__(self, call: api.Call, followup: Followup, first: bool = False) -> None:
        self.calls.append((call, followup, first))

    def routes(self) -> list[str]:
        return [c.route for c, _, _ in self.calls]

    def take(self, route: str) -> tuple[api.Call, Followup, bool]:
        """Remove and return the only recorded call of `route` (fails if there is not exactly one)."""
        found = [c for c in self.calls if c[0].route == route]
        assert len(found) == 1, f"expected one {route} call, got {self.routes()}"
        self.calls.remove(found[0])
        return found[0]


class Hooks(NullHooks):
    """Records every event as a tuple (name, *args)."""

    def __init__(self) -> None:
        self.events: list[tuple] = []

    def job_settled(self, queue: str, outcome: str, duration: float | None) -> None:
        self.events.append(("job_settled", queue, outcome, duration))

    def child_restarted(self, reason: str) -> None:
        self.events.append(("child_restarted", reason))

    def child_oom_killed(self) -> None:
        self.events.append(("oom_killed",))

    def lease_renewed(self, outcome: str) -> None:
        self.events.append(("lease_renewed", outcome))

    def claimed(self, count: int) -> None:
        self.events.append(("claimed", count))

    def ready(self, status: str) -> None:
        self.events.append(("ready", status))

    def status(self, text: str) -> None:
        self.events.append(("status", text))

    def stopping(self) -> None:
        self.events.append(("stopping",))

    def named(self, name: str) -> list[tuple]:
        return [e for e in self.events if e[0] == name]


class FakeFile:
    """Something a selector may be told about."""


class FakeChan:
    """The parent's end of a child's socket: `inbox` is what the child 'sent' (the JSON objects of its frames,
    decoded as the real Channel decodes them), `sent` the frames the parent sent (`wire()`: their objects)."""

    def __init__(self) -> None:
        self.sock = FakeFile()
        self.frames: list = []
        self.inbox: list[dict] = []
        self.eof = False
        self.broken = False  # send raises OSError, as for a dead child
        self.wants_write = False
        self.closed = False

    @property
    def sent(self) -> list[dict]:
        return [frame.wire() for frame in self.frames]

    def send(self, frame) -> None:
        if self.broken:
            raise OSError("broken pipe")
        self.frames.append(frame)

    def send_job(self, job) -> None:
        self.send(wire.JobFrame(job))

    def receive(self, budget: int | None = None) -> list:
        if self.eof:
            raise EOFError
        messages, self.inbox = self.inbox, []
        return [frame for msg in messages if (frame := wire.decode_up(msg)) is not None]

    def flush(self) -> None:
        if self.broken:
            raise OSError("broken pipe")

    def close(self) -> None:
        self.closed = True


class FakeProc:
    """A process handle: `exitcode` is None while it 'runs'; `exit_on_join` makes join() end it."""

    def __init__(self) -> None:
        self.sentinel = FakeFile()
        self.exitcode: int | None = None
        self.exit_on_join: int | None = None
        self.joins: list[float | None] = []
        self.closed = False

    def join(self, timeout: float | None = None) -> None:
        self.joins.append(timeout)
        if self.exitcode is None and self.exit_on_join is not None:
            self.exitcode = self.exit_on_join

    def close(self) -> None:
        self.closed = True


@dataclass
class FakeMemory:
    rss: int


@dataclass
class FakePs:
    """What the pool's tree_usage asks psutil of a child (`Child.ps`)."""

    rss: int = 10 * MiB

    def memory_info(self) -> FakeMemory:
        return FakeMemory(self.rss)

    def cpu_percent(self, interval: float | None = None) -> float:
        return 0.0

    def memory_percent(self) -> float:
        return 0.0


# Above any pid_max Linux allows (2**22): should a fake pid ever reach os.kill or killpg, it finds no process.
FAKE_PID = 10**8


def fake_child(slot: int, now: float = 0.0, job_quota: int = 0, pid: int | None = None) -> Child:
    return Child(slot=slot, proc=FakeProc(), chan=FakeChan(), started_at=now,  # type: ignore[arg-type]
                 job_quota=job_quota, pid=pid if pid is not None else FAKE_PID + slot, _ps=FakePs())


class FakeSelector:
    """Records what is watched; never selects."""

    def __init__(self) -> None:
        self.watched: dict[int, tuple[Any, int, Any]] = {}

    def register(self, fileobj: Any, events: int, data: Any = None) -> None:
        if id(fileobj) in self.watched:
            raise KeyError("already registered")
        self.watched[id(fileobj)] = (fileobj, events, data)

    def unregister(self, fileobj: Any) -> None:
        del self.watched[id(fileobj)]

    def modify(self, fileobj: Any, events: int, data: Any = None) -> None:
        if id(fileobj) not in self.watched:
            raise KeyError("not registered")
        self.watched[id(fileobj)] = (fileobj, events, data)

    def events_of(self, fileobj: Any) -> int | None:
        item = self.watched.get(id(fileobj))
        return item[1] if item else None


@dataclass
class Spawner:
    """Stands in for `spawn_child`: hands out fake children and records them; `fail` makes it raise."""

    spawned: list[Child] = field(default_factory=list)
    fail: bool = False
    quota: int = 0

    def __call__(self, slot: int, now: float, handler: str, worker_id: str, max_result_bytes: int,
                 max_jobs: int, env: dict | None = None, generation: int = 0) -> Child:
        if self.fail:
            raise OSError("fork failed")
        child = fake_child(slot, now, job_quota=self.quota or max_jobs, pid=FAKE_PID + 1000 + len(self.spawned))
        child.generation = generation
        self.spawned.append(child)
        return child

    def slots(self) -> list[int]:
        return [c.slot for c in self.spawned]


@dataclass
class Signals:
    """Stands in for `signal_child` (records (slot, signal)) and `kill_group` (records the slot)."""

    sent: list[tuple[int, int]] = field(default_factory=list)
    groups_killed: list[int] = field(default_factory=list)

    def __call__(self, child: Child, sig: int) -> None:
        self.sent.append((child.slot, sig))

    def kill_group(self, child: Child) -> list[int]:
        self.groups_killed.append(child.slot)
        return []


def no_process_is_touched(monkeypatch, signals: Signals, spawner: Spawner) -> None:
    """Patch every way the pool reaches a real process: spawning, signals and process-group kills."""
    from supervisor.parent import childproc, pool

    monkeypatch.setattr(pool, "spawn_child", spawner)
    monkeypatch.setattr(pool, "signal_child", signals)
    monkeypatch.setattr(childproc, "signal_child", signals)
    if hasattr(pool, "kill_group"):
        monkeypatch.setattr(pool, "kill_group", signals.kill_group)
