"""The job path under real API conditions: latency and a plan's request budget.

    python benchmarks/bench_api.py                    # every section, a few minutes
    python benchmarks/bench_api.py --quick            # fewer jobs
    python benchmarks/bench_api.py --sections latency --delays 0,20,50 --ms 20,100
    python benchmarks/bench_api.py --sections latency,noop --only ours,grpc   # REST against gRPC
    python benchmarks/bench_api.py --sections latency --only ours,grpc --repeat 3   # medians of 3 turns each

Sections, each run side by side in one go against dev servers on loopback:
  latency  the dev server answers every request `--fault-delay-ms` late (0, 20, 50 ms); CPU-bound jobs
           of d ms, --procs = cores. Rows: the daemon (claim-ahead, `--prefetch auto`), the daemon with
           `--prefetch 0` (claim only for idle children: the behaviour before claim-ahead), and the
           official SDK's SpooledWorker (concurrency = cores). Efficiency = jobs/s / (cores / d); p50/p99
           of the time a job waits claimed-but-not-started (from the daemon's /status). A row runs
           `--seconds` of ideal work and at least `--min-jobs` (100) jobs per core, so a batch's fixed
           costs (the first claim's round trip, the last report's, one child idle while the last job
           ends) stay a small share of it: 100 ms jobs run 10 s, not 4.
           With the grpc extra installed, a `grpc` row runs the daemon with --transport grpc too;
           `--baseline PATH` adds a `baseline` row: the daemon of another checkout (e.g. a
           `git worktree` of the commit before claim-ahead), on the same dev server, in the same run
           (and a `baseline-grpc` row, that daemon over gRPC, beside `grpc`).
  noop     no-op jobs at 0 ms: parent CPU per job (REST with claim-ahead three times, their median the
           figure; REST --prefetch 0 and gRPC once).
  fleet    two daemons on one queue, started and idle, then handed jobs of 2 s (sleep, so the cores do not
           limit it), 20 ms latency: makespan / ideal makespan, and how evenly the jobs split.
  budget   the dev server limits the organization to R requests/s (burst 2R, as Spooled's plans
           allow) for R = 5, 25, 100; 20 ms jobs. jobs/s, requests per job and 429s per 100 jobs,
           counted by the server itself (GET /_dev/stats), for the daemon and the SDK worker.

Progress is read from the dev server's SQLite file directly, so measuring spends no API request.
Throughput is jobs / (last completed_at - first started_at) from the server's own job records. The
`steady` column is the rate of the same stream between its 10th and 90th percentile completions: the
batch's ends left out (the first claim's round trip and one more before the first run time is known,
the last report's round trip, one child idle while the other ends the last job), which a daemon that
runs for days pays once. At 20-50 ms of latency they cost 20 ms jobs 1-3 points of a 4 s row.
Prints a table per section and one JSON line; `--json PATH` also writes it.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from statistics import median

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import requests  # noqa: E402

from benchmarks._common import Daemon, DevServer, SdkWorker, free_port, machine  # noqa: E402
from supervisor.parent.jobs.intake import HISTORY_MIN_JOBS  # noqa: E402

CORES = os.cpu_count() or 1
BASELINE = ""  # --baseline: another checkout whose daemon runs beside this one
STEADY_TRIM = 0.1  # the steady rate leaves out this share of a row's completions at each end


def pct(values: list[float], p: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    k = (len(s) - 1) * p / 100.0
    lo, hi = int(k), min(len(s) - 1, int(k) + 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


class Db:
    """Read-only view of the dev server's database: progress and job records at no API cost."""

    def __init__(self, path: str, since: float = 0.0):
        self.conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
        self.since = since  # only jobs created at or after this wall-clock time count (not a warm-up's)

    def finished(self, queue: str) -> int:
        row = self.conn.execute("SELECT count(*) FROM jobs WHERE queue_name=? AND created_at>=? AND status IN "
                                "('completed','failed','deadletter')", (queue, self.since)).fetchone()
        return int(row[0])

    def span(self, queue: str) -> tuple[int, float]:
        row = self.conn.execute("SELECT count(*), min(started_at), max(completed_at) FROM jobs WHERE queue_name=? "
                                "AND created_at>=? AND status='completed'", (queue, self.since)).fetchone()
        return int(row[0]), (row[2] - row[1]) if row[0] else 0.0

    def steady(self, queue: str, trim: float = STEADY_TRIM) -> tuple[int, float]:
        """(jobs, seconds) between the completions at the `trim` and 1 - `trim` quantiles: the rate of
        the stream once it runs, without the batch's ends (the first claim before any run time is
        known, the last report's round trip, one child idle while the other ends the last job)."""
        ends = sorted(r[0] for r in self.conn.execute("SELECT completed_at FROM jobs WHERE queue_name=? AND "
                                                      "created_at>=? AND status='completed'", (queue, self.since)))
        k = int(len(ends) * trim)
        if len(ends) - 2 * k < 2:
            return 0, 0.0
        return len(ends) - 2 * k - 1, ends[-k - 1] - ends[k]

    def by_worker(self, queue: str) -> dict[str, int]:
        rows = self.conn.execute("SELECT assigned_worker_id, count(*) FROM jobs WHERE queue_name=? AND "
                                 "status='completed' GROUP BY assigned_worker_id", (queue,)).fetchall()
        return {str(w): int(n) for w, n in rows}


