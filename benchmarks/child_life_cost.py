"""What the child's hooks and tracing cost per job, measured in-process in one run (CPU time, not wall time).

Rows, each over the same no-op handler: `before` runs the job as the child did without them (`run_job`
alone); `no-op` the path a child without hooks or tracing now takes (one test of `Life.wraps`, and
`between_jobs`); `traced` the job in an OpenTelemetry span (the real SDK, a batch processor, an in-memory
exporter); `hooks` with a hook on every job event and its `settled` frame. `parent` is the parent's added
work per settled job with no child asking (a JobSettled fact and the pool's look-up). Needs the test extra.

    flock /tmp/spooled-bench.lock python benchmarks/child_life_cost.py --jobs 20000
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from supervisor.child import lifecycle, main  # noqa: E402
from supervisor.child.handler import Handler  # noqa: E402
from supervisor.child.wire import Settled  # noqa: E402
from supervisor.job import Job  # noqa: E402


def noop(ctx):
    return None


def per_job(jobs: int, one) -> float:
    """Microseconds of CPU per call of `one(n)`, the best of three runs."""
    best = float("inf")
    for _ in range(3):
        start = time.process_time()
        for n in range(jobs):
            one(n)
        best = min(best, time.process_time() - start)
    return best / jobs * 1e6


def job(n: int) -> Job:
    parsed = Job.parse({"id": f"job-{n}", "lease_id": f"l-{n}", "queue_name": "q", "payload": {"n": n},
                        "retry_count": 0, "max_retries": 0})
    assert parsed is not None
    return parsed


def rows(jobs: int) -> dict[str, float]:
    handler = Handler(noop, False)
    run = main.run_job
    bare = lifecycle.Life(None, None, 2.0)

    def before(n: int) -> None:
        run(handler, job(n), "w", 1_000_000)

    def life_row(life: lifecycle.Life, settle: bool = False):
        def one(n: int) -> None:
            j = job(n)
            if life.wraps:
                life.run(j, lambda seen: run(handler, j, "w", 1_000_000, seen))
            else:
                run(handler, j, "w", 1_000_000)
            if settle:
                life.take_settled(Settled(j.id, "completed"))
            life.between_jobs()
        return one

    out = {"before": per_job(jobs, before), "no-op": per_job(jobs, life_row(bare))}

    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(exporter, max_queue_size=jobs * 4))
    trace.set_tracer_provider(provider)
    tracer = lifecycle.tracing.job_tracer("w")
    out["traced"] = per_job(jobs, life_row(lifecycle.Life(None, tracer, 2.0)))
    provider.shutdown()

    from spooled import SpooledClient
    from spooled.worker import SpooledWorker

    worker = SpooledWorker(SpooledClient(api_key="sk_test_" + "0" * 32, base_url="http://127.0.0.1:9"), queue_name="q")
    for event in ("job:claimed", "job:started", "job:completed", "job:failed"):
        worker.on(event, lambda data: None)
    out["hooks"] = per_job(jobs, life_row(lifecycle.Life(lifecycle.hooks_module.hooks_of(worker, "w"), None, 2.0),
                                          settle=True))

    from supervisor.parent.jobs.inflight import Entry
    from supervisor.parent.jobs.settling import tell_child

    class Pool:  # the pool's part of it: a look-up in an empty table
        settle_watchers: dict = {}

        def tell_settled(self, fact) -> None:
            if self.settle_watchers.get(fact.pid) is None:
                return

    pool = Pool()
    entry = Entry(job=job(0), claimed_at=0.0, lease_until=30.0, renew_at=10.0, pid=1234, started_at=1.0)

    def parent(n: int) -> None:
        for fact in tell_child(entry, "completed"):
            pool.tell_settled(fact)

    out["parent"] = per_job(jobs, parent)
    return out


def main_() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=20000)
    args = p.parse_args()
    for name, us in rows(args.jobs).items():
        print(f"{name:8s} {us:8.2f} us CPU per job")
    return 0


if __name__ == "__main__":
    sys.exit(main_())
