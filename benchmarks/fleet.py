"""A fleet idle, then handed a burst: how fast every daemon wakes, how evenly it shares, what idling costs.

    python benchmarks/fleet.py                          # 16 daemons x 4 children, 640 jobs of 0.5 s, 20 ms API
    python benchmarks/fleet.py --wake events,poll       # the same fleet listening, then polling (before/after)
    python benchmarks/fleet.py --daemons 4 --jobs 80 --idle-s 10   # a small run
    python benchmarks/fleet.py --transports rest,grpc   # the same fleet over REST, then over gRPC

One dev server on loopback answers every request `--delay-ms` late (`--fault-delay-ms`). `--daemons`
daemons of `--procs` children each serve one queue with sleep jobs (so the two cores do not limit it).
Per `--wake` mode, in order:

  1. start the fleet; once every daemon is ready, let it settle (`--settle-s`), then count each daemon's
     API requests over `--idle-s` seconds of idling (its /metrics, by route): the idle cost;
  2. enqueue `--jobs` jobs of `--job-s` seconds at once (bulk, 100 a request) and wait until all are done;
  3. settle again and count a second idle window (after the burst).

Reported: each daemon's delay from the enqueue (the burst's first created_at) to its first job's start
(the handler's own clock); the makespan from the enqueue to the last completion against the ideal
(ceil(jobs / slots) x job-s) and the span from first start to last completion; the jobs each daemon ran
against a fair share; API requests per job during the burst (every route, heartbeats included) and the
429s; idle requests/s per daemon beyond heartbeats (claims + events-stream connects; the worker-row
read that follows each heartbeat is shown apart); the dev server's CPU per request over the burst and its
CPU share, and the claim round trip the daemons measured less the injected delay (the server's own
service time: if it stays small while the server's CPU share is below a core, SQLite is not the limit).

Targets: makespan within 10% of ideal; every daemon's first start within 2 round trips + 100 ms of the
enqueue; no daemon more than 20% above its fair share; idle <= 0.1 requests/s per daemon beyond
heartbeats. Prints a table per mode and writes JSON (`--json`). Run it under `flock /tmp/spooled-bench.lock`.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import re
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import requests  # noqa: E402

from benchmarks._common import Daemon, DevServer, free_port, machine  # noqa: E402

HEARTBEAT_ROUTES = ("worker_heartbeat",)
ROW_CHECK_ROUTES = ("get_worker",)
_SAMPLE = re.compile(r'^spooled_supervisor_api_requests_total\{route="([^"]*)",status="([^"]*)"\} (\S+)$')
_DURATION = re.compile(r'^spooled_supervisor_api_request_duration_seconds_(sum|count)\{route="claim"\} (\S+)$')


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def requests_by_route(port: int) -> dict:
    """The daemon's API requests so far: {(route, status): count}, plus the claim latency sum and count."""
    out: dict = {}
    for line in requests.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text.splitlines():
        if m := _SAMPLE.match(line):
            out[(m.group(1), m.group(2))] = float(m.group(3))
        elif m := _DURATION.match(line):
            out[("claim_latency", m.group(1))] = float(m.group(2))
    return out


def diff(after: dict, before: dict) -> dict:
    return {k: v - before.get(k, 0.0) for k, v in after.items() if v - before.get(k, 0.0)}


def routes_only(counts: dict) -> dict[str, float]:
    out: dict[str, float] = {}
    for (route, _status), n in counts.items():
        if route != "claim_latency":
            out[route] = out.get(route, 0.0) + n
    return out


def idle_rates(counts: list[dict], seconds: float) -> dict:
    """Per daemon requests/s over an idle window: beyond heartbeats (claims, stream connects, anything
    else), the worker-row reads, and everything."""
    beyond, rows, total = [], [], []
    for c in counts:
        by_route = routes_only(c)
        hb = sum(by_route.get(r, 0.0) for r in HEARTBEAT_ROUTES)
        rc = sum(by_route.get(r, 0.0) for r in ROW_CHECK_ROUTES)
        everything = sum(by_route.values())
        beyond.append((everything - hb - rc) / seconds)
        rows.append(rc / seconds)
        total.append(everything / seconds)
    return {"seconds": seconds, "beyond_heartbeats_mean": round(sum(beyond) / len(beyond), 4),
            "beyond_heartbeats_max": round(max(beyond), 4), "row_checks_mean": round(sum(rows) / len(rows), 4),
            "all_mean": round(sum(total) / len(total), 4)}