def server_stats(server: DevServer) -> dict:
    r = requests.get(f"{server.url}/_dev/stats", headers={"Authorization": f"Bearer {server.key}"}, timeout=30)
    r.raise_for_status()
    return r.json()


def wait_done(db: Db, queue: str, count: int, timeout: float, alive) -> None:
    deadline = time.monotonic() + timeout
    while db.finished(queue) < count:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{queue}: jobs not finished within {timeout:.0f} s")
        if not alive():
            raise RuntimeError(f"{queue}: the worker exited while jobs were left")
        time.sleep(0.2)


def status(port: int) -> dict:
    return requests.get(f"http://127.0.0.1:{port}/status", timeout=10).json()


def settled_status(port: int, count: int, timeout: float = 2.0) -> dict:
    """/status once its snapshot counts every job's reserve wait: it is published at most every 100 ms, so
    a read just after the last completion may not have the last samples yet (the last read after `timeout`)."""
    deadline = time.monotonic() + timeout
    while True:
        st = status(port)
        if ((st.get("reserve_wait_ms") or {}).get("samples") or 0) >= count or time.monotonic() > deadline:
            return st
        time.sleep(0.05)


def run_worker(kind: str, server: DevServer, tmp: str, queue: str, payload: dict, count: int, procs: int,
               extra: tuple[str, ...] = (), settle: float = 0.0) -> dict:
    """Enqueue `count` jobs, then start the worker (so a rate limit is not spent on enqueueing while it
    runs), wait until they finish, stop it; figures from the server (this batch's jobs only)."""
    since = time.time()
    server.enqueue(queue, payload, count)
    if settle:
        time.sleep(settle)  # let the organization's token bucket refill after the enqueue
    before = server_stats(server)
    db = Db(server.db, since)
    port = free_port()
    if kind == "sdk":
        worker = SdkWorker(server, queue, procs, 0.005).start()
    else:
        root = Path(BASELINE) if kind.startswith("baseline") else None
        worker = Daemon(server, tmp, queue, procs, 0.1, extra=("--health-port", str(port), *extra),
                        worker_id=f"{kind}-{queue}", root=root).start()
    try:
        cpu0, server0 = worker.cpu(), server.cpu()
        wait_done(db, queue, count, 60 + count * 0.5, worker.alive)
        cpu, server_cpu = worker.cpu() - cpu0, server.cpu() - server0
        st = settled_status(port, count) if kind != "sdk" else {}
    finally:
        code = worker.stop()
    after = server_stats(server)
    done, span = db.span(queue)
    steady_jobs, steady_span = db.steady(queue)
    reqs = after["requests"] - before["requests"]
    limited = after["rate_limited"] - before["rate_limited"]
    return {"worker": kind, "jobs": count, "completed": done, "span_s": round(span, 3),
            "jobs_per_s": round(done / span, 2) if span else 0.0, "exit_code": code,
            "steady_jobs_per_s": round(steady_jobs / steady_span, 2) if steady_span else 0.0,
            "requests": reqs, "requests_per_job": round(reqs / max(1, done), 3),
            "rate_limited": limited, "rate_limited_per_100_jobs": round(100.0 * limited / max(1, done), 2),
            "by_route": {k: v - before["by_route"].get(k, 0) for k, v in after["by_route"].items()
                         if v - before["by_route"].get(k, 0)},
            "reserve_wait_ms": st.get("reserve_wait_ms"), "parent_requests_per_job": st.get("requests_per_job"),
            "parent_cpu_us_per_job": round(cpu / max(1, done) * 1e6, 1),
            "server_cpu_us_per_job": round(server_cpu / max(1, done) * 1e6, 1)}


