"""`python -m supervisor dev-server`: flags and environment, start-up, signal handling.

Start-up prints (flushed) `API key: <key>` and `Spooled dev server listening on
http://HOST:PORT`. A key the server made itself is printed whole; one it adopted (--api-key,
SPOOLED_API_KEY, SPOOLED_DEV_API_KEY) only as its source and last four characters (`API key: from
SPOOLED_API_KEY, ending ...wxyz`). --key-file PATH writes the key in use to PATH (mode 0600), for scripts.
SIGTERM / SIGINT stop serving, close the DB and exit 0.
Every flag also reads an environment variable SPOOLED_DEV_<NAME> (the API key
also reads SPOOLED_API_KEY); a flag on the command line wins.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from typing import NoReturn

from supervisor import cli

from .app import App, ServerConfig, make_server, serve_in_thread
from .faults import Faults, RateLimiter
from .store import Store
from .sweeps import Sweeper
from .transport import Limits, fit_fd_limit

EPILOG = """\
Resilience switches (to test a worker against a misbehaving API):
  --fault-503 F         answer a fraction F (0-1) of /api/v1 requests with 503 SERVICE_UNAVAILABLE
  --fault-delay-ms N    delay /api/v1 requests by N ms (a --fault-delay-fraction of them; default all)
  --fault-cut F         handle a fraction F of requests, then send the headers and half the body and
                        close the socket (the write happened; the client never sees the answer)
  --max-workers N       worker cap: register answers 429 QUOTA_EXCEEDED beyond N healthy/degraded workers
  --rate-limit RPS      per-organization token bucket; 429 RATE_LIMIT_EXCEEDED with Retry-After
Faults never touch /health* or /_dev/faults. While running, GET/POST /_dev/faults (any valid key)
reads/replaces {"fail_503": F, "delay_ms": N, "cut": F, "fail_status": 503 (or 408, 5xx)} for the
key's organization alone; every /_dev route acts for the caller's organization only.
To lose a lease on demand: POST /_dev/leases/{job_id}/expire, or /steal with {"worker_id": W}.
GET /_dev/requests[?since=UNIX_TIME] lists the caller's /api/v1 requests of the last 10,000 (status, lease_id, t).

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


def _on_off(text: str) -> str:
    if text not in ("on", "off"):
        raise argparse.ArgumentTypeError("must be on or off")
    return text


def _grpc_server(text: str) -> str:
    if text not in ("wire", "grpcio"):
        raise argparse.ArgumentTypeError("must be wire or grpcio")
    return text


def _nonneg_int(text: str) -> int:
    v = int(text)
    if v < 0:
        raise argparse.ArgumentTypeError("must be >= 0")
    return v


def _pos_float(text: str) -> float:
    v = float(text)
    if not 0 < v < float("inf"):  # also refuses nan
        raise argparse.ArgumentTypeError("must be a finite number > 0")
    return v


def _pos_int(text: str) -> int:
    v = int(text)
    if v <= 0:
        raise argparse.ArgumentTypeError("must be > 0")
    return v


class _Parser(argparse.ArgumentParser):
    """Refuses an unknown flag naming only the flags: a value after one (`--api sk_...`) may be a key."""

    def error(self, message: str) -> NoReturn:
        head, sep, rest = message.partition("unrecognized arguments: ")
        if sep:
            flags = [a.split("=", 1)[0] for a in rest.split() if a.startswith("-")]
            message = head + sep + (" ".join(flags) or "values") + " (values not shown)"
        super().error(message)