def wait_done(db_path: str, queue: str, count: int, timeout: float, alive) -> None:
    conn = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=10)
    deadline = time.monotonic() + timeout
    try:
        while True:
            done = conn.execute("SELECT count(*) FROM jobs WHERE queue_name=? AND status IN "
                                "('completed','failed','deadletter')", (queue,)).fetchone()[0]
            if done >= count:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{queue}: {done}/{count} jobs done within {timeout:.0f} s")
            if not alive():
                raise RuntimeError(f"{queue}: a daemon exited while jobs were left")
            time.sleep(0.1)
    finally:
        conn.close()


def burst_records(db_path: str, queue: str) -> list[tuple]:
    conn = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=10)
    try:
        return conn.execute("SELECT assigned_worker_id, created_at, started_at, completed_at, result, status "
                            "FROM jobs WHERE queue_name=?", (queue,)).fetchall()
    finally:
        conn.close()


def server_requests(server: DevServer) -> tuple[int, int]:
    r = requests.get(f"{server.url}/_dev/stats", headers={"Authorization": f"Bearer {server.key}"}, timeout=30)
    r.raise_for_status()
    s = r.json()
    return int(s["requests"]), int(s["rate_limited"])


_RUNS = itertools.count(1)


def run_mode(args, wake: str, tmp: str, transport: str = "rest") -> dict:
    grpc = transport == "grpc"
    extra = ["--fault-delay-ms", str(args.delay_ms), *(("--grpc-port", "0") if grpc else ())]
    if args.rate_limit:
        extra += ["--rate-limit", str(args.rate_limit)]
    queue = f"fleet-{wake}-{transport}-{next(_RUNS)}"  # a database of its own, also for a mode named twice
    server = DevServer(tmp, tuple(extra), name=queue).start()
    daemons: list[Daemon] = []
    ports: list[int] = []
    over = ("--transport", "grpc", "--grpc-url", server.grpc) if grpc else ()
    try:
        log(f"[{wake}] starting {args.daemons} daemons x {args.procs}")
        for i in range(args.daemons):
            port = free_port()
            ports.append(port)
            daemons.append(Daemon(server, tmp, queue, args.procs, args.poll_interval, worker_id=f"{queue}-{i:02d}",
                                  extra=("--wake", wake, "--health-port", str(port), "--prefetch", "auto", *over)))
        for d in daemons:
            d.start(timeout=120)
        alive = lambda: all(d.alive() for d in daemons)  # noqa: E731

        log(f"[{wake}] settling {args.settle_s} s, then {args.idle_s} s idle")
        time.sleep(args.settle_s)
        before = [requests_by_route(p) for p in ports]
        time.sleep(args.idle_s)
        idle_before = idle_rates([diff(requests_by_route(p), b) for p, b in zip(ports, before, strict=True)],
                                 args.idle_s)

        log(f"[{wake}] burst: {args.jobs} jobs of {args.job_s} s")
        before = [requests_by_route(p) for p in ports]
        server_before, server_cpu_before = server_requests(server), server.cpu()
        t_burst = time.time()
        server.enqueue(queue, {"sleep_s": args.job_s}, args.jobs)
        wait_done(server.db, queue, args.jobs, 60 + 4 * args.jobs * args.job_s / (args.daemons * args.procs), alive)
        burst_wall = time.time() - t_burst
        server_after, server_cpu_after = server_requests(server), server.cpu()
        burst_counts = [diff(requests_by_route(p), b) for p, b in zip(ports, before, strict=True)]

        log(f"[{wake}] settling {args.settle_s} s, then {args.idle_s} s idle")
        time.sleep(args.settle_s)
        before = [requests_by_route(p) for p in ports]
        time.sleep(args.idle_s)
        idle_after = idle_rates([diff(requests_by_route(p), b) for p, b in zip(ports, before, strict=True)],
                                args.idle_s)
        rows = burst_records(server.db, queue)
    finally:
        for d in daemons:
            d.stop()
        server.stop()
    result = summarize(args, wake, rows, burst_counts, idle_before, idle_after,
                       server_after[0] - server_before[0], server_after[1] - server_before[1],
                       server_cpu_after - server_cpu_before, burst_wall)
    result["transport"] = transport
    if grpc:  # the server counts only its REST requests (the daemons' events streams): per request means nothing
        result["server"]["cpu_us_per_request"] = None
    return result