def gaps(trace: str) -> dict | None:
    """p50 / p99 / max (ms) of the idle time between one child's jobs, from a trace file (`pid start end` lines
    written by benchmarks.handlers), and the count of gaps; None without a trace."""
    try:
        lines = Path(trace).read_text().split("\n")
    except OSError:
        return None
    runs: dict[str, list[tuple[float, float]]] = {}
    for line in lines:
        parts = line.split()
        if len(parts) == 3:
            runs.setdefault(parts[0], []).append((float(parts[1]), float(parts[2])))
    found = []
    for spans in runs.values():
        spans.sort()
        found += [(b[0] - a[1]) * 1000 for a, b in zip(spans, spans[1:], strict=False)]
    if not found:
        return None
    return {"p50": round(pct(found, 50) or 0, 2), "p99": round(pct(found, 99) or 0, 2), "max": round(max(found), 2),
            "count": len(found), "children": len(runs)}


def pool_rate(ms: float, count: int, sleep: bool) -> float:
    """Jobs per second of multiprocessing.Pool(cores).map over the same jobs (no queue: the ceiling of the
    machine at that moment), its workers started beforehand."""
    import multiprocessing

    from benchmarks.handlers import burn_ms

    ctx = multiprocessing.get_context("forkserver")
    pool = ctx.Pool(CORES)
    work, arg = (time.sleep, ms / 1000.0) if sleep else (burn_ms, ms)
    try:
        pool.map(work, [arg] * CORES * 2, chunksize=1)  # warm: every worker started
        t0 = time.perf_counter()
        pool.map(work, [arg] * count, chunksize=1)
        return count / (time.perf_counter() - t0)
    finally:
        pool.close()  # close + join: terminate() can leave a worker holding the task queue's lock
        pool.join()


def grpc_available() -> bool:
    try:
        import grpc  # noqa: F401
    except ImportError:
        return False
    return True


def workers(server: DevServer, args) -> list[tuple[str, tuple[str, ...]]]:
    """The runners of a latency row: ours, ours with --prefetch 0, ours over gRPC, the SDK worker; with
    --baseline, the other checkout's daemon over REST and over gRPC too."""
    rows = [("ours", ()), ("prefetch0", ("--prefetch", "0"))]
    if args.history:
        rows.append(("history", ()))
    if BASELINE:
        rows.append(("baseline", ()))
    if server.grpc:
        grpc = ("--transport", "grpc", "--grpc-url", server.grpc)
        rows.append(("grpc", grpc))
        if BASELINE:
            rows.append(("baseline-grpc", grpc))
    if not args.no_sdk:
        rows.append(("sdk", ()))
    if args.only:
        rows = [r for r in rows if r[0] in args.only]
    return rows


def warm_up(server: DevServer, tmp: str, queue: str, payload: dict) -> None:
    """Give `queue` the history of a queue in use: HISTORY_MIN_JOBS jobs like the row's, completed by another
    daemon (--until-empty), so the queue's statistics say its jobs are short, as they do when a daemon
    restarts on a queue that has been running."""
    server.enqueue(queue, payload, HISTORY_MIN_JOBS)
    warm = Daemon(server, tmp, queue, CORES, 0.1, extra=("--until-empty",), worker_id=f"warm-{queue}").start()
    deadline = time.monotonic() + 60
    while warm.alive():
        if time.monotonic() > deadline:
            warm.stop()
            raise TimeoutError(f"{queue}: the warm-up daemon did not finish within 60 s")
        time.sleep(0.1)


