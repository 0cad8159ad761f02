"""gRPC vs REST: the cost of claim + complete through the daemon's own loop clients.

Starts `python -m supervisor dev-server --grpc-port 0` (and again with --fault-delay-ms for API
latency), enqueues no-op jobs over REST, then drives each transport exactly as the parent loop
does (a select() on the wake-up pipe; `submit`, `expire`, `done`): claim for the free slots,
complete every job at once with a small object result. Rows: transport x slots (1 = one child,
8 = eight children) x added server latency. Reported per job: wall time, client CPU (this process,
all threads: gRPC's included) and dev-server CPU. Prints a table and one JSON line.

    python benchmarks/bench_grpc.py                  # ~30 s on 2 shared cores
    python benchmarks/bench_grpc.py --jobs 600 --delay-ms 0,5
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import subprocess
import sys
import tempfile
import time

import psutil
from _common import PY, ROOT, DevServer, child_env, cpu_seconds, machine_busy, stop_popen

from supervisor.client.grpc_transport import make_transport  # noqa: E402
from supervisor.client.loophttp import LoopHTTP  # noqa: E402
from supervisor.client.rest import Secret, SpooledAPI  # noqa: E402

QUEUE = "bench-grpc"


class Server(DevServer):
    """The dev server with its gRPC port, `delay_ms` of API latency on every call (REST and gRPC)."""

    def __init__(self, tmp: str, delay_ms: int):
        delay = max(0, delay_ms)
        super().__init__(tmp, ("--grpc-port", "0", "--fault-delay-ms", str(delay)), name=f"grpc-{delay_ms}")
        self.delay_ms = delay

    def start(self) -> Server:
        super().start()
        self.rest = self.api
        return self

    def enqueue(self, count: int) -> None:  # type: ignore[override]
        for start in range(0, count, 100):
            self.rest.bulk_create(QUEUE, [{"i": i} for i in range(start, min(count, start + 100))])


def make_client(kind: str, server: Server, sel, wake_w: int):
    if kind == "rest":
        api = SpooledAPI(server.url, Secret(server.key), timeout=30)
        return api, LoopHTTP(api, sel, wake_w)
    client = "grpcio" if kind.endswith("-grpcio") else "wire"
    cfg = type("Cfg", (), {"grpc_url": server.grpc, "api_key": Secret(server.key), "api_timeout": 30.0,
                           "ca_bundle": None, "grpc_client": client})
    return make_transport(cfg, wake_w, sel, mode="stream" if kind.startswith("grpc-stream") else "unary")


class JobStreams:
    """`slots` StreamJobs streams (grpcio; one reader thread each, as the guides' workers have): each
    delivered job goes to `arrived` and a byte to the loop's wake-up pipe. Settlements go through the
    loop's transport; the server sends a stream's next job once the last is settled."""

    def __init__(self, server: Server, slots: int, wake_w: int, lease: int = 60):
        import threading

        import grpc

        from supervisor.proto import spooled_pb2 as pb
        from supervisor.proto import spooled_pb2_grpc as pb_grpc

        self.channel = grpc.insecure_channel(server.grpc)
        stub = pb_grpc.QueueServiceStub(self.channel)
        self.arrived: list = []
        self.calls = []
        for _ in range(slots):
            call = stub.StreamJobs(pb.StreamJobsRequest(queue_name=QUEUE, worker_id="bench-w",
                                                        lease_duration_secs=lease),
                                   metadata=(("x-api-key", server.key),))
            self.calls.append(call)

            def read(call=call):
                try:
                    for job in call:
                        self.arrived.append({"id": job.id, "lease_id": job.lease_id})
                        try:
                            os.write(wake_w, b"\0")
                        except OSError:
                            pass
                except grpc.RpcError:
                    pass
            threading.Thread(target=read, daemon=True).start()

    def take(self) -> list:
        out, self.arrived = self.arrived, []
        return out

    def close(self) -> None:
        for call in self.calls:
            call.cancel()
        self.channel.close()


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass


def drive(kind: str, server: Server, total: int, slots: int, work_ms: float = 0.0) -> dict:  # noqa: C901
    """Claim for free slots (or, for `grpc-jobstreams`, take what one StreamJobs stream per slot delivers),
    hold each job `work_ms` as a child would run it, then complete it; until `total` jobs are completed."""
    import heapq

    r, w = os.pipe()
    os.set_blocking(r, False)
    os.set_blocking(w, False)
    sel = selectors.DefaultSelector()
    sel.register(r, selectors.EVENT_READ, ("wake", None))
    streamed = kind == "grpc-jobstreams"
    api, client = make_client("grpc-unary" if streamed else kind, server, sel, w)
    streams = JobStreams(server, slots, w) if streamed else None
    claimed = completed = held = 0
    claiming = False
    running: list = []  # (due, n, job): jobs "running" until due
    wall0, cpu0, srv0 = time.monotonic(), time.process_time(), cpu_seconds(server.ps)
    try:
        while completed < total:
            if not streamed and not claiming and held < slots and claimed < total:
                client.submit(("claim",), api.claim_call(QUEUE, "bench-w", min(slots - held, total - claimed), 60),
                              first=True)
                claiming = True
            now = time.monotonic()
            deadline = client.next_deadline()
            if running:
                deadline = min(deadline or running[0][0], running[0][0])
            for key, mask in sel.select(1.0 if deadline is None else max(0.0, min(1.0, deadline - now))):
                if key.data[0] == "wake":
                    _drain(r)
                else:
                    client.on_ready(key.data[1], mask, time.monotonic())
            now = time.monotonic()
            client.expire(now)
            arrived = streams.take() if streams is not None else []
            for tag, result, error in client.done():
                if error is not None:
                    raise RuntimeError(f"{kind} {tag[0]} failed: {error}")
                if tag[0] == "claim":
                    claiming = False
                    arrived += result
                else:
                    completed += 1
            for job in arrived:
                claimed += 1
                held += 1
                heapq.heappush(running, (now + work_ms / 1000.0, claimed, job))
            while running and running[0][0] <= now:
                job = heapq.heappop(running)[2]
                held -= 1  # free once its job ends, as a child is (the answer comes when it comes)
                client.submit(("complete",), api.complete_call(job["id"], "bench-w", job["lease_id"], {"ok": True}))
    finally:
        wall, cpu, srv = time.monotonic() - wall0, time.process_time() - cpu0, cpu_seconds(server.ps) - srv0
        if streams is not None:
            streams.close()
        client.close()
        sel.close()
        os.close(r)
        os.close(w)
    ideal = slots * 1000.0 / work_ms if work_ms else None
    return {"transport": kind, "slots": slots, "jobs": total, "work_ms": work_ms, "wall_us": round(wall / total * 1e6),
            "client_cpu_us": round(cpu / total * 1e6), "server_cpu_us": round(srv / total * 1e6),
            "jobs_per_s": round(total / wall, 1), "busy": round(total / wall / ideal, 3) if ideal else None}


def daemon_row(server: Server, tmp: str, transport: str, count: int, procs: int, payload: dict) -> dict:
    """The real daemon (`--transport`) draining `count` jobs: wall time and parent CPU per job."""
    queue = f"d-{transport}-{procs}-{len(payload)}"
    client = ("--grpc-client", "grpcio") if transport.endswith("-grpcio") else ()
    transport = transport.removesuffix("-grpcio")
    log_path = os.path.join(tmp, f"{queue}.log")
    cmd = [PY, "-m", "supervisor", "run", "--queue", queue, "--handler", "benchmarks.handlers:burn", "--procs",
           str(procs), "--api-url", server.url, "--worker-id", f"bench-{queue}", "--poll-interval", "0.1",
           "--log-format", "json", "--log-level", "WARNING", "--transport", transport, "--grpc-url", server.grpc,
           *client]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=child_env(SPOOLED_API_KEY=server.key), stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        ps = psutil.Process(proc.pid)
        time.sleep(1.0)  # let it register and idle (its start-up CPU is not per-job cost)
        cpu0 = cpu_seconds(ps)
        t0 = time.monotonic()
        for start in range(0, count, 100):
            server.rest.bulk_create(queue, [payload] * min(100, count - start))
        deadline = time.monotonic() + 120
        while (server.rest.get("/api/v1/jobs/stats")["completed"] < server.completed_before + count):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"daemon ({transport}) stalled; log: {open(log_path).read()[-1500:]}")
            time.sleep(0.5)  # /jobs/stats scans every job: not too often
        wall, cpu = time.monotonic() - t0, cpu_seconds(ps) - cpu0
    finally:
        stop_popen(proc)
    server.completed_before += count
    name = f"daemon-{transport}" + ("-grpcio" if client else "")
    return {"transport": name, "slots": procs, "jobs": count, "work_ms": payload.get("ms", 0),
            "wall_us": round(wall / count * 1e6), "parent_cpu_us": round(cpu / count * 1e6),
            "jobs_per_s": round(count / wall)}


def grpc_wired() -> bool:
    import inspect

    import supervisor.commands.run

    return "grpc" in inspect.getsource(supervisor.commands.run)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=1500, help="jobs per row without added latency (default 1500)")
    ap.add_argument("--delay-jobs", type=int, default=300, help="jobs per row with added latency (default 300)")
    ap.add_argument("--delay-ms", default="0,5", help="added server latency per request/message, ms (default 0,5)")
    ap.add_argument("--slots", default="1,8", help="jobs held at once (children), comma-separated (default 1,8)")
    ap.add_argument("--transports", default="rest,grpc-unary,grpc-unary-grpcio,grpc-stream",
                    help="rest; grpc-unary (one RPC per call, on the loop's own HTTP/2 connection: --grpc-client "
                    "wire); grpc-unary-grpcio (the same through grpcio's channel); grpc-stream (one ProcessJobs "
                    "stream, grpcio); default all four")
    ap.add_argument("--work-ms", type=float, default=0.0, help="each job held this long before its complete, as a "
                    "child would run it (default 0); with grpc-jobstreams (one StreamJobs stream per slot)")
    ap.add_argument("--daemon-jobs", type=int, default=600, help="jobs per daemon row (default 600; 0 = none)")
    ap.add_argument("--procs", type=int, default=2, help="daemon --procs for the daemon rows (default 2)")
    args = ap.parse_args(argv)
    rows, busy0, t0 = [], machine_busy(), time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-grpc-") as tmp:
        for delay in [int(d) for d in args.delay_ms.split(",")]:
            server = Server(tmp, delay).start()
            try:
                count = args.jobs if delay == 0 else args.delay_jobs
                for slots in [int(s) for s in args.slots.split(",")]:
                    for kind in args.transports.split(","):
                        server.enqueue(count)
                        row = drive(kind, server, count, slots, args.work_ms)
                        row["delay_ms"] = delay
                        rows.append(row)
                        print(f"  {kind:10} slots={slots} delay={delay}ms: {row['wall_us']} us/job", file=sys.stderr,
                              flush=True)
            finally:
                server.stop()
        daemon_rows = []
        if args.daemon_jobs and grpc_wired():
            server = Server(tmp, -1).start()
            server.completed_before = 0
            try:
                for payload in ({}, {"ms": 5}):
                    for transport in ("rest", "grpc", "grpc-grpcio"):
                        row = daemon_row(server, tmp, transport, args.daemon_jobs, args.procs, payload)
                        daemon_rows.append(row)
                        print(f"  {row['transport']:10} work={row['work_ms']}ms: {row['parent_cpu_us']} us parent "
                              "CPU/job", file=sys.stderr, flush=True)
            finally:
                server.stop()
    head = (f"{'transport':10} {'slots':>5} {'delay ms':>8} {'jobs/s':>7} {'wall us/job':>11} "
            f"{'client CPU us/job':>17} {'server CPU us/job':>17}")
    busy = round((machine_busy() - busy0) / (time.monotonic() - t0), 2)
    print(f"claim + complete, no-op jobs, loopback; the machine was busy on {busy} of {psutil.cpu_count()} cores "
          "during the run (this run included)")
    print(head)
    for r in rows:
        print(f"{r['transport']:10} {r['slots']:>5} {r['delay_ms']:>8} {r['jobs_per_s']:>7} {r['wall_us']:>11} "
              f"{r['client_cpu_us']:>17} {r['server_cpu_us']:>17}")
    if daemon_rows:
        print(f"\nthe daemon, --procs {args.procs}, {args.daemon_jobs} jobs per row")
        print(f"{'transport':14} {'work ms':>7} {'jobs/s':>7} {'wall us/job':>11} {'parent CPU us/job':>17}")
        for r in daemon_rows:
            print(f"{r['transport']:14} {r['work_ms']:>7} {r['jobs_per_s']:>7} {r['wall_us']:>11} "
                  f"{r['parent_cpu_us']:>17}")
    print(json.dumps({"bench": "grpc_vs_rest", "machine_busy_cores": busy, "rows": rows, "daemon_rows": daemon_rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