def summarize(args, wake: str, rows: list[tuple], burst_counts: list[dict], idle_before: dict, idle_after: dict,
              server_requests_n: int, server_429: int, server_cpu: float, burst_wall: float) -> dict:
    enqueued = min(r[1] for r in rows)
    completed = [r for r in rows if r[5] == "completed"]
    first: dict[str, float] = {}
    split: dict[str, int] = {}
    for worker, _, _, _, result, _ in completed:
        t0 = json.loads(result)["t0"]
        first[worker] = min(first.get(worker, math.inf), t0)
        split[worker] = split.get(worker, 0) + 1
    slots = args.daemons * args.procs
    ideal = math.ceil(args.jobs / slots) * args.job_s
    last = max(r[3] for r in completed)
    makespan = last - enqueued
    span = last - min(json.loads(r[4])["t0"] for r in completed)
    fair = args.jobs / args.daemons
    delays = sorted(round((t - enqueued) * 1000, 1) for t in first.values())
    totals = [routes_only(c) for c in burst_counts]
    all_requests = sum(sum(t.values()) for t in totals)
    claims = sum(t.get("claim", 0.0) for t in totals)
    lat_sum = sum(c.get(("claim_latency", "sum"), 0.0) for c in burst_counts)
    lat_n = sum(c.get(("claim_latency", "count"), 0.0) for c in burst_counts)
    rtt_ms = args.delay_ms  # one request's injected delay is its round trip here (loopback adds ~0)
    target_ms = 2 * rtt_ms + 100
    return {
        "wake": wake, "daemons": args.daemons, "procs_each": args.procs, "jobs": args.jobs, "job_s": args.job_s,
        "api_delay_ms": args.delay_ms, "completed": len(completed),
        "first_start_ms": {"min": delays[0], "p50": delays[len(delays) // 2], "max": delays[-1],
                           "all": delays, "target_ms": target_ms,
                           "daemons_within_target": sum(1 for d in delays if d <= target_ms),
                           "daemons_started": len(delays)},
        "makespan_s": round(makespan, 3), "span_s": round(span, 3), "ideal_s": ideal,
        "makespan_over_ideal": round(makespan / ideal, 4), "span_over_ideal": round(span / ideal, 4),
        "split": dict(sorted(split.items())), "fair_share": fair,
        "most_over_fair": round(max(split.values()) / fair - 1, 4), "fewest": min(split.values()),
        "requests_per_job": round(all_requests / max(1, len(completed)), 3),
        "claims_per_job": round(claims / max(1, len(completed)), 3),
        "rate_limited_429": int(sum(n for c in burst_counts for (r, s), n in c.items() if s == "429")),
        "server_429": server_429,
        "idle_before": idle_before, "idle_after": idle_after,
        "server": {"requests": server_requests_n, "cpu_s": round(server_cpu, 3),
                   "cpu_us_per_request": round(1e6 * server_cpu / max(1, server_requests_n), 1),
                   "cpu_share_of_a_core": round(server_cpu / burst_wall, 3),
                   "claim_ms_mean": round(1000 * lat_sum / lat_n, 2) if lat_n else None,
                   "claim_ms_beyond_delay": round(1000 * lat_sum / lat_n - args.delay_ms, 2) if lat_n else None},
    }


def table(r: dict) -> str:
    f, s = r["first_start_ms"], r["server"]
    ok = lambda good: "ok" if good else "MISSED"  # noqa: E731
    lines = [
        f"wake={r['wake']}, {r.get('transport', 'rest')}: {r['daemons']} daemons x {r['procs_each']}, "
        f"{r['jobs']} jobs of {r['job_s']} s, "
        f"API {r['api_delay_ms']} ms",
        f"  first start after enqueue   min {f['min']} / p50 {f['p50']} / max {f['max']} ms; "
        f"{f['daemons_within_target']}/{r['daemons']} within {f['target_ms']:g} ms "
        f"[{ok(f['daemons_within_target'] == r['daemons'])}]",
        f"  makespan (enqueue->last)    {r['makespan_s']} s / ideal {r['ideal_s']} s = {r['makespan_over_ideal']} "
        f"[{ok(r['makespan_over_ideal'] <= 1.10)}]; first start->last {r['span_over_ideal']}",
        f"  split                       fair {r['fair_share']:g}, fewest {r['fewest']}, most "
        f"{r['most_over_fair']:+.0%} over [{ok(r['most_over_fair'] <= 0.20)}]",
        f"  requests per job            {r['requests_per_job']} (claims {r['claims_per_job']}); 429s "
        f"{r['rate_limited_429']} (server counted {r['server_429']})",
        f"  idle req/s per daemon       before: {r['idle_before']['beyond_heartbeats_mean']} beyond heartbeats "
        f"(max {r['idle_before']['beyond_heartbeats_max']}) [{ok(r['idle_before']['beyond_heartbeats_max'] <= 0.1)}]"
        f", row reads {r['idle_before']['row_checks_mean']}, all {r['idle_before']['all_mean']}",
        f"                              after:  {r['idle_after']['beyond_heartbeats_mean']} "
        f"(max {r['idle_after']['beyond_heartbeats_max']}) [{ok(r['idle_after']['beyond_heartbeats_max'] <= 0.1)}]"
        f", row reads {r['idle_after']['row_checks_mean']}, all {r['idle_after']['all_mean']}",
        f"  dev server                  "
        f"{'' if s['cpu_us_per_request'] is None else str(s['cpu_us_per_request']) + ' us CPU/request, '}"
        f"{s['cpu_share_of_a_core']} of a core "
        f"during the burst; claim {s['claim_ms_mean']} ms = delay + {s['claim_ms_beyond_delay']} ms",
    ]
    return "\n".join(lines)


def parse(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--daemons", type=int, default=16)
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--jobs", type=int, default=640)
    ap.add_argument("--job-s", type=float, default=0.5)
    ap.add_argument("--delay-ms", type=int, default=20)
    ap.add_argument("--idle-s", type=float, default=30.0)
    ap.add_argument("--settle-s", type=float, default=20.0, help="seconds before each idle window")
    ap.add_argument("--poll-interval", type=float, default=5.0, help="the daemons' --poll-interval (default 5)")
    ap.add_argument("--rate-limit", type=float, default=None, help="the dev server's requests/s per organization")
    ap.add_argument("--wake", default="events", help="comma-separated modes to run: events, poll")
    ap.add_argument("--transports", default="rest", help="comma-separated: rest, grpc (each wake mode over each; "
                    "grpc: the daemons' --transport grpc against the dev server's --grpc-port)")
    ap.add_argument("--json", default="", help="also write the JSON here")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse(argv)
    out = {"machine": machine(), "command": " ".join(["python", "benchmarks/fleet.py", *(argv or sys.argv[1:])]),
           "modes": []}
    with tempfile.TemporaryDirectory(prefix="fleet-") as tmp:
        for transport in [t.strip() for t in args.transports.split(",") if t.strip()]:
            for wake in [w.strip() for w in args.wake.split(",") if w.strip()]:
                result = run_mode(args, wake, tmp, transport)
                out["modes"].append(result)
                print(table(result), flush=True)
    print(json.dumps(out))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