def server_flags(*flags: str) -> tuple[str, ...]:
    return (*flags, "--grpc-port", "0") if grpc_available() else flags


def latency_section(args, tmp: str) -> list[dict]:
    rows = []
    for delay in args.delays:
        server = DevServer(tmp, server_flags("--fault-delay-ms", str(delay)), name=f"lat{delay}").start()
        try:
            for ms in args.ms:
                count = max(args.min_jobs * CORES, int(args.seconds * CORES * 1000 / ms))
                ideal = CORES * 1000.0 / ms
                log(f"latency {delay} ms, jobs {ms:g} ms x {count}: multiprocessing.Pool")
                pools = [pool_rate(ms, count, args.sleep)]
                added = []
                runners = workers(server, args)
                for run in range(1, args.repeat + 1):
                    # turn by turn in opposite orders, so that neither side always runs first after Pool
                    for kind, extra in (runners if run % 2 else runners[::-1]):
                        queue = f"lat-{delay}-{int(ms)}-{kind}" + (f"-{run}" if args.repeat > 1 else "")
                        log(f"latency {delay} ms, jobs {ms:g} ms x {count}: {kind}" +
                            (f" (run {run})" if args.repeat > 1 else ""))
                        trace = os.path.join(tmp, f"trace-{queue}.txt")
                        payload = {"sleep_s": ms / 1000.0} if args.sleep else {"ms": ms}
                        if kind == "history":
                            warm_up(server, tmp, queue, payload)
                        r = run_worker(kind, server, tmp, queue, {**payload, "trace": trace}, count, CORES, extra)
                        r.update({"api_delay_ms": delay, "job_ms": ms, "run": run,
                                  "efficiency": round(r["jobs_per_s"] / ideal, 4),
                                  "steady_efficiency": round(r["steady_jobs_per_s"] / ideal, 4),
                                  "gap_ms": gaps(trace) if kind != "sdk" else None})
                        added.append(r)
                    log(f"latency {delay} ms, jobs {ms:g} ms x {count}: multiprocessing.Pool again")
                    pools.append(pool_rate(ms, count, args.sleep))
                pool = sum(pools) / len(pools)  # the mean of the runs around the rows
                for r in added:
                    r.update({"pool_jobs_per_s": round(pool, 2), "pool_efficiency": round(pool / ideal, 4),
                              "over_pool": round(r["jobs_per_s"] / pool, 4)})
                rows += added
        finally:
            server.stop()
    return rows


