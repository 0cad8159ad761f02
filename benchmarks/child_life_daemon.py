"""What a child's life features cost per job through the whole daemon, before and after, in one run.

    flock /tmp/spooled-bench.lock python benchmarks/child_life_daemon.py --baseline /tmp/before --jobs 1000

The same jobs (benchmarks.handlers.burn, `--ms` of CPU each) go through a real dev server at each API latency
(`--delays`, the dev server's --fault-delay-ms: 0 = loopback, 20 ms), --procs = cores, one daemon per row:

  baseline          --baseline PATH: the daemon of another checkout (one from before hooks, the exit flush and
                    tracing existed: `git archive <commit> | tar -x -C PATH`), the plain handler
  baseline-recycle  the same with --max-jobs-per-child (every RECYCLE jobs a child leaves and a new one starts)
  plain             this daemon, the plain handler: no hooks, no tracer, nothing to flush
  recycle           the plain handler with --max-jobs-per-child: the exit path (atexit, logging.shutdown) runs
  flushed           as `recycle`, with an atexit entry and a buffered logging handler to flush at each exit
  hooked            an SDK worker with a no-op hook on every job event (each job also gets its `settled` frame)
  traced            a span per job (the OpenTelemetry SDK, a batch processor, an exporter that drops spans)

and multiprocessing.Pool(cores).map runs the same jobs before and after each latency's rows (their mean).
Per row: jobs/s from the server's own records (first start to last completion), its ratio to the Pool
(`over_pool`), and CPU per job of the parent and of the children (the daemon's process tree, exited children
included through their parents' accounts); with --repeat N each figure is the median of N passes (every other
pass in reverse order) and `spread` the CPU figures' max - min. Prints a table and one JSON line (`--json PATH`
also writes it).
Everything is bounded: each row at most 60 s + 0.5 s per job, then it is stopped.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psutil  # noqa: E402

from benchmarks._common import Daemon, DevServer, free_port, machine  # noqa: E402
from benchmarks.bench_api import Db, log, pool_rate, wait_done  # noqa: E402

CORES = os.cpu_count() or 1
LIFE = "benchmarks.life_handlers:handle"
PLAIN = "benchmarks.handlers:burn"


def rows_wanted(baseline: str, recycle: int, otel: bool) -> list[tuple[str, str, str, tuple[str, ...], bool]]:
    """(row, handler, LIFE_BENCH_MODE, extra flags, from the baseline checkout)."""
    every = ("--max-jobs-per-child", str(recycle))
    rows = []
    if baseline:
        rows += [("baseline", PLAIN, "", (), True), ("baseline-recycle", PLAIN, "", every, True)]
    rows += [("plain", PLAIN, "", (), False), ("recycle", PLAIN, "", every, False),
             ("flushed", LIFE, "flushed", every, False), ("hooked", LIFE, "hooked", (), False)]
    if otel:
        rows.append(("traced", LIFE, "traced", (), False))
    return rows


def tree_cpu(proc: psutil.Process) -> tuple[float, float]:
    """CPU seconds of `proc` itself, and of its descendants: the live ones and those they have reaped."""
    own = sum(proc.cpu_times()[:2])
    rest = 0.0
    try:
        t = proc.cpu_times()
        rest += t.children_user + t.children_system
    except psutil.Error:
        pass
    for p in proc.children(recursive=True):
        try:
            t = p.cpu_times()
            rest += t.user + t.system + t.children_user + t.children_system
        except psutil.Error:
            pass
    return own, rest


def run_row(server: DevServer, tmp: str, row: str, handler: str, mode: str, extra: tuple[str, ...], root: Path | None,
            queue: str, payload: dict, count: int) -> dict:
    since = time.time()
    server.enqueue(queue, payload, count)
    db = Db(server.db, since)
    d = Daemon(server, tmp, queue, CORES, 0.1, extra=("--health-port", str(free_port()), *extra),
               worker_id=f"life-{queue}", root=root)
    d.cmd[d.cmd.index("--handler") + 1] = handler
    os.environ["LIFE_BENCH_MODE"] = mode  # the daemon's environment is read from this process's at launch
    try:
        d.start()
    finally:
        os.environ.pop("LIFE_BENCH_MODE", None)
    try:
        own0, kids0 = tree_cpu(d.ps)
        wait_done(db, queue, count, 60 + count * 0.5, d.alive)
        own1, kids1 = tree_cpu(d.ps)
    finally:
        code = d.stop()
    done, span = db.span(queue)
    return {"row": row, "jobs": count, "completed": done, "exit_code": code,
            "jobs_per_s": round(done / span, 2) if span else 0.0,
            "parent_cpu_us_per_job": round((own1 - own0) / max(1, done) * 1e6, 1),
            "children_cpu_us_per_job": round((kids1 - kids0) / max(1, done) * 1e6, 1)}


def median_of(runs: list[dict]) -> dict:
    """One row from its passes: the median of each figure, and the spread (max - min) of the CPU figures."""
    def med(key: str) -> float:
        values = sorted(r[key] for r in runs)
        return values[len(values) // 2]

    keys = ("jobs_per_s", "parent_cpu_us_per_job", "children_cpu_us_per_job")
    out = {**runs[0], **{k: med(k) for k in keys}, "passes": len(runs),
           "completed": min(r["completed"] for r in runs), "exit_code": max(r["exit_code"] or 0 for r in runs)}
    for k in keys[1:]:
        out[k.replace("_us_per_job", "_spread")] = round(max(r[k] for r in runs) - min(r[k] for r in runs), 1)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--baseline", default="", help="another checkout whose daemon gives the `baseline` rows")
    p.add_argument("--jobs", type=int, default=1000, help="jobs per row (default 1000)")
    p.add_argument("--ms", type=float, default=2.0, help="CPU ms per job (default 2)")
    p.add_argument("--delays", default="0,20", help="API latencies in ms, comma-separated (default 0,20)")
    p.add_argument("--recycle", type=int, default=100, help="--max-jobs-per-child of the recycling rows")
    p.add_argument("--repeat", type=int, default=1, help="passes over the rows; each figure their median")
    p.add_argument("--json", default="", help="also write the JSON here")
    args = p.parse_args()
    try:
        import opentelemetry.sdk.trace  # noqa: F401
        otel = True
    except ImportError:
        otel = False
        log("opentelemetry-sdk is not installed: no `traced` row")
    baseline = str(Path(args.baseline).resolve()) if args.baseline else ""
    if baseline and not (Path(baseline) / "supervisor" / "__main__.py").exists():
        print(f"error: --baseline {args.baseline} holds no supervisor package", file=sys.stderr)
        return 2
    payload = {"ms": args.ms}
    ideal = CORES * 1000.0 / args.ms
    out: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="life-bench-") as tmp:
        for delay in [int(x) for x in args.delays.split(",") if x.strip()]:
            server = DevServer(tmp, ("--fault-delay-ms", str(delay)), name=f"life{delay}").start()
            try:
                log(f"API latency {delay} ms: multiprocessing.Pool")
                pool = pool_rate(args.ms, args.jobs, False)
                runs: dict[str, list[dict]] = {}
                wanted = rows_wanted(baseline, args.recycle, otel)
                for rep in range(args.repeat):  # every other pass in reverse order: drift hits no row alone
                    for row, handler, mode, extra, old in (wanted if rep % 2 == 0 else wanted[::-1]):
                        log(f"API latency {delay} ms: {row} (pass {rep + 1})")
                        runs.setdefault(row, []).append(run_row(
                            server, tmp, row, handler, mode, extra, Path(baseline) if old else None,
                            f"life-{delay}-{row}-{rep}", payload, args.jobs))
                added = [{**median_of(runs[row]), "api_delay_ms": delay, "job_ms": args.ms} for row, *_ in wanted]
                log(f"API latency {delay} ms: multiprocessing.Pool again")
                pool = (pool + pool_rate(args.ms, args.jobs, False)) / 2
                for r in added:
                    r.update({"pool_jobs_per_s": round(pool, 2), "over_pool": round(r["jobs_per_s"] / pool, 4),
                              "efficiency": round(r["jobs_per_s"] / ideal, 4)})
                out += added
            finally:
                server.stop()
    print(f"{'latency':>7} {'row':17} {'jobs/s':>8} {'/Pool':>6} {'parent us/job':>13} {'children us/job':>15} "
          f"{'spread':>13}")
    for r in out:
        print(f"{r['api_delay_ms']:>5}ms {r['row']:17} {r['jobs_per_s']:>8.1f} {r['over_pool']:>6.3f} "
              f"{r['parent_cpu_us_per_job']:>13.1f} {r['children_cpu_us_per_job']:>15.1f} "
              f"{r['parent_cpu_spread']:>6.0f}/{r['children_cpu_spread']:<6.0f}")
    config = {"jobs": args.jobs, "job_ms": args.ms, "procs": CORES, "passes": args.repeat, "recycle": args.recycle,
              "baseline": bool(baseline)}
    result = {"machine": machine(), "config": config, "rows": out}
    line = json.dumps(result)
    print(line)
    if args.json:
        Path(args.json).write_text(line + "\n")
    return 0 if all(r["completed"] == r["jobs"] for r in out) else 1


if __name__ == "__main__":
    sys.exit(main())
