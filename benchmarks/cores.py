"""Where the cores go: the CPU of the children, the parent and the dev server over one batch of jobs.

    python benchmarks/cores.py                          # 5, 20 and 100 ms jobs at loopback
    python benchmarks/cores.py --ms 100 --delays 0,20   # and with the API 20 ms away
    python benchmarks/cores.py --transports rest,grpc   # each row over REST, then over gRPC (unary calls)
    python benchmarks/cores.py --transports grpc,baseline-grpc --baseline ../other-checkout
                                                        # and another checkout's daemon (baseline: over REST)

For each row: efficiency (jobs/s / (cores / d)), the cores the whole machine was busy over the batch
(/proc/stat), and the share of them the children, the parent and the dev server used (their own CPU
times), plus CPU per job and the requests the server saw by route (GET /_dev/stats). When the machine
is ~all busy and the children's share equals the efficiency, no child waited for work: what is missing
is the CPU the parent and the server took on the same cores (the loopback rows of the latency benchmark).
Over gRPC the server's requests by route are not counted (`claims` and `completes` read 0): the server's
CPU per job is the figure that tells the transports apart on a shared host.
Prints a table and one JSON line; `--json PATH` also writes it.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import Daemon, DevServer, cpu_seconds, machine, machine_busy  # noqa: E402
from benchmarks.bench_api import Db, server_stats  # noqa: E402

CORES = os.cpu_count() or 1


_ROWS = itertools.count(1)  # a fresh database per row, also for a transport named twice in --transports
TRANSPORTS = ("rest", "grpc", "baseline", "baseline-grpc")  # baseline*: the --baseline checkout's daemon


def one_row(tmp: str, ms: float, jobs: int, delay: int, transport: str = "rest", baseline: str = "") -> dict:
    grpc = transport.endswith("grpc")
    server = DevServer(tmp, ("--fault-delay-ms", str(delay), *(("--grpc-port", "0") if grpc else ())),
                       name=f"cores-{delay}-{ms:g}-{transport}-{next(_ROWS)}").start()
    daemon = None
    try:
        queue = f"cores-{ms:g}"
        extra = ("--transport", "grpc", "--grpc-url", server.grpc) if grpc else ()
        root = Path(baseline) if transport.startswith("baseline") else None
        daemon = Daemon(server, tmp, queue, CORES, 0.1, extra=extra, root=root).start()
        time.sleep(0.5)  # let start-up settle
        children = daemon.children()
        before = [sum(cpu_seconds(c) for c in children), daemon.cpu(), server.cpu(), machine_busy(), time.monotonic()]
        server.enqueue(queue, {"ms": ms}, jobs)
        db = Db(server.db)
        deadline = time.monotonic() + 60 + 5 * jobs * ms / 1000
        while db.span(queue)[0] < jobs:
            if time.monotonic() > deadline or not daemon.alive():
                raise RuntimeError(f"{queue}: the jobs did not finish")
            time.sleep(0.02)
        after = [sum(cpu_seconds(c) for c in children), daemon.cpu(), server.cpu(), machine_busy(), time.monotonic()]
        kids, parent, srv, busy, wall = (a - b for a, b in zip(after, before, strict=True))
        done, span = db.span(queue)
        routes = server_stats(server).get("by_route", {})
    finally:
        if daemon is not None:
            daemon.stop()
        server.stop()
    return {"api_delay_ms": delay, "job_ms": ms, "transport": transport, "jobs": done,
            "efficiency": round(done * ms / 1000 / CORES / span, 4),
            "machine_busy_cores": round(busy / wall, 3), "children_cores": round(kids / wall, 3),
            "parent_cores": round(parent / wall, 3), "server_cores": round(srv / wall, 3),
            "children_us_per_job": round(kids / done * 1e6), "parent_us_per_job": round(parent / done * 1e6),
            "server_us_per_job": round(srv / done * 1e6),
            "claims": routes.get("claim", 0), "completes": routes.get("complete", 0)}


def table(rows: list[dict]) -> str:
    head = (f"{'delay':>5} {'job':>5} {'via':>13} {'eff':>6} {'busy':>6} {'children':>8} {'parent':>7} {'server':>7} "
            f"{'child us':>9} {'parent us':>9} {'server us':>9} {'claims':>6}")
    lines = [f"cores: {CORES}; busy and the three shares in cores over the batch; us = CPU per job", head]
    for r in rows:
        lines.append(f"{r['api_delay_ms']:>5} {r['job_ms']:>5g} {r['transport']:>13} {r['efficiency']:>6.3f} "
                     f"{r['machine_busy_cores']:>6.2f} {r['children_cores']:>8.3f} "
                     f"{r['parent_cores']:>7.3f} {r['server_cores']:>7.3f} "
                     f"{r['children_us_per_job']:>9} {r['parent_us_per_job']:>9} {r['server_us_per_job']:>9} "
                     f"{r['claims']:>6}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ms", default="5,20,100", help="job CPU durations in ms (default 5,20,100)")
    ap.add_argument("--delays", default="0", help="API latencies in ms, --fault-delay-ms (default 0)")
    ap.add_argument("--seconds", type=float, default=5.0, help="ideal seconds of work per row (default 5)")
    ap.add_argument("--transports", default="rest", help="rest, grpc, baseline, baseline-grpc, comma-separated, "
                    "each as often as wanted, in that order (default rest)")
    ap.add_argument("--baseline", default="", help="another checkout whose daemon the baseline rows run")
    ap.add_argument("--json", help="also write the JSON here")
    args = ap.parse_args(argv)
    transports = [t.strip() for t in args.transports.split(",") if t.strip()]
    if not transports or set(transports) - set(TRANSPORTS):
        ap.error(f"--transports: {', '.join(TRANSPORTS)}, not {args.transports!r}")
    if any(t.startswith("baseline") for t in transports) and not args.baseline:
        ap.error("--transports baseline rows need --baseline PATH (another checkout)")
    rows = []
    with tempfile.TemporaryDirectory(prefix="spooled-cores-") as tmp:
        for delay in (int(d) for d in args.delays.split(",")):
            for ms in (float(m) for m in args.ms.split(",")):
                jobs = max(CORES * 2, round(args.seconds * CORES * 1000 / ms))
                rows += [one_row(tmp, ms, jobs, delay, transport, args.baseline) for transport in transports]
    print(table(rows))
    out = {"machine": machine(), "command": "python benchmarks/cores.py " + " ".join(argv or sys.argv[1:]),
           "rows": rows}
    print(json.dumps(out))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