def build_parser() -> argparse.ArgumentParser:
    p = cli.parser("dev-server", cls=_Parser,
                   description="Serve the Spooled REST API from SQLite, for development and tests.",
                   epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)

    def add(flag, type_, default, help_, env=None, secret=False):
        """A flag that also reads SPOOLED_DEV_<NAME> (and `env`); a `secret` one's value is never shown in --help."""
        name = flag.lstrip("-").replace("-", "_")
        raw = os.environ.get(env) if env else None
        raw = raw if raw is not None else _env(name)
        if raw is not None and raw != "":
            try:
                default = type_(raw)
            except (ValueError, argparse.ArgumentTypeError) as e:
                p.error(f"environment value for {flag} is invalid ({'the value is not shown' if secret else repr(raw)})"
                        f": {e}")
        shown = "; set in the environment (not shown)" if secret else f"; default {default}"
        p.add_argument(flag, type=type_, default=default, help=help_ + f" (env SPOOLED_DEV_{name.upper()})"
                       + (f" or {env}" if env else "") + (shown if default is not None else ""))

    add("--host", str, "127.0.0.1", "interface to listen on")
    add("--port", int, 8787, "port; 0 picks a free one")
    add("--grpc-port", _nonneg_int, None, "also serve Spooled's gRPC API on this port (0 picks a free one; needs the "
        "grpc extra); off unless given")
    add("--grpc-server", _grpc_server, "wire", "what serves gRPC: wire (its own HTTP/2 on one I/O thread, a third "
        "of grpcio's CPU per call) or grpcio (grpcio's server)")
    add("--grpc-stream-limit", _pos_int, 100, "open gRPC streams (StreamJobs, ProcessJobs) per organization; "
        "past it a new one is RESOURCE_EXHAUSTED")
    add("--grpc-stream-poll", _pos_float, 1.0, "seconds a StreamJobs stream sleeps when it has nothing to hand "
        "out (the real server's STREAM_POLL_INTERVAL_MS)")
    add("--db", str, "spooled-dev.db", "SQLite database file, or :memory:")
    add("--key-file", str, None, "write the API key in use to this file (mode 0600) once serving, for scripts "
        "and tests; the start line never shows a key given to the server")
    add("--api-key", str, None, "API key of the default organization; generated sp_test_... and stored if absent",
        env="SPOOLED_API_KEY", secret=True)
    add("--lease-duration", _pos_int, 30, "default job lease in seconds (claim, job heartbeat, register response)")
    add("--heartbeat-interval", _pos_int, 10, "heartbeat_interval_secs in the register response")
    add("--lease-sweep-interval", _pos_float, 1.0, "seconds between expired-lease sweeps")
    add("--worker-offline-after", _pos_float, 120.0, "seconds without a heartbeat before a worker goes offline")
    add("--worker-sweep-interval", _pos_float, None, "seconds between stale-worker sweeps (default min(5, offline/4))")
    add("--schedule-interval", _pos_float, 1.0, "seconds between checks for due schedules (each due one fires once)")
    add("--max-workers", _nonneg_int, None, "worker cap per organization (default unlimited)")
    add("--rate-limit", _pos_float, None, "requests per second per organization (default unlimited)")
    add("--rate-burst", _pos_int, None, "token-bucket burst for --rate-limit (default 2x the rate)")
    add("--max-payload-bytes", _pos_int, 1048576, "max serialised job payload; over it 400 VALIDATION_ERROR")
    add("--max-body-bytes", _pos_int, 2 * 1024 * 1024, "max request body; over it 400 INVALID_JSON")
    add("--max-header-bytes", _pos_int, 16384, "max request line + headers; over it 414 / 431")
    add("--events", _on_off, "on", "serve GET /api/v1/events, the server-sent events stream (off: 404, as a "
        "server without it)")
    add("--webhook-timeout", _pos_float, 10.0, "seconds one outgoing webhook delivery attempt may take in all")
    add("--webhook-backoff", _pos_float, 1.0, "seconds before the first retry of a failed webhook delivery "
        "(doubling, 5 attempts in all)")
    add("--max-connections", _pos_int, 1024, "open connections; beyond, a new one gets 503 and is closed")
    add("--request-timeout", _pos_float, 5.0, "seconds a request may take to arrive after its first byte; "
        "then 408 and close")
    add("--idle-timeout", _pos_float, 30.0, "seconds a keep-alive connection may sit idle before it is closed")
    add("--fault-503", _frac, 0.0, "fraction of API requests answered 503")
    add("--fault-delay-ms", _nonneg_int, 0, "delay API requests by this many milliseconds")
    add("--fault-delay-fraction", _frac, 1.0, "fraction of API requests that get --fault-delay-ms")
    add("--fault-cut", _frac, 0.0, "fraction of API responses cut off mid-body (socket closed)")
    add("--fault-seed", int, None, "seed of the fault RNG, for reproducible runs")
    return p


def start_grpc(store, cfg, faults, limiter, host: str, port: int, events=None, stream_limit: int = 100,
               stream_poll: float = 1.0, implementation: str = "wire"):
    """The gRPC server, imported only when asked for (grpcio is the optional `grpc` extra)."""
    try:
        from .grpc_server import make_grpc_server
    except ImportError as e:
        raise ImportError(f"{e}; install it with: pip install 'spooled-supervisor[grpc]'") from None
    return make_grpc_server(store, cfg, faults, limiter, host, port, events=events, stream_limit=stream_limit,
                            stream_poll=stream_poll, implementation=implementation)


def _open_store(args: argparse.Namespace) -> tuple[Store, str] | None:
    """The store and the default organization's API key, or None after printing why the DB is unusable."""
    try:
        store = Store(args.db)
        key = store.bootstrap(args.api_key)
    except Exception as e:
        print(f"error: cannot start on database {args.db!r}: {e}", file=sys.stderr, flush=True)
        return None
    return store, key


