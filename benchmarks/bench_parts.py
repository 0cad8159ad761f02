"""The parent's job parts in-process: their CPU per job, with no socket, no child and no server.

    python benchmarks/bench_parts.py                    # 20000 jobs per row, five rounds, a few seconds
    python benchmarks/bench_parts.py --jobs 5000 --rounds 3

Rows:
  parts   a fake loop drives the job parts as the arbiter does, turn by turn on a fake clock: claim
          answers (a batch of up to 100 jobs, answered at the next turn), hand-outs to two fake children,
          their outcomes the turn after, the reports and their answers. The figure is the CPU per job
          from the claim's answer to the report's acknowledgement (the loop's own cost is in it too).
  frames_parent, frames_child
          the frames one job costs on the wire between the parent and a child, each side apart: the
          parent encodes the job frame and decodes a `done` into its fact; the child decodes the job
          frame and encodes its `done`. The parent's side is what the daemon's throughput pays (one
          loop for every child); each child pays its own side beside its handler.

Each row runs `--rounds` times; the figure is the median (us per job). The script measures whichever
tree it is run from (`--root PATH` measures another checkout, e.g. a `git worktree` of an older commit,
with this interpreter), so a before-and-after comparison runs both in one go, the trees taking turns
round by round (a process of its own each):

    python benchmarks/bench_parts.py --root ../before --root .

Prints a table and one JSON line; `--json PATH` also writes it.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent.parent
ROWS = ("parts", "frames_parent", "frames_child")
JOB = {"id": "", "queue_name": "q", "payload": {"ms": 0, "text": "x" * 40}, "retry_count": 0, "max_retries": 3,
       "timeout_seconds": 300, "lease_id": "", "lease_expires_at": "2026-12-01T07:30:00.123Z"}


class FakeChild:
    stays_after_job = True

    def __init__(self, slot: int) -> None:
        self.slot, self.pid = slot, 10_000 + slot
        self.job_id: str | None = None


class Api:
    """Builds the calls (the real REST client) and answers each one the next turn."""

    def __init__(self, jobs: int) -> None:
        from supervisor.client.rest import Secret, SpooledAPI
        self.builder = SpooledAPI("http://127.0.0.1:9", Secret("sp_bench"))
        self.left = jobs
        self.pending: list[tuple[Any, Any]] = []
        self.settled = 0
        self.next_id = 0

    def submit(self, call: Any, followup: Any, first: bool = False) -> None:
        self.pending.append((call, followup))

    def answer(self, call: Any) -> Any:
        if call.route == "claim":
            size = min(self.left, json.loads(call.body)["limit"])
            self.left -= size
            out = []
            for _ in range(size):
                self.next_id += 1
                out.append({**JOB, "id": f"j{self.next_id}", "lease_id": f"L{self.next_id}"})
            return out
        if call.route in ("complete", "fail"):
            self.settled += 1
        return None


def cfg() -> Any:
    from supervisor.client.rest import Secret
    from supervisor.config import Config
    return Config(api_url="http://127.0.0.1:9", api_key=Secret("sp_bench"), queues=("q",), handler="m:f",
                  worker_id="w-bench", hostname="bench", procs=2, lease=30, poll_interval=1.0, prefetch=None)


def parts_old(jobs: int) -> float:
    """The layout with Claiming, Settling and the in-flight table wired by the arbiter."""
    from supervisor.parent.claiming import Claiming
    from supervisor.parent.inflight import InFlight
    from supervisor.parent.settling import Settling

    from supervisor.ops.nullhooks import NullHooks
    from supervisor.parent.facts import JobDone, JobReissued, QueueFreed, RetryDue

    c, api = cfg(), Api(jobs)
    inflight = InFlight(c.lease)
    claiming = Claiming(c, api.builder, api.submit, NullHooks(), inflight)
    settling = Settling(c, api.builder, api.submit, NullHooks(), inflight)

    def route(facts: Any, now: float) -> None:
        for fact in facts or ():
            if isinstance(fact, QueueFreed):
                claiming.gave_work(fact.queue, now, fact.duration)
            elif isinstance(fact, RetryDue):
                claiming.retry_due(fact.queue, fact.at)
            elif isinstance(fact, JobReissued):
                route(settling.lease_lost(fact.old, "again", now), now)

    children = [FakeChild(0), FakeChild(1)]
    now = 1000.0
    t0 = time.process_time()
    while api.settled < jobs:
        now += 0.001
        pending, api.pending = api.pending, []
        for call, followup in pending:
            route(followup.answer(api.answer(call), None, now), now)
        for child in children:
            if child.job_id is not None:
                route(settling.job_done(JobDone(child.slot, child.job_id, True, {"ok": 1}), now), now)
                child.job_id = None
        route(settling.enforce(now), now)
        for child, entry in claiming.assignments([ch for ch in children if ch.job_id is None]):
            child.job_id = entry.id
            claiming.started(entry, child, now)
        settling.send_reports()
        claiming.maybe_claim(now, sum(1 for ch in children if ch.job_id is None), 2, True, True, None)
    return (time.process_time() - t0) / jobs * 1e6


def parts_wing(jobs: int) -> float:
    """The layout with the jobs wing: the arbiter routes its turn's orders and calls."""
    from supervisor.ops.nullhooks import NullHooks
    from supervisor.parent.facts import GiveJob, JobDone, JobSettled, Send
    from supervisor.parent.jobs import Jobs, Turn

    class Budget:
        rate = None

        def allows_claim(self, now: float, after: int = 0) -> bool:
            return True

    c, api, budget = cfg(), Api(jobs), Budget()
    wing = Jobs(c, api.builder, NullHooks())
    watchers: dict = {}
    children = [FakeChild(0), FakeChild(1)]

    def route(out: Any) -> None:
        for item in out or ():
            if isinstance(item, Send):
                api.submit(item.call, item.followup, item.first)
            elif isinstance(item, GiveJob):
                item.child.job_id = item.job.id
            elif isinstance(item, JobSettled):  # the pool's part: a look-up (no child asked)
                watchers.get(item.pid)
            else:  # what a followup's answer returns goes to the wing, as the arbiter routes it
                route(wing.take(item, now))

    now = 1000.0
    t0 = time.process_time()
    while api.settled < jobs:
        now += 0.001
        pending, api.pending = api.pending, []
        for call, followup in pending:
            route(followup.answer(api.answer(call), None, now))
        for child in children:
            if child.job_id is not None:
                job_id, child.job_id = child.job_id, None
                route(wing.take(JobDone(child.slot, job_id, True, {"ok": 1}), now))
        route(wing.enforce(now))
        route(wing.turn(Turn(now, [ch for ch in children if ch.job_id is None], (), True, False, False, budget, 2)))
    return (time.process_time() - t0) / jobs * 1e6


