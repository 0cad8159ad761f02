"""Memory of a model-serving handler: children's USS and PSS with and without --preload, beside Pool.

    flock /tmp/spooled-bench.lock python benchmarks/memory.py            # 150 MiB model, --procs 2 and 4
    python benchmarks/memory.py --model-mb 64 --procs 2 --jobs 100     # a quicker one

The handler (benchmarks/model_handler.py) builds a model of --model-mb MiB at import; its jobs hash
--job-mb MiB of it (CPU-bound, reading the model). For each --procs: the daemon without and with
--preload, and multiprocessing.Pool (fork) given the same model by its parent, measured in the same run:
- first job: seconds from starting the worker (the daemon process; Pool's parent) to the first job done;
- USS / PSS: each child's unshared memory and proportional share, after the jobs read the model (MiB; the
  table shows the largest child's USS and the children's total USS and PSS);
- jobs/s of --jobs jobs, from the server's records (Pool: the wall time of its map), and the children's CPU
  per job, which a machine shared with other work does not distort as it does jobs/s;
- sample cost: what one sample of a child's process tree takes (supervisor.ops.procmem.tree_memory, read by
  the daemon once a second per child), in microseconds: by RSS (each second) and by PSS (read only while
  the tree's RSS is over --max-memory-per-child).
Two more daemon rows run without any model (--procs 2), the base a child's USS is compared to: the target
is a --preload child's USS at most 10% of the model's size above a model-less child's.
Prints a table and one JSON line; `--json PATH` also writes it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import PY, ROOT, Daemon, DevServer, child_env, machine  # noqa: E402
from benchmarks.bench_api import Db  # noqa: E402
from supervisor.ops.procmem import tree_memory  # noqa: E402

HANDLER = "benchmarks.model_handler:infer"
MiB = 2**20


def memory_of(pids: list[int]) -> list[dict]:
    """USS and PSS (bytes) of each live pid."""
    out = []
    for pid in pids:
        try:
            info = psutil.Process(pid).memory_full_info()
            out.append({"pid": pid, "uss": info.uss, "pss": info.pss})
        except psutil.Error:
            pass
    return out


def sample_cost_us(pids: list[int], pss: bool, rounds: int = 30) -> float:
    """Microseconds one tree_memory() of a child takes: its RSS (each second), or its PSS (forced)."""
    started = time.perf_counter()
    for _ in range(rounds):
        for pid in pids:
            tree_memory(pid, pss_above=0 if pss else None)
    return (time.perf_counter() - started) / rounds / max(1, len(pids)) * 1e6


def children_cpu(pids: list[int]) -> float:
    """CPU seconds (user + system) the processes have used so far."""
    total = 0.0
    for pid in pids:
        try:
            t = psutil.Process(pid).cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def summary(kind: str, procs: int, model_mb: int, first_s: float, mem: list[dict], jobs: int, rate: float,
            cpu_s: float, cost: tuple[float, float] | None) -> dict:
    return {"worker": kind, "procs": procs, "model_mb": model_mb, "first_job_s": round(first_s, 3),
            "children": len(mem), "max_child_uss_mb": round(max(m["uss"] for m in mem) / MiB, 1),
            "total_uss_mb": round(sum(m["uss"] for m in mem) / MiB, 1),
            "total_pss_mb": round(sum(m["pss"] for m in mem) / MiB, 1), "jobs": jobs,
            "jobs_per_s": round(rate, 2), "cpu_ms_per_job": round(cpu_s / jobs * 1000, 2),
            "sample_rss_us": None if cost is None else round(cost[0], 1),
            "sample_pss_us": None if cost is None else round(cost[1], 1)}


def daemon_row(tmp: str, procs: int, preload: bool, model_mb: int, jobs: int, job_mb: int) -> dict:
    os.environ["BENCH_MODEL_MB"] = str(model_mb)  # the daemon's environment (child_env) passes it on
    name = f"mem-{procs}-{'pre' if preload else 'own'}-{model_mb}"
    server = DevServer(tmp, name=name).start()
    daemon = None
    try:
        server.enqueue(f"{name}-first", {"mb": job_mb, "at": 0}, 1)
        daemon = Daemon(server, tmp, f"{name}-first,{name}", procs, 0.1, extra=("--preload",) if preload else (),
                        worker_id=f"bench-{name}")
        daemon.cmd[daemon.cmd.index("--handler") + 1] = HANDLER
        started = time.monotonic()
        daemon.start(timeout=120)
        db = Db(server.db)
        deadline = started + 120
        while db.span(f"{name}-first")[0] < 1:
            if time.monotonic() > deadline or not daemon.alive():
                raise RuntimeError(f"{name}: the first job did not finish")
            time.sleep(0.01)
        first = time.monotonic() - started
        pids = [c.pid for c in daemon.children()]
        cpu = children_cpu(pids)
        for start in range(0, jobs, 100):  # each job hashes its own part of the model
            server.api.bulk_create(name, [{"mb": job_mb, "at": (start + i) * job_mb}
                                          for i in range(min(100, jobs - start))])
        deadline = time.monotonic() + 60 + jobs * 0.5
        while db.span(name)[0] < jobs:
            if time.monotonic() > deadline or not daemon.alive():
                raise RuntimeError(f"{name}: the jobs did not finish")
            time.sleep(0.05)
        done, span = db.span(name)
        if sorted(c.pid for c in daemon.children()) != sorted(pids):
            raise RuntimeError(f"{name}: a child was replaced during the jobs; its CPU would be lost")
        cpu = children_cpu(pids) - cpu
        mem = memory_of(pids)
        cost = sample_cost_us(pids, False), sample_cost_us(pids, True)
    finally:
        if daemon is not None:
            daemon.stop()
        server.stop()
    return summary("daemon --preload" if preload else "daemon", procs, model_mb, first, mem, done, done / span, cpu,
                   cost)


def pool_row(procs: int, model_mb: int, jobs: int, job_mb: int) -> dict:
    """Run `--pool` in a fresh interpreter, so the model is built (and timed) there."""
    out = subprocess.run([PY, str(Path(__file__).resolve()), "--pool", str(procs), "--jobs", str(jobs),
                          "--job-mb", str(job_mb)], cwd=ROOT, env=child_env(BENCH_MODEL_MB=str(model_mb)),
                         capture_output=True, text=True, timeout=600, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _pool_job(i_mb: tuple[int, int]) -> str:
    from benchmarks.model_handler import digest

    return digest(i_mb[1], i_mb[0])


def pool_main(procs: int, jobs: int, job_mb: int) -> None:
    """Inside the fresh interpreter: the parent builds the model, forks the Pool, runs the jobs."""
    import multiprocessing

    started = time.monotonic()
    import benchmarks.model_handler as model  # builds the model in the parent, before the fork

    pool = multiprocessing.get_context("fork").Pool(procs)
    try:
        pool.apply(_pool_job, ((0, job_mb),))
        first = time.monotonic() - started
        pids = [p.pid for p in pool._pool]  # type: ignore[attr-defined]
        cpu = children_cpu(pids)
        t0 = time.monotonic()
        pool.map(_pool_job, [(i * job_mb, job_mb) for i in range(jobs)], chunksize=1)
        rate = jobs / (time.monotonic() - t0)
        cpu = children_cpu(pids) - cpu
        mem = memory_of(pids)
    finally:
        # close + join, not terminate(): a worker SIGTERMed while another holds the task queue's lock can block
        # on it for ever (a hang of the in-suite tiny run under coverage, as run.py's Pool had)
        pool.close()
        pool.join()
    print(json.dumps(summary("multiprocessing.Pool", procs, len(model.MODEL) // MiB, first, mem, jobs, rate, cpu,
                             None)))


def table(rows: list[dict], target_mb: float | None) -> str:
    head = (f"{'worker':<22} {'procs':>5} {'model':>6} {'first job':>9} {'max USS':>8} {'sum USS':>8} "
            f"{'sum PSS':>8} {'jobs/s':>7} {'CPU ms/job':>10} {'RSS us':>7} {'PSS us':>7}")
    lines = ["MiB; first job in s from starting the worker; RSS/PSS us: one sample of a child's tree", head]
    for r in rows:
        rss = "" if r["sample_rss_us"] is None else f"{r['sample_rss_us']:.0f}"
        pss = "" if r["sample_pss_us"] is None else f"{r['sample_pss_us']:.0f}"
        lines.append(f"{r['worker']:<22} {r['procs']:>5} {r['model_mb']:>6} {r['first_job_s']:>9.2f} "
                     f"{r['max_child_uss_mb']:>8.1f} {r['total_uss_mb']:>8.1f} {r['total_pss_mb']:>8.1f} "
                     f"{r['jobs_per_s']:>7.1f} {r['cpu_ms_per_job']:>10.2f} {rss:>7} {pss:>7}")
    if target_mb is not None:
        lines.append(f"target: a --preload child's USS <= {target_mb:.1f} MiB (model-less child's + 10% of the model)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-mb", type=int, default=150, help="the model's size in MiB (default 150)")
    ap.add_argument("--procs", default="2,4", help="children counts (default 2,4)")
    ap.add_argument("--jobs", type=int, default=200, help="jobs per row (default 200)")
    ap.add_argument("--job-mb", type=int, default=24, help="MiB of the model each job hashes (default 24)")
    ap.add_argument("--pool", type=int, help=argparse.SUPPRESS)  # internal: one Pool row in this interpreter
    ap.add_argument("--json", help="also write the JSON here")
    args = ap.parse_args(argv)
    if args.pool:
        pool_main(args.pool, args.jobs, args.job_mb)
        return 0
    rows = []
    with tempfile.TemporaryDirectory(prefix="spooled-memory-") as tmp:
        for preload in (False, True):
            rows.append(daemon_row(tmp, 2, preload, 0, max(20, args.jobs // 4), args.job_mb))
        for procs in (int(p) for p in args.procs.split(",")):
            for preload in (False, True):
                rows.append(daemon_row(tmp, procs, preload, args.model_mb, args.jobs, args.job_mb))
            rows.append(pool_row(procs, args.model_mb, args.jobs, args.job_mb))
    base = next(r for r in rows if r["model_mb"] == 0 and r["worker"] == "daemon")
    target = base["max_child_uss_mb"] + args.model_mb * 0.10
    met = all(r["max_child_uss_mb"] <= target for r in rows if r["worker"] == "daemon --preload" and r["model_mb"])
    print(table(rows, target))
    out = {"machine": machine(), "command": "python benchmarks/memory.py " + " ".join(argv or sys.argv[1:]),
           "model_mb": args.model_mb, "job_mb": args.job_mb, "target_uss_mb": round(target, 1), "target_met": met,
           "rows": rows}
    print(json.dumps(out))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