def latency_medians(rows: list[dict]) -> list[dict]:
    """Per (API delay, job length, worker): the median over its runs of the ratio to Pool, and the lowest
    and highest; the medians of the worker's CPU and the dev server's per job."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["api_delay_ms"], r["job_ms"], r["worker"]), []).append(r)
    out = []
    for (delay, ms, worker), runs in groups.items():
        values = sorted(r["over_pool"] for r in runs)
        out.append({"api_delay_ms": delay, "job_ms": ms, "worker": worker, "runs": len(values),
                    "over_pool_median": round(median(values), 4), "over_pool_min": values[0],
                    "over_pool_max": values[-1],
                    "parent_cpu_us_median": round(median([r["parent_cpu_us_per_job"] for r in runs]), 1),
                    "server_cpu_us_median": round(median([r["server_cpu_us_per_job"] for r in runs]), 1)})
    return out


def transports_compared(rows: list[dict], other: str = "grpc", base: str = "ours") -> list[dict]:
    """Per (API delay, job length) with both workers: `other` against `base` run by run (the two ran in the same
    turn, one right after the other): the median of the differences in the ratio to Pool, the lowest and highest,
    and in how many turns `other` was at or above `base`; the medians of their CPU per job, worker plus server."""
    turns: dict[tuple, dict[int, dict[str, dict]]] = {}
    for r in rows:
        if r["worker"] in (other, base):
            turns.setdefault((r["api_delay_ms"], r["job_ms"]), {}).setdefault(r["run"], {})[r["worker"]] = r
    out = []
    for (delay, ms), by_run in turns.items():
        pairs = [(t[other], t[base]) for t in by_run.values() if other in t and base in t]
        if not pairs:
            continue
        diffs = sorted(o["over_pool"] - b["over_pool"] for o, b in pairs)
        cpu = {name: round(median([r["parent_cpu_us_per_job"] + r["server_cpu_us_per_job"] for r in side]))
               for name, side in ((other, [o for o, _ in pairs]), (base, [b for _, b in pairs]))}
        out.append({"api_delay_ms": delay, "job_ms": ms, "other": other, "base": base, "turns": len(pairs),
                    "difference_median": round(median(diffs), 4), "difference_min": round(diffs[0], 4),
                    "difference_max": round(diffs[-1], 4), "other_at_or_above": sum(d >= 0 for d in diffs),
                    "other_cpu_us": cpu[other], "base_cpu_us": cpu[base]})
    return out


NOOP_REPEATS = 3  # the daemon's own no-op row (and the baseline's) runs this many times: its figure is their median


def noop_section(args, tmp: str) -> list[dict]:
    """No-op jobs on loopback: the parent's CPU per job is the figure (target: <= 150 us, the median of
    NOOP_REPEATS runs of this daemon, and of the baseline's, the two taking turns run by run so that a load
    that comes and goes hits both; the other runners once each)."""
    server = DevServer(tmp, server_flags(), name="noop").start()
    rows = []
    try:
        kinds = [(kind, extra) for kind, extra in workers(server, args) if kind not in ("sdk", "history")]
        for run in range(1, NOOP_REPEATS + 1):
            for kind, extra in kinds:
                if run > 1 and kind not in ("ours", "baseline"):
                    continue
                log(f"no-op jobs x {args.noop_jobs}: {kind} (run {run})")
                r = run_worker(kind, server, tmp, f"noop-{kind}-{run}", {}, args.noop_jobs, CORES, extra)
                rows.append({**r, "run": run})
    finally:
        server.stop()
    return rows


def noop_median(rows: list[dict], kind: str = "ours") -> float | None:
    """The median parent CPU per no-op job (us) of `kind`'s runs."""
    values = sorted(r["parent_cpu_us_per_job"] for r in rows if r["worker"] == kind)
    return values[len(values) // 2] if values else None


def fleet_section(args, tmp: str) -> dict:
    delay, secs, per = 20, 2.0, CORES
    server = DevServer(tmp, ("--fault-delay-ms", str(delay)), name="fleet").start()
    daemons = []
    try:
        queue = "fleet"
        count = args.fleet_jobs
        for i in range(2):  # both up and idle first, as a fleet in service is, then the jobs arrive
            daemons.append(Daemon(server, tmp, queue, per, 0.1, worker_id=f"fleet-{i}").launch())
        for d in daemons:
            d.wait_ready()
        ids = server.enqueue(queue, {"sleep_s": secs}, count)
        db = Db(server.db)
        wait_done(db, queue, len(ids), 120 + count * secs, lambda: all(d.alive() for d in daemons))
        done, span = db.span(queue)
        split = db.by_worker(queue)
    finally:
        for d in daemons:
            d.stop()
        server.stop()
    slots = 2 * per
    ideal = -(-count // slots) * secs
    return {"daemons": 2, "procs_each": per, "jobs": count, "job_s": secs, "api_delay_ms": delay,
            "completed": done, "makespan_s": round(span, 3), "ideal_makespan_s": ideal,
            "makespan_over_ideal": round(span / ideal, 4), "split": split}


def budget_section(args, tmp: str) -> list[dict]:
    rows = []
    for rps in args.rates:
        server = DevServer(tmp, ("--rate-limit", str(rps), "--rate-burst", str(2 * rps)), name=f"rate{rps}").start()
        try:
            count = max(40, int(rps * args.budget_seconds))
            for kind in ("ours", "sdk"):
                if kind == "sdk" and args.no_sdk:
                    continue
                queue = f"rate-{rps}-{kind}"
                log(f"budget {rps} req/s, {count} jobs of 20 ms: {kind}")
                r = run_worker(kind, server, tmp, queue, {"ms": 20}, count, CORES, settle=2.0 + 2 * count / 100 / rps)
                r.update({"rate_limit_rps": rps})
                rows.append(r)
        finally:
            server.stop()
    return rows


def table(result: dict) -> str:
    out = []
    if result.get("latency"):
        out.append("API latency (efficiency = jobs/s / (cores / d); / Pool = jobs/s over multiprocessing.Pool's on the "
                   "same jobs in the same run, the mean of a run before and after the row's workers; gaps = a "
                   "child's idle time between jobs):")
        out.append(f"{'delay':>6} {'job':>5} {'worker':>10} {'jobs/s':>8} {'eff':>6} {'Pool eff':>8} {'/ Pool':>7} "
                   f"{'steady':>6} {'reserve p50/p99 ms':>20} {'gap p50/p99/max ms':>20}")
        for r in result["latency"]:
            w = r.get("reserve_wait_ms") or {}
            rw = f"{w.get('p50', '-')}/{w.get('p99', '-')}" if w else "-"
            g = r.get("gap_ms") or {}
            gw = f"{g['p50']}/{g['p99']}/{g['max']}" if g else "-"
            out.append(f"{r['api_delay_ms']:>6} {r['job_ms']:>5g} {r['worker']:>10} {r['jobs_per_s']:>8} "
                       f"{r['efficiency']:>6} {r.get('pool_efficiency', '-'):>8} {r.get('over_pool', '-'):>7} "
                       f"{r.get('steady_efficiency', '-'):>6} {rw:>20} {gw:>20}")
        if any(m["runs"] > 1 for m in result.get("latency_medians") or []):
            out.append("The same, the median of each worker's runs (the runs taking turns in opposite orders):")
            out.append(f"{'delay':>6} {'job':>5} {'worker':>10} {'runs':>4} {'/ Pool':>7} {'lowest':>7} {'highest':>7} "
                       f"{'worker us':>9} {'server us':>9}")
            for m in result["latency_medians"]:
                out.append(f"{m['api_delay_ms']:>6} {m['job_ms']:>5g} {m['worker']:>10} {m['runs']:>4} "
                           f"{m['over_pool_median']:>7} {m['over_pool_min']:>7} {m['over_pool_max']:>7} "
                           f"{m['parent_cpu_us_median']:>9.0f} {m['server_cpu_us_median']:>9.0f}")
        if result.get("transports"):
            out.append("gRPC against REST turn by turn (the two ran one after the other in each turn): the "
                       "difference in / Pool, gRPC's minus REST's; CPU per job = the daemon's plus the dev server's:")
            out.append(f"{'delay':>6} {'job':>5} {'turns':>5} {'median':>7} {'lowest':>7} {'highest':>7} "
                       f"{'gRPC >= REST':>12} {'gRPC us':>8} {'REST us':>8}")
            for c in result["transports"]:
                out.append(f"{c['api_delay_ms']:>6} {c['job_ms']:>5g} {c['turns']:>5} {c['difference_median']:>+7.4f} "
                           f"{c['difference_min']:>+7.4f} {c['difference_max']:>+7.4f} "
                           f"{str(c['other_at_or_above']) + ' of ' + str(c['turns']):>12} "
                           f"{c['other_cpu_us']:>8} {c['base_cpu_us']:>8}")
    if result.get("noop"):
        base = noop_median(result["noop"], "baseline")
        out.append(f"No-op jobs (parent CPU per job, idle included; ours: median of its runs "
                   f"{noop_median(result['noop'])} us" + (f", baseline's {base} us" if base is not None else "") + "):")
        for r in result["noop"]:
            out.append(f"  {r['worker']:>10} run {r.get('run', 1)}: {r['parent_cpu_us_per_job']} us/job, "
                       f"{r['requests_per_job']} REST requests/job")
    if result.get("fleet"):
        f = result["fleet"]
        out.append(f"fleet: 2 daemons x {f['procs_each']}, {f['jobs']} jobs of {f['job_s']} s at "
                   f"{f['api_delay_ms']} ms:"
                   f" makespan {f['makespan_s']} s / ideal {f['ideal_makespan_s']} s = {f['makespan_over_ideal']}; "
                   f"split {f['split']}")
    if result.get("budget"):
        out.append("Request budget (20 ms jobs; requests counted by the server):")
        out.append(f"{'rps':>5} {'worker':>7} {'jobs/s':>8} {'req/job':>8} {'429/100 jobs':>13}")
        for r in result["budget"]:
            out.append(f"{r['rate_limit_rps']:>5} {r['worker']:>7} {r['jobs_per_s']:>8} {r['requests_per_job']:>8} "
                       f"{r['rate_limited_per_100_jobs']:>13}")
    return "\n".join(out)


def main_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--sections", default="latency,noop,fleet,budget")
    ap.add_argument("--delays", default="0,20,50")
    ap.add_argument("--ms", default="5,20,100")
    ap.add_argument("--rates", default="5,25,100")
    ap.add_argument("--repeat", type=int, default=1, help="run each latency row's workers this many times, taking "
                    "turns in opposite orders (Pool again after each turn); a table of each worker's median follows "
                    "(default 1)")
    ap.add_argument("--seconds", type=float, help="ideal seconds of work per latency row (default 4, quick 1.5)")
    ap.add_argument("--min-jobs", type=int, help="jobs per core per latency row at least (default 100, quick 10): "
                    "a batch's fixed costs (the first claim's round trip, before any run time is known; the last "
                    "report's; one child idle while the other ends the last job) stay a small share of it")
    ap.add_argument("--budget-seconds", type=float, help="seconds of plan budget per budget row (default 20, quick 8)")
    ap.add_argument("--fleet-jobs", type=int, help="jobs in the fleet run (default 24, quick 12)")
    ap.add_argument("--noop-jobs", type=int, help="jobs per no-op row (default 3000, quick 600)")
    ap.add_argument("--no-sdk", action="store_true", help="skip the SDK worker rows")
    ap.add_argument("--only", type=lambda v: [w.strip() for w in v.split(",") if w.strip()], default=[],
                    help="run only these rows of the latency and no-op sections, comma-separated (ours, prefetch0, "
                    "grpc, sdk, history, baseline, baseline-grpc); multiprocessing.Pool always runs")
    ap.add_argument("--history", action="store_true", help="add a `history` latency row: the daemon on a queue whose "
                    "statistics already say its jobs are short (a warm-up daemon completes 20 of them first), as "
                    "when a daemon restarts on a queue in use; its first claim reaches ahead")
    ap.add_argument("--sleep", action="store_true", help="latency rows sleep d ms instead of burning CPU (a loaded "
                    "machine then measures the pipeline, not the cores)")
    ap.add_argument("--json", help="also write the JSON here")
    ap.add_argument("--baseline", help="a checkout (e.g. a git worktree of an older commit) whose daemon runs as a "
                    "`baseline` row beside this one (and as `baseline-grpc` over gRPC, with the grpc extra)")
    args = ap.parse_args(argv)
    args.delays = [int(x) for x in args.delays.split(",")]
    args.ms = [float(x) for x in args.ms.split(",")]
    args.rates = [int(x) for x in args.rates.split(",")]
    args.seconds = args.seconds or (1.5 if args.quick else 4.0)
    args.min_jobs = args.min_jobs or (10 if args.quick else 100)
    args.budget_seconds = args.budget_seconds or (8.0 if args.quick else 20.0)
    args.fleet_jobs = args.fleet_jobs or (12 if args.quick else 24)
    args.noop_jobs = args.noop_jobs or (600 if args.quick else 3000)
    global BASELINE
    BASELINE = args.baseline or ""
    return args


def main(argv=None) -> int:
    args = main_args(argv)
    sections = set(args.sections.split(","))
    result: dict = {"machine": machine(), "command": " ".join(["python", "benchmarks/bench_api.py", *sys.argv[1:]])}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="spooled-bench-api-") as tmp:
        if "latency" in sections:
            result["latency"] = latency_section(args, tmp)
            result["latency_medians"] = latency_medians(result["latency"])
            result["transports"] = transports_compared(result["latency"])
        if "noop" in sections:
            result["noop"] = noop_section(args, tmp)
        if "fleet" in sections:
            result["fleet"] = fleet_section(args, tmp)
        if "budget" in sections:
            result["budget"] = budget_section(args, tmp)
    result["elapsed_s"] = round(time.monotonic() - started, 1)
    print(table(result))
    print(json.dumps(result))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
