"""`python -m supervisor drain`: ask the daemon on this host to drain, and wait until it has.

Meant for a pod's preStop hook (and for an operator before a stop): POST /drain to the daemon's health
port on loopback makes it stop claiming and starting reserved jobs; the running jobs finish within its
drain timeout; then it deregisters, which hands the reserve (and whatever still runs at the deadline)
back to the queue at once, and exits. This command returns when the daemon is gone, so the stop signal
that follows finds nothing left to do.

Exit codes: 0 the daemon drained and exited; 1 it could not be reached, or still ran when the wait ended
(the stop signal then stops its children at once and their jobs go back to the queue); 2 usage error.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from collections.abc import Mapping
from typing import NoReturn

import requests

from supervisor import cli
from supervisor.config import OPTION_BY_DEST
from supervisor.ops.budget import DRAIN_REQUEST_TIMEOUT, stop_budget

POLL_EVERY = 0.5


def complain(message: str, code: int) -> int:
    """One line on stderr, named as the command was invoked; returns `code`."""
    sys.stderr.write(f"{cli.program()} drain: error: {message}\n")
    return code


class _Parser(argparse.ArgumentParser):
    """Usage errors as one line, exit 2."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {message} (see {self.prog} --help)\n")
        raise SystemExit(2)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = cli.parser("drain", cls=_Parser, description="Drain the local supervisor through its health port "
                        "and wait until it has exited (e.g. as a pod's preStop hook).")
    parser.add_argument("--port", type=int, default=None, help="the daemon's --health-port (env SPOOLED_HEALTH_PORT)")
    parser.add_argument("--host", default="127.0.0.1", help="loopback address of the port (default 127.0.0.1)")
    parser.add_argument("--timeout", type=float, default=None,
                        help="seconds to wait at most; default: the stop budget of SPOOLED_DRAIN_TIMEOUT, "
                             "SPOOLED_KILL_GRACE and SPOOLED_API_TIMEOUT, as the daemon computes it")
    return parser.parse_args(argv)


def setting(dest: str, environ: Mapping[str, str]) -> float:
    """A timing setting from the environment the daemon reads, parsed as the daemon parses it."""
    opt = OPTION_BY_DEST[dest]
    raw = environ.get(opt.env) or None
    if raw is None:
        return float(opt.default)
    try:
        return float(opt.parse(raw))
    except ValueError as exc:
        raise ValueError(f"{opt.env} {exc}, got {shlex.quote(raw[:80])}") from None


def default_wait(environ: Mapping[str, str]) -> float:
    return stop_budget(setting("drain_timeout", environ), setting("kill_grace", environ),
                       setting("api_timeout", environ)).total


def main(argv: list[str] | None = None) -> int:
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    port = args.port
    try:
        if port is None and os.environ.get("SPOOLED_HEALTH_PORT", "").strip():
            port = int(os.environ["SPOOLED_HEALTH_PORT"])
        wait = args.timeout if args.timeout is not None else default_wait(os.environ)
    except ValueError as exc:
        return complain(str(exc), 2)
    if port is None:
        return complain("no health port: pass --port or set SPOOLED_HEALTH_PORT (the daemon takes drain requests "
                        "there only when started with --health-port)", 2)
    host = f"[{args.host}]" if ":" in args.host else args.host
    base = f"http://{host}:{port}"
    with requests.Session() as session:
        session.trust_env = False
        try:
            answer = session.post(base + "/drain", timeout=DRAIN_REQUEST_TIMEOUT)
        except requests.RequestException as exc:
            return complain(f"cannot ask {base} to drain: {type(exc).__name__}; the stop signal will drain it "
                            "instead", 1)
        if answer.status_code != 202:
            return complain(f"{base}/drain answered HTTP {answer.status_code}: {answer.text.strip()[:200]}", 1)
        print(f"drain requested from {base}; waiting up to {wait:g} s for the daemon to exit", flush=True)
        return wait_for_exit(session, base, wait)


def wait_for_exit(session: requests.Session, base: str, wait: float) -> int:
    """Poll /status until the port stops answering (the daemon exited) or `wait` seconds pass."""
    deadline = time.monotonic() + wait
    shown = None
    while time.monotonic() < deadline:
        try:
            snap = session.get(base + "/status", timeout=DRAIN_REQUEST_TIMEOUT).json()
        except requests.ConnectionError:
            print("drained: the daemon deregistered and exited", flush=True)
            return 0
        except (requests.RequestException, ValueError):
            snap = {}
        running = snap.get("inflight", 0) - snap.get("reserved", 0)
        now_shown = (running, snap.get("reserved"))
        if now_shown != shown and snap:
            shown = now_shown
            print(f"running {running}, reserved {snap.get('reserved')} (handed back at the end)", flush=True)
        time.sleep(POLL_EVERY)
    return complain(f"the daemon still runs after {wait:g} s; the stop signal will stop its children at once and "
                    "hand their jobs back", 1)