def frames_old(jobs: int) -> tuple[float, float]:
    """Dict frames, each side timed apart: the parent encodes the job frame and reads a `done`; the child
    reads the job frame and encodes its `done`. What each side read of them is read here too (the child's
    job fields, which its context read, and the parent's `done` fields), so both trees do the same work."""
    from supervisor import exactjson
    from supervisor.child import wire
    job = {**JOB, "id": "j1", "lease_id": "L1"}
    down_bytes = wire.encode({"t": "job", "job": job})
    up_bytes = wire.encode({"t": "done", "id": "j1", "ok": True, "result": {"ok": 1}})
    t0 = time.process_time()
    for _ in range(jobs):  # the parent
        wire.encode({"t": "job", "job": job})
        msg = exactjson.loads(memoryview(bytearray(up_bytes))[4:])  # from the reader's buffer, as it read it
        following = msg.get("next")
        ok = bool(msg.get("ok"))
        value = msg.get("result") if ok else (msg.get("error") or "Job failed")
        assert msg.get("t") == "done" and ok and value and (msg.get("id") or "") and following is None
    t1 = time.process_time()
    for _ in range(jobs):  # the child
        got = exactjson.loads(memoryview(bytearray(down_bytes))[4:])
        assert got.get("t") == "job" and not got.get("held") and got.get("start_by") is None
        raw = got["job"]
        fields = (raw["id"], raw.get("queue_name", ""), raw.get("payload"), int(raw.get("retry_count") or 0),
                  int(raw.get("max_retries") or 0), raw.get("timeout_seconds"), raw.get("lease_id"),
                  raw.get("lease_expires_at"))
        wire.encode({"t": "done", "id": fields[0], "ok": True, "result": {"ok": 1}})
    t2 = time.process_time()
    return (t1 - t0) / jobs * 1e6, (t2 - t1) / jobs * 1e6


