"""`python -m supervisor dev-server`: flags and environment, start-up, signal handling.

Start-up prints (flushed) `API key: <key>` and `Spooled dev server listening on
http://HOST:PORT`. SIGTERM / SIGINT stop serving, close the DB and exit 0.
Every flag also reads an environment variable SPOOLED_DEV_<NAME> (the API key
also reads SPOOLED_API_KEY); a flag on the command line wins.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading

from .app import App, Config, make_server, serve_in_thread
from .faults import Faults, RateLimiter
from .store import Store
from .sweeps import Sweeper

EPILOG = """\
Resilience switches (to test a worker against a misbehaving API):
  --fault-503 F         answer a fraction F (0-1) of /api/v1 requests with 503 SERVICE_UNAVAILABLE
  --fault-delay-ms N    delay /api/v1 requests by N ms (a --fault-delay-fraction of them; default all)
  --fault-cut F         handle a fraction F of requests, then send the headers and half the body and
                        close the socket (the write happened; the client never sees the answer)
  --max-workers N       worker cap: register answers 429 QUOTA_EXCEEDED beyond N healthy/degraded workers
  --rate-limit RPS      per-organization token bucket; 429 RATE_LIMIT_EXCEEDED with Retry-After
Faults never touch /health* or /_dev/faults. While running, GET/POST /_dev/faults (any valid key)
reads/replaces {"fail_503": F, "delay_ms": N, "cut": F, "fail_status": 503 (or 408, 5xx)}.
To lose a lease on demand: POST /_dev/leases/{job_id}/expire, or /steal with {"worker_id": W}.
GET /_dev/requests[?since=UNIX_TIME] lists the last 10,000 /api/v1 requests (status, lease_id, t).

Every option can also be set from the environment as SPOOLED_DEV_<OPTION> in upper case with
underscores, e.g. SPOOLED_DEV_PORT=9000, SPOOLED_DEV_FAULT_503=0.1; the API key also from
SPOOLED_API_KEY. Command-line flags win over the environment.
"""


def _env(name: str, default=None):
    return os.environ.get("SPOOLED_DEV_" + name.upper().replace("-", "_"), default)


def _frac(text: str) -> float:
    v = float(text)
    if not 0.0 <= v <= 1.0:
        raise argparse.ArgumentTypeError("must be a fraction between 0 and 1")
    return v


def _nonneg_int(text: str) -> int:
    v = int(text)
    if v < 0:
        raise argparse.ArgumentTypeError("must be >= 0")
    return v


def _pos_float(text: str) -> float:
    v = float(text)
    if v <= 0:
        raise argparse.ArgumentTypeError("must be > 0")
    return v


def _pos_int(text: str) -> int:
    v = int(text)
    if v <= 0:
        raise argparse.ArgumentTypeError("must be > 0")
    return v


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m supervisor dev-server",
                                description="Serve the Spooled REST API from SQLite, for development and tests.",
                                epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)

    def add(flag, type_, default, help_, env=None):
        name = flag.lstrip("-").replace("-", "_")
        raw = os.environ.get(env) if env else None
        raw = raw if raw is not None else _env(name)
        if raw is not None and raw != "":
            try:
                default = type_(raw)
            except (ValueError, argparse.ArgumentTypeError) as e:
                p.error(f"environment value for {flag} is invalid ({raw!r}): {e}")
        p.add_argument(flag, type=type_, default=default, help=help_ + " (env SPOOLED_DEV_%s)" % name.upper()
                       + (f" or {env}" if env else "") + (f"; default {default}" if default is not None else ""))

    add("--host", str, "127.0.0.1", "interface to listen on")
    add("--port", int, 8787, "port; 0 picks a free one")
    add("--db", str, "spooled-dev.db", "SQLite database file, or :memory:")
    add("--api-key", str, None, "API key of the default organization; generated sp_test_... and stored if absent",
        env="SPOOLED_API_KEY")
    add("--lease-duration", _pos_int, 30, "default job lease in seconds (claim, job heartbeat, register response)")
    add("--heartbeat-interval", _pos_int, 10, "heartbeat_interval_secs in the register response")
    add("--lease-sweep-interval", _pos_float, 1.0, "seconds between expired-lease sweeps")
    add("--worker-offline-after", _pos_float, 120.0, "seconds without a heartbeat before a worker goes offline")
    add("--worker-sweep-interval", _pos_float, None, "seconds between stale-worker sweeps (default min(5, offline/4))")
    add("--max-workers", _nonneg_int, None, "worker cap per organization (default unlimited)")
    add("--rate-limit", _pos_float, None, "requests per second per organization (default unlimited)")
    add("--rate-burst", _pos_int, None, "token-bucket burst for --rate-limit (default 2x the rate)")
    add("--max-payload-bytes", _pos_int, 1048576, "max serialised job payload; over it 400 VALIDATION_ERROR")
    add("--max-body-bytes", _pos_int, 2 * 1024 * 1024, "max request body; over it 400 INVALID_JSON")
    add("--fault-503", _frac, 0.0, "fraction of API requests answered 503")
    add("--fault-delay-ms", _nonneg_int, 0, "delay API requests by this many milliseconds")
    add("--fault-delay-fraction", _frac, 1.0, "fraction of API requests that get --fault-delay-ms")
    add("--fault-cut", _frac, 0.0, "fraction of API responses cut off mid-body (socket closed)")
    add("--fault-seed", int, None, "seed of the fault RNG, for reproducible runs")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        store = Store(args.db)
        key = store.bootstrap(args.api_key)
    except Exception as e:
        print(f"error: cannot start on database {args.db!r}: {e}", file=sys.stderr, flush=True)
        return 2
    cfg = Config(lease_duration=args.lease_duration, heartbeat_interval=args.heartbeat_interval,
                 max_workers=args.max_workers, max_payload_bytes=args.max_payload_bytes,
                 max_body_bytes=args.max_body_bytes)
    faults = Faults(args.fault_503, args.fault_delay_ms, args.fault_cut, args.fault_delay_fraction, args.fault_seed)
    limiter = RateLimiter(args.rate_limit, args.rate_burst) if args.rate_limit else None
    app = App(store, cfg, faults, limiter)
    try:
        server = make_server(app, args.host, args.port)
    except OSError as e:
        print(f"error: cannot listen on {args.host}:{args.port}: {e}", file=sys.stderr, flush=True)
        store.close()
        return 1
    host, port = server.server_address[:2]
    sweeper = Sweeper(store, args.lease_sweep_interval, args.worker_offline_after, args.worker_sweep_interval).start()

    stop = threading.Event()

    def on_signal(signum, frame):
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    serve_in_thread(server)
    print(f"API key: {key}", flush=True)
    print(f"Spooled dev server listening on http://{host}:{port}", flush=True)
    extra = [f"db={args.db}"]
    if faults.active():
        extra.append(f"faults={faults.snapshot()}")
    if limiter:
        extra.append(f"rate_limit={args.rate_limit}/s")
    if args.max_workers is not None:
        extra.append(f"max_workers={args.max_workers}")
    print("dev server: " + " ".join(extra), file=sys.stderr, flush=True)
    while not stop.wait(0.5):
        pass
    server.shutdown()
    server.server_close()
    sweeper.stop()
    store.close()
    print("dev server stopped", file=sys.stderr, flush=True)
    return 0