def _connection_limits(args: argparse.Namespace) -> Limits:
    """Transport limits; --max-connections lowered (with a warning) to fit the open-file limit."""
    max_conns = fit_fd_limit(args.max_connections)
    if max_conns < args.max_connections:
        print(f"warning: --max-connections lowered to {max_conns} to fit the open-file limit (ulimit -n)",
              file=sys.stderr, flush=True)
    return Limits(max_connections=max_conns, request_timeout=args.request_timeout, idle_timeout=args.idle_timeout,
                  max_header_bytes=args.max_header_bytes)


def _stop_event_on_signals() -> threading.Event:
    """An event set by SIGTERM or SIGINT."""
    stop = threading.Event()

    def on_signal(signum, frame):
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return stop


def key_source(given: str | None, environ=os.environ) -> str | None:
    """Where the key given to the server came from, or None: it made its own. Decided from the value, not
    from argv, so no spelling of the flag can get a given key printed whole: a value one of the variables
    holds is named by that variable, any other is the flag's."""
    if not given:
        return None
    for name in ("SPOOLED_DEV_API_KEY", "SPOOLED_API_KEY"):
        if environ.get(name) == given:
            return name
    return "--api-key"


def key_line(key: str, source: str | None) -> str:
    """`API key: KEY` for a key the server made; a given one named by its source and last four characters."""
    return f"API key: {key}" if source is None else f"API key: from {source}, ending ...{key[-4:]}"


def _write_key_file(path: str, key: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(key + "\n")


def _announce(args: argparse.Namespace, key: str, host: str, port: int, grpc_port: int | None, faults: Faults,
              limiter: RateLimiter | None, source: str | None = None) -> None:
    """The start-up lines: key and addresses on stdout (tests and scripts read them), settings on stderr."""
    print(key_line(key, source), flush=True)
    print(f"Spooled dev server listening on http://{host}:{port}", flush=True)
    if grpc_port is not None:
        print(f"Spooled gRPC listening on {host}:{grpc_port}", flush=True)
    extra = [f"db={args.db}"]
    if faults.active():
        extra.append(f"faults={faults.snapshot()}")
    if limiter:
        extra.append(f"rate_limit={args.rate_limit}/s")
    if args.max_workers is not None:
        extra.append(f"max_workers={args.max_workers}")
    print("dev server: " + " ".join(extra), file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    source = key_source(args.api_key)
    opened = _open_store(args)
    if opened is None:
        return 2
    store, key = opened
    cfg = ServerConfig(lease_duration=args.lease_duration, heartbeat_interval=args.heartbeat_interval,
                       max_workers=args.max_workers, max_payload_bytes=args.max_payload_bytes,
                       max_body_bytes=args.max_body_bytes, events=args.events == "on",
                       webhook_timeout=args.webhook_timeout, webhook_backoff=args.webhook_backoff)
    faults = Faults(args.fault_503, args.fault_delay_ms, args.fault_cut, args.fault_delay_fraction, args.fault_seed)
    limiter = RateLimiter(args.rate_limit, args.rate_burst) if args.rate_limit else None
    app = App(store, cfg, faults, limiter)
    limits = _connection_limits(args)
    try:
        server = make_server(app, args.host, args.port, limits)
    except OSError as e:
        print(f"error: cannot listen on {args.host}:{args.port}: {e}", file=sys.stderr, flush=True)
        store.close()
        return 1
    host, port = server.server_address[:2]
    if args.key_file:
        try:
            _write_key_file(args.key_file, key)
        except OSError as e:
            print(f"error: cannot write --key-file {args.key_file}: {e}", file=sys.stderr, flush=True)
            server.server_close()
            store.close()
            return 2
    grpc_server, grpc_port = None, None
    if args.grpc_port is not None:
        try:
            grpc_server, grpc_port = start_grpc(store, cfg, faults, limiter, args.host, args.grpc_port, app.events,
                                                args.grpc_stream_limit, args.grpc_stream_poll, args.grpc_server)
        except (ImportError, OSError) as e:
            print(f"error: cannot serve gRPC on {args.host}:{args.grpc_port}: {e}", file=sys.stderr, flush=True)
            server.server_close()
            store.close()
            return 2 if isinstance(e, ImportError) else 1
    sweeper = Sweeper(store, args.lease_sweep_interval, args.worker_offline_after, args.worker_sweep_interval,
                      args.schedule_interval).start()
    stop = _stop_event_on_signals()
    serve_in_thread(server)
    _announce(args, key, host, port, grpc_port, faults, limiter, source)
    while not stop.wait(0.5):
        pass
    if grpc_server is not None:
        grpc_server.stop(1.0).wait(5)
    server.shutdown()
    server.server_close()
    sweeper.stop()
    store.close()
    print("dev server stopped", file=sys.stderr, flush=True)
    return 0