def frames_typed(jobs: int) -> tuple[float, float]:
    """Typed frames, each side timed apart: the parent's `JobFrame` of a parsed `Job` and its reading of a
    `done`; the child's reading of the job frame and its `Done`. Each is read from the reader's buffer as
    the readers do (`wire.unpack`; a tree from before it read each frame with exactjson)."""
    from supervisor import exactjson
    from supervisor.child import wire
    from supervisor.job import Job

    def unpack(buf: bytearray) -> list:
        return [exactjson.loads(memoryview(buf)[4:])]

    unpack = getattr(wire, "unpack", unpack)
    job = Job.parse({**JOB, "id": "j1", "lease_id": "L1"})
    assert job is not None
    encode_job = getattr(wire, "encode_job", None) or (lambda job: wire.encode(wire.job_frame(job)))
    down_bytes = encode_job(job)
    up_bytes = wire.encode(wire.done_ok("j1", {"ok": 1}))
    t0 = time.process_time()
    for _ in range(jobs):  # the parent
        encode_job(job)
        (back,) = unpack(bytearray(up_bytes))
        msg = wire.decode_up(back)
        assert isinstance(msg, wire.Done) and msg.ok and msg.result and msg.id and msg.next is None
    t1 = time.process_time()
    for _ in range(jobs):  # the child
        (sent,) = unpack(bytearray(down_bytes))
        got = wire.decode_down(sent)
        assert isinstance(got, wire.JobFrame) and not got.held
        wire.encode(wire.done_ok(got.job.id, {"ok": 1}))
    t2 = time.process_time()
    return (t1 - t0) / jobs * 1e6, (t2 - t1) / jobs * 1e6


def measure(jobs: int, rounds: int) -> dict:
    """Every row for the tree on sys.path (the jobs wing's layout if it has one)."""
    wing = importlib.util.find_spec("supervisor.parent.jobs") is not None
    parts = parts_wing if wing else parts_old
    frames = frames_typed if wing else frames_old
    out: dict[str, Any] = {"layout": "jobs wing" if wing else "parts"}
    parts(min(jobs, 2000))  # warm up
    frames(min(jobs, 2000))
    runs: dict[str, list[float]] = {name: [] for name in ROWS}
    for _ in range(rounds):
        runs["parts"].append(parts(jobs))
        parent, child = frames(jobs)
        runs["frames_parent"].append(parent)
        runs["frames_child"].append(child)
    for name, values in runs.items():
        out[name] = {"us_per_job": round(statistics.median(values), 2), "runs": [round(v, 2) for v in values]}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--root", action="append", help="measure this checkout (repeatable; default: this one)")
    ap.add_argument("--json", help="also write the JSON here")
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # measure sys.path's tree, print JSON
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(measure(args.jobs, args.rounds)))
        return 0
    roots = args.root or [str(HERE)]
    runs: dict[str, list[dict]] = {root: [] for root in roots}
    for _ in range(args.rounds):  # the trees take turns, round by round: a load that comes and goes hits both
        for root in roots:
            text = subprocess.run([sys.executable, str(HERE / "benchmarks" / "bench_parts.py"), "--one", "--jobs",
                                   str(args.jobs), "--rounds", "1"], cwd=root, check=True, capture_output=True,
                                  text=True, env={"PYTHONPATH": root, "PATH": "/usr/bin:/bin"}).stdout
            runs[root].append(json.loads(text))
    results = {}
    for root, got in runs.items():
        results[root] = {"layout": got[0]["layout"]}
        for name in ROWS:
            values = [v for r in got for v in r[name]["runs"]]
            results[root][name] = {"us_per_job": round(statistics.median(values), 2), "runs": values}
    first = next(iter(results.values()))
    print(f"{'tree':32} {'layout':10}" + "".join(f" {name + ' us/job':>20}" for name in ROWS)
          + "".join(f" {name + ' ratio':>19}" for name in ROWS))
    for root, r in results.items():
        print(f"{root[-32:]:32} {r['layout']:10}" + "".join(f" {r[name]['us_per_job']:20.2f}" for name in ROWS)
              + "".join(f" {r[name]['us_per_job'] / first[name]['us_per_job']:19.3f}" for name in ROWS))
    line = json.dumps({"jobs": args.jobs, "rounds": args.rounds, "results": results})
    print(line)
    if args.json:
        Path(args.json).write_text(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
