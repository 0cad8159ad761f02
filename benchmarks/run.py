"""Every daemon benchmark against one dev server, as one command; prints a table and writes JSON.

    python benchmarks/run.py            # full run (about 22 minutes); writes benchmarks/results/latest.json
                                        # and benchmarks/RESULTS.md
    python benchmarks/run.py --quick    # short version (a few minutes)

Sections:
  efficiency  M CPU-bound jobs of d ms (5, 20, 100) through the daemon with --procs = cores:
              throughput / ideal (cores / d), beside multiprocessing.Pool on the same function
  sdk         the official SDK's SpooledWorker (concurrency = --procs) on the same jobs: ours / its
  overhead    daemon parent CPU per job and dev server CPU per job on no-op jobs (idle subtracted),
              end-to-end no-op jobs per second
  latency     enqueue -> handler start on an idle daemon, p50 / p99
  memory      parent RSS; each child's RSS and USS above a bare python importing the handler
  scaling     throughput for --procs 1 .. 2 x cores on 20 ms jobs
  fleet       (benchmarks/fleet.py) 16 daemons x 4 children idle, then 640 jobs of 0.5 s at once: each
              daemon's first start, makespan, the split, idle requests/s (--no-fleet skips it)
  api         (benchmarks/bench_api.py) the job path with the API 0 / 20 / 50 ms away: the daemon beside
              itself with --prefetch 0 and beside the SDK worker; a two-daemon fleet on 2 s jobs; and
              plan rate limits of 5 / 25 / 100 requests/s (requests per job counted by the dev server)

Throughput is jobs / (last completed_at - first started_at), from the server's own job records.
Every job burns CPU in `benchmarks.handlers.burn` (thread CPU time; see that module for why).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psutil  # noqa: E402

from benchmarks import bench_api, fleet  # noqa: E402
from benchmarks._common import (  # noqa: E402
    ROOT,
    Daemon,
    DevServer,
    SdkWorker,
    bare_process_memory,
    cpu_seconds,
    machine,
    machine_busy,
    parse_time,
    span_of,
    tree_cpu,
)
from benchmarks.handlers import burn_ms  # noqa: E402

MIB = 2**20
# Ratios to multiprocessing.Pool on the same jobs in the same run, by (API latency ms, job ms).
OVER_POOL_TARGETS = {(0, 5.0): 0.85, (0, 20.0): 0.95, (0, 100.0): 0.98,
                     (20, 5.0): 0.80, (20, 20.0): 0.95, (20, 100.0): 0.98,
                     (50, 5.0): 0.75, (50, 20.0): 0.93, (50, 100.0): 0.98}
SDK_RATIO = 2.0  # the daemon's jobs/s over the official SDK worker's, in every row, at least
TWO_DAEMONS_MAKESPAN = 1.05  # two daemons sharing 2 s jobs: makespan over the ideal, at most
BUDGET_TARGETS = {25: 21.0, 5: 4.0}  # jobs/s targets under a plan's requests/s
FLEET = {"makespan_over_ideal": 1.10, "most_over_fair": 0.20, "idle_rps": 0.1}  # the 16-daemon fleet (fleet.py)
FINDINGS = "## Findings"
TARGETS = {"sdk_ratio": SDK_RATIO, "parent_cpu_us": 150.0, "parent_rss_mib": 60.0}


def pct(values: list[float], p: float) -> float:
    if not values:
        return 0.0
    s = sorted(values)
    k = (len(s) - 1) * p / 100.0
    lo, hi = int(k), min(len(s) - 1, int(k) + 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def job_count(seconds: float, cores: int, ms: float) -> int:
    """Jobs for about `seconds` of ideal processing, a multiple of the cores (no tail with one idle core)."""
    n = max(2, round(seconds * 1000.0 / ms)) * cores
    return int(n)


def adjusted(jobs_per_s: float, ms: float, usable: int, other: float) -> float:
    """Efficiency against the CPU the rest of the machine left free: jobs/s x d / min(usable, cores - other load)."""
    free = min(usable, (os.cpu_count() or 1) - other)
    return round(jobs_per_s * ms / 1000.0 / max(0.25, free), 4)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ------------------------------------------------------------------ phases
def run_batch(server: DevServer, worker, queue: str, payload, count: int, expected_secs: float,
              idle_rates: dict | None = None) -> dict:
    """Enqueue `count` jobs to an idle, ready worker; wait until they finish; measure from the server records."""
    base = server.finished()
    me = psutil.Process()
    ours0, busy0 = tree_cpu(worker.ps) + server.cpu() + cpu_seconds(me), machine_busy()
    cpu0 = {"worker": worker.cpu(), "server": server.cpu()}
    t0 = time.monotonic()
    ids = server.enqueue(queue, payload, count)
    server.wait_finished(base + count, timeout=30 + 5 * expected_secs, alive=worker.alive)
    wall = time.monotonic() - t0
    cpu1 = {"worker": worker.cpu(), "server": server.cpu()}
    ours1, busy1 = tree_cpu(worker.ps) + server.cpu() + cpu_seconds(me), machine_busy()
    records = server.jobs(queue, ids)
    done = sum(1 for j in records if j["status"] == "completed")
    span = span_of(records)
    out = {"jobs": count, "completed": done, "span_s": round(span, 4), "wall_s": round(wall, 3),
           "jobs_per_s": done / span if span > 0 else 0.0,
           "other_load_cores": round(max(0.0, (busy1 - busy0) - (ours1 - ours0)) / wall, 3)}
    for name in ("worker", "server"):
        used = cpu1[name] - cpu0[name]
        idle = (idle_rates or {}).get(name, 0.0) * wall
        out[f"{name}_cpu_s"] = round(used, 4)
        out[f"{name}_cpu_us_per_job"] = max(0.0, used - idle) / count * 1e6
    return out


def idle_cpu(server: DevServer, worker, secs: float) -> dict:
    """CPU seconds per second the worker and the server use with nothing to do."""
    a = {"worker": worker.cpu(), "server": server.cpu()}
    time.sleep(secs)
    b = {"worker": worker.cpu(), "server": server.cpu()}
    return {k: (b[k] - a[k]) / secs for k in a}


def pool_throughput(cores: int, ms: float, count: int) -> tuple[float, float]:
    """Jobs per second of multiprocessing.Pool(cores).map over the same function, and the other load (cores)."""
    ctx = multiprocessing.get_context("forkserver")
    pool = ctx.Pool(cores)
    try:
        pool.map(burn_ms, [1.0] * cores * 2, chunksize=1)  # warm: every worker started
        me = psutil.Process()
        ours0, busy0 = tree_cpu(me), machine_busy()
        t0 = time.perf_counter()
        pool.map(burn_ms, [ms] * count, chunksize=1)
        wall = time.perf_counter() - t0
        other = max(0.0, (machine_busy() - busy0) - (tree_cpu(me) - ours0)) / wall
        return count / wall, round(other, 3)
    finally:
        # close + join, not the context manager's terminate(): a worker SIGTERMed while it holds the
        # task queue's lock leaves the others blocked on it for ever (seen under coverage in CI's run).
        pool.close()
        pool.join()


def enqueue_cost(server: DevServer, count: int) -> float:
    """Server CPU seconds per enqueued job (bulk, 100 a request), on a queue nobody serves."""
    c0 = server.cpu()
    server.enqueue("bench-sink", {}, count)
    return (server.cpu() - c0) / count


def latency(server: DevServer, queue: str, samples: int, gap: tuple[float, float]) -> dict:
    """Enqueue one job at a time on an idle daemon; handler start (its own clock) vs created_at / claim."""
    ids = []
    rng = random.Random(6)
    for _ in range(samples):
        time.sleep(rng.uniform(*gap))
        job_id = server.api.create_job(queue, {"stamp": 1})["id"]
        ids.append(job_id)
        deadline = time.monotonic() + 30
        while server.api.get(f"/api/v1/jobs/{job_id}")["status"] != "completed":
            if time.monotonic() > deadline:
                raise TimeoutError("latency job not completed within 30 s")
            time.sleep(0.005)
    to_start, claim_to_start = [], []
    for job_id in ids:
        job = server.api.get(f"/api/v1/jobs/{job_id}")
        t0 = (job.get("result") or {}).get("t0")
        created, started = parse_time(job.get("created_at")), parse_time(job.get("started_at"))
        if t0 and created and started:
            to_start.append((t0 - created) * 1000)
            claim_to_start.append((t0 - started) * 1000)

    def summary(v):
        return {"p50": round(pct(v, 50), 2), "p99": round(pct(v, 99), 2), "max": round(max(v), 2) if v else 0.0}

    return {"samples": len(to_start), "enqueue_to_start_ms": summary(to_start),
            "claim_to_start_ms": summary(claim_to_start)}


def memory(daemon: Daemon) -> dict:
    parent = daemon.ps.memory_info().rss
    kids = []
    for p in daemon.children():
        info = p.memory_full_info()
        kids.append((info.rss, info.uss))
    bare_rss, bare_uss = bare_process_memory()
    mean = lambda xs: sum(xs) / len(xs) if xs else 0.0  # noqa: E731
    rss = mean([k[0] for k in kids])
    uss = mean([k[1] for k in kids])
    return {"parent_rss_mib": round(parent / MIB, 2), "children": len(kids),
            "child_rss_mib": round(rss / MIB, 2), "child_uss_mib": round(uss / MIB, 2),
            "bare_rss_mib": round(bare_rss / MIB, 2), "bare_uss_mib": round(bare_uss / MIB, 2),
            "child_rss_above_bare_mib": round((rss - bare_rss) / MIB, 2),
            "child_uss_above_bare_mib": round((uss - bare_uss) / MIB, 2)}


# ------------------------------------------------------------------- main
def run(args) -> dict:
    cores = os.cpu_count() or 1
    procs = args.procs or cores
    durations = [float(x) for x in args.ms.split(",")]
    result = {"machine": machine(), "command": " ".join(["python", "benchmarks/run.py", *sys.argv[1:]]),
              "config": {"procs": procs, "durations_ms": durations, "seconds_per_run": args.seconds,
                         "daemon_poll_interval_s": args.poll_interval, "daemon_log_level": "INFO (default)",
                         "sdk_poll_interval_s": args.sdk_poll_interval, "sdk_concurrency": procs,
                         "noop_jobs": args.noop_jobs, "latency_samples": args.latency_samples}}
    started = time.monotonic()
    counts = {ms: job_count(args.seconds, procs, ms) for ms in durations}

    # 1a. multiprocessing.Pool, no queue: before any worker runs, so nothing competes for the cores
    log(f"pool: {procs} processes, jobs {counts}")
    pool, pool_other = {}, {}
    for ms in durations:
        pool[ms], pool_other[ms] = pool_throughput(procs, ms, counts[ms])

    with tempfile.TemporaryDirectory(prefix="spooled-bench-") as tmp:
        server = DevServer(tmp).start()
        daemon = sdk = None
        try:
            enq_cost = enqueue_cost(server, args.noop_jobs)
            # 1b + 3 + 4 + 5: one daemon with --procs = cores
            queue = "bench-main"
            daemon = Daemon(server, tmp, queue, procs, args.poll_interval).start()
            time.sleep(0.5)  # let start-up settle
            idle = idle_cpu(server, daemon, args.idle_seconds)
            efficiency = []
            for ms in durations:
                log(f"daemon: {counts[ms]} jobs of {ms:g} ms")
                r = run_batch(server, daemon, queue, {"ms": ms}, counts[ms], counts[ms] * ms / 1000 / procs, idle)
                ideal = min(procs, cores) * 1000.0 / ms
                usable = min(procs, cores)
                efficiency.append({"ms": ms, "jobs": r["jobs"], "completed": r["completed"], "span_s": r["span_s"],
                                   "ideal_jobs_per_s": round(ideal, 2),
                                   "daemon_jobs_per_s": round(r["jobs_per_s"], 2),
                                   "daemon_efficiency": round(r["jobs_per_s"] / ideal, 4),
                                   "pool_jobs_per_s": round(pool[ms], 2),
                                   "pool_efficiency": round(pool[ms] / ideal, 4),
                                   "daemon_over_pool": round(r["jobs_per_s"] / pool[ms], 4),
                                   "other_load_cores_daemon": r["other_load_cores"],
                                   "other_load_cores_pool": pool_other[ms],
                                   "daemon_efficiency_load_adjusted": adjusted(r["jobs_per_s"], ms, usable,
                                                                               r["other_load_cores"]),
                                   "pool_efficiency_load_adjusted": adjusted(pool[ms], ms, usable, pool_other[ms]),
                                   "parent_cpu_us_per_job": round(r["worker_cpu_us_per_job"], 1)})
            log(f"daemon: {args.noop_jobs} no-op jobs")
            time.sleep(0.3)
            noop = run_batch(server, daemon, queue, {}, args.noop_jobs, args.noop_jobs / 500.0, idle)
            overhead = {"noop_jobs": noop["jobs"], "completed": noop["completed"],
                        "parent_cpu_us_per_job": round(noop["worker_cpu_us_per_job"], 1),
                        "server_cpu_us_per_job": round(max(0.0, noop["server_cpu_us_per_job"] - enq_cost * 1e6), 1),
                        "server_enqueue_cpu_us_per_job": round(enq_cost * 1e6, 1),
                        "noop_jobs_per_s": round(noop["jobs_per_s"], 1),
                        "other_load_cores": noop["other_load_cores"],
                        "parent_idle_cpu_percent": round(idle["worker"] * 100, 2),
                        "server_idle_cpu_percent": round(idle["server"] * 100, 2)}
            log(f"daemon: latency, {args.latency_samples} samples")
            lat = latency(server, queue, args.latency_samples, (0.05, 0.25))
            lat["daemon_poll_interval_s"] = args.poll_interval
            mem = memory(daemon)
            code = daemon.stop()
            daemon = None
            if code != 0:
                raise RuntimeError(f"the daemon exited with {code}")

            # 2. the official SDK worker, same jobs, same server
            queue = "bench-sdk"
            sdk = SdkWorker(server, queue, procs, args.sdk_poll_interval).start()
            sdk_rows = []
            for ms, row in zip(durations, efficiency, strict=True):  # one efficiency row per duration, just above
                log(f"sdk: {counts[ms]} jobs of {ms:g} ms")
                r = run_batch(server, sdk, queue, {"ms": ms}, counts[ms], 2 * counts[ms] * ms / 1000 / procs)
                sdk_rows.append({"ms": ms, "jobs": r["jobs"], "completed": r["completed"],
                                 "sdk_jobs_per_s": round(r["jobs_per_s"], 2),
                                 "sdk_efficiency": round(r["jobs_per_s"] / row["ideal_jobs_per_s"], 4),
                                 "daemon_jobs_per_s": row["daemon_jobs_per_s"],
                                 "other_load_cores": r["other_load_cores"],
                                 "ratio": (round(row["daemon_jobs_per_s"] / r["jobs_per_s"], 3)
                                           if r["jobs_per_s"] else 0.0)})
            sdk.stop()
            sdk = None

            # 6. scaling, 20 ms jobs (or the middle duration)
            sms = 20.0 if 20.0 in durations else durations[len(durations) // 2]
            scaling = []
            for n in args.scaling:
                queue = f"bench-scale-{n}"
                count = job_count(args.seconds, min(n, cores), sms)
                count -= count % n if count % n and count > n else 0
                log(f"scaling: --procs {n}, {count} jobs of {sms:g} ms")
                daemon = Daemon(server, tmp, queue, n, args.poll_interval).start()
                r = run_batch(server, daemon, queue, {"ms": sms}, count, count * sms / 1000 / min(n, cores))
                daemon.stop()
                daemon = None
                ideal = min(n, cores) * 1000.0 / sms
                scaling.append({"procs": n, "jobs": r["jobs"], "completed": r["completed"],
                                "jobs_per_s": round(r["jobs_per_s"], 2),
                                "efficiency": round(r["jobs_per_s"] / ideal, 4),
                                "other_load_cores": r["other_load_cores"],
                                "efficiency_load_adjusted": adjusted(r["jobs_per_s"], sms, min(n, cores),
                                                                     r["other_load_cores"])})
            one = next((s["jobs_per_s"] for s in scaling if s["procs"] == 1), None)
            for s in scaling:
                s["speedup_over_1"] = round(s["jobs_per_s"] / one, 3) if one else None
        finally:
            for w in (daemon, sdk):
                if w is not None:
                    w.stop()
            server.stop()

    result.update({"efficiency": efficiency, "sdk": {"poll_interval_s": args.sdk_poll_interval, "concurrency": procs,
                                                     "rows": sdk_rows},
                   "overhead": overhead, "latency": lat, "memory": mem,
                   "scaling": {"ms": sms, "rows": scaling}})
    if not args.no_fleet:
        result["fleet"] = fleet_section(args)
    if not args.no_api:
        result["api"] = api_sections(args)
    result["targets"] = targets(result)
    result["elapsed_s"] = round(time.monotonic() - started, 1)
    return result


def api_sections(args) -> dict:
    """The API-latency, fleet and request-budget sections of benchmarks/bench_api.py, in this run."""
    q = args.quick
    flags = (["--quick"] if q else []) + (["--baseline", args.baseline] if args.baseline else [])
    api_args = bench_api.main_args(flags)
    out: dict = {}
    with tempfile.TemporaryDirectory(prefix="spooled-bench-api-") as tmp:
        log("api: latency 0 / 20 / 50 ms")
        out["latency"] = bench_api.latency_section(api_args, tmp)
        log("api: no-op jobs over REST and gRPC")
        out["noop"] = bench_api.noop_section(api_args, tmp)
        log("api: fleet")
        out["fleet"] = bench_api.fleet_section(api_args, tmp)
        log("api: request budget 5 / 25 / 100 req/s")
        out["budget"] = bench_api.budget_section(api_args, tmp)
    return out


def fleet_section(args) -> dict:
    """benchmarks/fleet.py's fleet (16 daemons x 4 children idle, then a burst), listening for events; a small
    fleet with --quick."""
    small = ["--daemons", "4", "--jobs", "80", "--idle-s", "5", "--settle-s", "3"] if args.quick else []
    fleet_args = fleet.parse(small)
    with tempfile.TemporaryDirectory(prefix="spooled-bench-fleet-") as tmp:
        log(f"fleet: {fleet_args.daemons} daemons x {fleet_args.procs}, idle then {fleet_args.jobs} jobs")
        return {"command": " ".join(["python", "benchmarks/fleet.py", *small]),
                "modes": [fleet.run_mode(fleet_args, "events", tmp)]}


def targets(r: dict) -> list[dict]:
    """Each target as (name, value, op, target, load-adjusted value, steady value)."""
    cpu_rows = [row for row in r["sdk"]["rows"]]
    api = r.get("api") or {}
    out = []
    for e in r["efficiency"]:
        if (0, e["ms"]) in OVER_POOL_TARGETS:
            out.append((f"daemon / Pool, loopback, {e['ms']:g} ms jobs (one daemon, warm)", e["daemon_over_pool"],
                        ">=", OVER_POOL_TARGETS[(0, e["ms"])], None, None))
    if cpu_rows:
        out.append(("throughput / SDK worker, loopback (lowest over d)", min(x["ratio"] for x in cpu_rows), ">=",
                    TARGETS["sdk_ratio"], None, None))
    noop = bench_api.noop_median(api.get("noop", [])) if api.get("noop") else None
    out.append(("parent CPU per no-op job (us), median of three" if noop is not None else
                "parent CPU per no-op job (us)", noop if noop is not None else r["overhead"]["parent_cpu_us_per_job"],
                "<=", TARGETS["parent_cpu_us"], None, None))
    out.append(("parent RSS (MiB)", r["memory"]["parent_rss_mib"], "<=", TARGETS["parent_rss_mib"], None, None))
    rows = api.get("latency", [])
    for row in rows:
        key = (row["api_delay_ms"], row["job_ms"])
        if row["worker"] == "ours" and key in OVER_POOL_TARGETS and "over_pool" in row:
            out.append((f"daemon / Pool at {key[0]} ms API latency, {key[1]:g} ms jobs (cold start)", row["over_pool"],
                        ">=", OVER_POOL_TARGETS[key], None, None))
    for row in rows:
        sdk = next((x for x in rows if x["worker"] == "sdk" and x["api_delay_ms"] == row["api_delay_ms"]
                    and x["job_ms"] == row["job_ms"]), None)
        if row["worker"] == "ours" and sdk and sdk["jobs_per_s"]:
            out.append((f"daemon / SDK worker at {row['api_delay_ms']} ms API latency, {row['job_ms']:g} ms jobs",
                        round(row["jobs_per_s"] / sdk["jobs_per_s"], 3), ">=", SDK_RATIO, None, None))
    if api.get("fleet"):
        out.append(("two daemons sharing 2 s jobs: makespan / ideal", api["fleet"]["makespan_over_ideal"], "<=",
                    TWO_DAEMONS_MAKESPAN, None, None))
    for row in api.get("budget", []):
        if row["worker"] == "ours" and row["rate_limit_rps"] in BUDGET_TARGETS:
            out.append((f"jobs/s under a {row['rate_limit_rps']} req/s plan", row["jobs_per_s"], ">=",
                        BUDGET_TARGETS[row["rate_limit_rps"]], None, None))
    for f in r.get("fleet", {}).get("modes", []):
        first = f["first_start_ms"]
        name = f"fleet of {f['daemons']} x {f['procs_each']} ({f['wake']})"
        out += [(f"{name}: makespan / ideal", f["makespan_over_ideal"], "<=", FLEET["makespan_over_ideal"], None, None),
                (f"{name}: slowest first start (ms)", first["max"], "<=", first["target_ms"], None, None),
                (f"{name}: most above fair share", f["most_over_fair"], "<=", FLEET["most_over_fair"], None, None),
                (f"{name}: idle requests/s beyond heartbeats, worst daemon",
                 max(f["idle_before"]["beyond_heartbeats_max"], f["idle_after"]["beyond_heartbeats_max"]), "<=",
                 FLEET["idle_rps"], None, None)]
    return [{"name": n, "value": v, "op": op, "target": t, "met": bool(v >= t if op == ">=" else v <= t),
             "load_adjusted": adj, "met_load_adjusted": None if adj is None else bool(adj >= t),
             "steady": steady, "met_steady": None if steady is None else bool(steady >= t)}
            for n, v, op, t, adj, steady in out]


# ------------------------------------------------------------------ output
def table(r: dict) -> str:
    m, c = r["machine"], r["config"]
    lines = [f"machine: {m['cpu_model']}, {m['cores']} cores, Python {m['python']}, {m['date']}",
             f"daemon --procs {c['procs']}, --poll-interval {c['daemon_poll_interval_s']} s, log level INFO; "
             f"SDK SpooledWorker concurrency {c['sdk_concurrency']}, poll_interval {c['sdk_poll_interval_s']} s", ""]
    lines += ["1. efficiency (throughput / ideal cores/d) and 2. against the official SDK worker",
              "| d (ms) | jobs | ideal jobs/s | daemon jobs/s | daemon eff. | Pool eff. | daemon/Pool | SDK jobs/s "
              "| SDK eff. | daemon/SDK | parent CPU us/job | other load, cores (daemon/Pool/SDK) "
              "| load-adj. eff. daemon/Pool |",
              "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for e, s in zip(r["efficiency"], r["sdk"]["rows"], strict=False):
        lines.append(f"| {e['ms']:g} | {e['jobs']} | {e['ideal_jobs_per_s']:.1f} | {e['daemon_jobs_per_s']:.1f} | "
                     f"{e['daemon_efficiency']:.3f} | {e['pool_efficiency']:.3f} | {e['daemon_over_pool']:.3f} | "
                     f"{s['sdk_jobs_per_s']:.1f} | {s['sdk_efficiency']:.3f} | {s['ratio']:.2f} | "
                     f"{e['parent_cpu_us_per_job']:.0f} | "
                     f"{e['other_load_cores_daemon']:.2f} / {e['other_load_cores_pool']:.2f} / "
                     f"{s['other_load_cores']:.2f} | "
                     f"{e['daemon_efficiency_load_adjusted']:.3f} / {e['pool_efficiency_load_adjusted']:.3f} |")
    o = r["overhead"]
    lines += ["", f"3. overhead ({o['noop_jobs']} no-op jobs, idle CPU subtracted)",
              "| parent CPU us/job | dev server CPU us/job (claim+complete) | no-op jobs/s end to end "
              "| parent idle CPU | server idle CPU | other load, cores |",
              "|---:|---:|---:|---:|---:|---:|",
              f"| {o['parent_cpu_us_per_job']:.0f} | {o['server_cpu_us_per_job']:.0f} "
              f"(+{o['server_enqueue_cpu_us_per_job']:.0f} to enqueue) | "
              f"{o['noop_jobs_per_s']:.0f} | {o['parent_idle_cpu_percent']:.2f}% | "
              f"{o['server_idle_cpu_percent']:.2f}% | {o['other_load_cores']:.2f} |"]
    la = r["latency"]
    lines += ["", f"4. latency on an idle daemon ({la['samples']} jobs, one at a time; "
                  f"--poll-interval {la['daemon_poll_interval_s']} s)",
              "| | p50 ms | p99 ms | max ms |", "|---|---:|---:|---:|",
              "| enqueue -> handler start | {p50} | {p99} | {max} |".format(**la["enqueue_to_start_ms"]),
              "| claim (server started_at) -> handler start | {p50} | {p99} | {max} |".format(
                  **la["claim_to_start_ms"])]
    me = r["memory"]
    lines += ["", "5. memory (MiB)",
              "| parent RSS | child RSS | child USS | bare python RSS / USS | child RSS above bare "
              "| child USS above bare |",
              "|---:|---:|---:|---:|---:|---:|",
              f"| {me['parent_rss_mib']:.1f} | {me['child_rss_mib']:.1f} | {me['child_uss_mib']:.1f} | "
              f"{me['bare_rss_mib']:.1f} / {me['bare_uss_mib']:.1f} | {me['child_rss_above_bare_mib']:.1f} | "
              f"{me['child_uss_above_bare_mib']:.1f} |"]
    sc = r["scaling"]
    lines += ["", f"6. scaling ({sc['ms']:g} ms jobs)",
              "| --procs | jobs | jobs/s | efficiency (vs min(procs, cores)/d) | speed-up over 1 | other load, cores "
              "| load-adj. eff. |",
              "|---:|---:|---:|---:|---:|---:|---:|"]
    for s in sc["rows"]:
        lines.append(f"| {s['procs']} | {s['jobs']} | {s['jobs_per_s']:.1f} | {s['efficiency']:.3f} | "
                     f"{s['speedup_over_1']} | {s['other_load_cores']:.2f} | {s['efficiency_load_adjusted']:.3f} |")
    if r.get("api"):
        lines += ["", "7. the job path with API latency, a fleet, and a request budget (benchmarks/bench_api.py)",
                  bench_api.table(r["api"])]
    for mode in r.get("fleet", {}).get("modes", []):
        lines += ["", f"8. a fleet idle, then a burst ({r['fleet']['command']})", fleet.table(mode)]
    lines += ["", "targets (load-adjusted = against the cores the other load left free; steady = the rate between "
                  "the 10th and 90th percentile completions, without the batch's first claim and last report)",
              "| target | value | met | load-adjusted | met adjusted | steady | met steady |",
              "|---|---:|---|---:|---|---:|---|"]
    yn = lambda b: "-" if b is None else ("yes" if b else "NO")  # noqa: E731
    num = lambda v: "-" if v is None else f"{v:g}"  # noqa: E731
    for t in r["targets"]:
        lines.append(f"| {t['name']} {t['op']} {t['target']:g} | {t['value']:g} | {yn(t['met'])} | "
                     f"{num(t['load_adjusted'])} | {yn(t['met_load_adjusted'])} | {num(t.get('steady'))} | "
                     f"{yn(t.get('met_steady'))} |")
    return "\n".join(lines)


def write_markdown(path: Path, r: dict, text: str) -> None:
    m = r["machine"]
    body = ["# Benchmark results", "",
            "Every benchmark figure of the project, dated, with the command that produced it; how to read them: "
            "[docs/benchmarks.md](../docs/benchmarks.md). This first section is written by `benchmarks/run.py` "
            "at each full run; the sections from Findings on are written by hand, and run.py keeps them.", "",
            "## The latest full run (benchmarks/run.py)", "",
            "Command (from the repository root, in the venv):", "", "```", r["command"], "```", "",
            f"Machine: {m['cpu_model']}, {m['cores']} cores; Python {m['python']}; {m['platform']}; run {m['date']} "
            f"({r['elapsed_s']} s).", "",
            "Throughput is jobs / (last `completed_at` - first `started_at`) from the dev server's job records; "
            "ideal is cores / d. Every runner executes `benchmarks.handlers.burn` (d ms of thread CPU time). "
            "The JSON of this run is written to `benchmarks/results/latest.json` (not committed).", "",
            "This machine is shared (other test suites run on it), so every run also records the *other load*: "
            "the CPU the rest of the machine used during that run, in cores (/proc/stat busy time minus the CPU of "
            "the benchmark's own processes), and a *load-adjusted* efficiency = jobs/s x d / (cores - other load).",
            "", text, ""]
    notes = ""
    if path.exists():  # keep the hand-written findings below the generated part
        old = path.read_text()
        if FINDINGS in old:
            notes = old[old.index(FINDINGS):]
    path.write_text("\n".join(body) + ("\n" + notes if notes else ""))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="short version: fewer jobs and samples")
    ap.add_argument("--procs", type=int, default=0, help="daemon --procs and SDK concurrency (default: the cores)")
    ap.add_argument("--ms", default="5,20,100", help="job CPU durations in ms (default 5,20,100)")
    ap.add_argument("--seconds", type=float, help="ideal seconds of work per throughput run (default 5, quick 0.6)")
    ap.add_argument("--noop-jobs", type=int, help="no-op jobs for the overhead run (default 3000, quick 300)")
    ap.add_argument("--latency-samples", type=int, help="jobs for the latency run (default 60, quick 8)")
    ap.add_argument("--scaling", help="comma-separated --procs values (default 1..2 x cores; quick 1 and 2 x cores)")
    ap.add_argument("--poll-interval", type=float, default=0.1, help="daemon --poll-interval (default 0.1 s)")
    ap.add_argument("--sdk-poll-interval", type=float, default=0.005, help="SDK worker poll_interval (default 0.005 s)")
    ap.add_argument("--idle-seconds", type=float, help="idle CPU sampling window (default 2, quick 0.5)")
    ap.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "latest.json"), help="JSON output path")
    ap.add_argument("--markdown", help="also write the table here (default benchmarks/RESULTS.md for a full run)")
    ap.add_argument("--no-markdown", action="store_true", help="write no markdown")
    ap.add_argument("--no-api", action="store_true", help="skip the API-latency, fleet and budget sections")
    ap.add_argument("--no-fleet", action="store_true", help="skip the 16-daemon fleet (benchmarks/fleet.py)")
    ap.add_argument("--baseline", help="a checkout of an older commit whose daemon runs beside ours in the API "
                    "sections (e.g. `git worktree add ../baseline <commit>`)")
    args = ap.parse_args(argv)
    cores = os.cpu_count() or 1
    q = args.quick
    args.seconds = args.seconds or (0.6 if q else 5.0)
    args.noop_jobs = args.noop_jobs or (300 if q else 3000)
    args.latency_samples = args.latency_samples or (8 if q else 60)
    args.idle_seconds = args.idle_seconds or (0.5 if q else 2.0)
    args.scaling = ([int(x) for x in args.scaling.split(",")] if args.scaling
                    else ([1, 2 * cores] if q else list(range(1, 2 * cores + 1))))
    if not args.markdown and not q and not args.no_markdown:
        args.markdown = str(ROOT / "benchmarks" / "RESULTS.md")
    if args.no_markdown:
        args.markdown = None

    r = run(args)
    text = table(r)
    print(text)
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(r, indent=2) + "\n")
    print(f"\nJSON written to {out}")
    if args.markdown:
        write_markdown(Path(args.markdown), r, text)
        print(f"table written to {args.markdown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
