"""`python -m supervisor status`: a running daemon's children as a table, read from its health port.

Exit codes: 0 printed, 1 the daemon could not be reached or answered badly, 2 usage error.
The snapshot is one GET through `requests` (a timeout; one retry on a network error; no proxy from
the environment, since the health port is usually on loopback).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import requests

from supervisor import cli


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = cli.parser("status", description="Show a running supervisor's children (needs its --health-port). "
                        "With no --health-url, --port or SPOOLED_HEALTH_PORT, the daemon of a `dev` running in this "
                        "folder (or one above) is shown: `dev` writes its health port to .spooled/dev.json.")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--health-url", help="the daemon's health endpoint, e.g. http://127.0.0.1:8081")
    where.add_argument("--port", type=int, default=None,
                       help="the daemon's --health-port on --host (env SPOOLED_HEALTH_PORT)")
    parser.add_argument("--host", default="127.0.0.1", help="host for --port (default 127.0.0.1)")
    parser.add_argument("--timeout", type=float, default=3.0, help="seconds to wait for an answer (default 3)")
    parser.add_argument("--json", action="store_true", help="print the raw /status JSON instead of a table")
    return parser.parse_args(argv)


def status_url(args: argparse.Namespace) -> str | None:
    """The /status URL from --health-url, --port or SPOOLED_HEALTH_PORT; None when none is given."""
    if args.health_url:
        url = args.health_url.rstrip("/")
        if "://" not in url:
            url = "http://" + url
        return url if url.endswith("/status") else url + "/status"
    port = args.port
    if port is None and os.environ.get("SPOOLED_HEALTH_PORT", "").strip():
        port = int(os.environ["SPOOLED_HEALTH_PORT"])
    if port is None:
        from supervisor.commands.dev import find_running

        dev = find_running()
        url = dev.get("health_url") if dev else None
        return f"{url}/status" if url else None
    host = f"[{args.host}]" if ":" in args.host else args.host
    return f"http://{host}:{port}/status"


def fetch(url: str, timeout: float, attempts: int = 2) -> dict:
    """GET the snapshot; raises OSError/ValueError with a readable message."""
    with requests.Session() as session:
        session.trust_env = False
        resp = _get(session, url, timeout, attempts)
    if resp.status_code != 200:
        raise OSError(f"HTTP {resp.status_code} from {url}")
    try:
        return json.loads(resp.content)
    except ValueError:
        raise ValueError(f"not JSON: {resp.content[:80]!r}") from None


def _get(session: requests.Session, url: str, timeout: float, attempts: int) -> requests.Response:
    problem = "no attempt made"
    for _ in range(attempts):
        try:
            return session.get(url, timeout=(timeout, timeout), allow_redirects=False)
        except requests.RequestException as exc:
            problem = f"{type(exc).__name__}: {exc}"
    raise OSError(problem)


def fmt_runtime(secs: float | None) -> str:
    if secs is None:
        return "-"
    if secs < 60:
        return f"{secs:.1f}s"
    minutes, s = divmod(int(secs), 60)
    if minutes < 60:
        return f"{minutes}m{s:02d}s"
    hours, m = divmod(minutes, 60)
    return f"{hours}h{m:02d}m"


def fmt_mib(rss: int | None) -> str:
    return "-" if rss is None else f"{rss / 1048576:.1f}"


def queues(snap: dict) -> str:
    """Every queue in priority order, with its jobs in flight when it has any: `a (3 in flight), b`."""
    by_queue = snap.get("queues")
    if not isinstance(by_queue, dict) or not by_queue:
        return str(snap.get("queue", "?"))
    return ", ".join(name + (f" ({row['inflight']} in flight)" if isinstance(row, dict) and row.get("inflight")
                             else "") for name, row in by_queue.items())


def render(snap: dict) -> str:
    """The snapshot as a header plus one aligned row per child."""
    state = "draining" if snap.get("draining") else ("registered" if snap.get("registered") else "not registered")
    lines = [
        f"worker   {snap.get('worker_id', '?')}  (pid {snap.get('pid', '?')}, version {snap.get('version', '?')})",
        f"{'queues' if len(snap.get('queues') or {}) > 1 else 'queue':<8} {queues(snap)}",
        f"state    {state}",
        f"busy     {snap.get('busy', 0)}/{snap.get('procs', 0)}",
    ]
    memory = snap.get("memory") or {}
    if memory.get("limit_bytes"):
        lines.append(f"memory   {fmt_mib(memory.get('used_bytes'))} of {fmt_mib(memory['limit_bytes'])} MiB "
                     f"({memory.get('source', '?')}), {memory.get('state', '?')}"
                     + (", claims paused" if memory.get("paused") else ""))
    lines.append("")
    header = ("SLOT", "PID", "STATE", "JOB", "RUNTIME", "MEM MiB", "DONE", "RESTARTS")
    rows = [header]
    for child in sorted(snap.get("children") or [], key=lambda c: c.get("slot", 0)):
        rows.append((
            str(child.get("slot", "?")),
            str(child.get("pid") or "-"),
            str(child.get("state", "?")),
            str(child.get("job_id") or "-"),
            fmt_runtime(child.get("job_runtime_secs")),
            fmt_mib(child.get("memory_bytes", child.get("rss_bytes"))),  # the child's process tree
            str(child.get("jobs_done", 0)),
            str(child.get("restarts", 0)),
        ))
    running = {child.get("slot") for child in snap.get("children") or []}
    failing = sorted(snap.get("failing") or [], key=lambda f: f.get("slot", 0))
    for slot in failing:  # a slot with no child up (it keeps failing to start) is a row too
        if slot.get("slot") not in running:
            rows.append((str(slot.get("slot", "?")), "-", "failing", "-", "-", "-", "0", "-"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    for row in rows:
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    if len(rows) == 1:
        lines.append("(no children)")
    for slot in failing:
        retry = slot.get("retry_in_secs")
        when = "retries now" if not retry else f"retries in {fmt_runtime(retry)}"
        error = (str(slot.get("last_error") or "?").strip().splitlines() or ["?"])[0]
        lines.append(f"slot {slot.get('slot', '?')} failing to start ({slot.get('failures', '?')} in a row, {when}): "
                     f"{error}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        url = status_url(args)
    except ValueError:
        sys.stderr.write("error: SPOOLED_HEALTH_PORT must be a port number\n")
        return 2
    if url is None:
        sys.stderr.write("error: no health endpoint: pass --health-url or --port, or set SPOOLED_HEALTH_PORT "
                         "(the daemon serves one only when started with --health-port)\n")
        return 2
    try:
        snap = fetch(url, args.timeout)
    except (OSError, ValueError) as exc:
        sys.stderr.write(f"error: cannot read supervisor status from {url}: {exc}\n")
        return 1
    if not isinstance(snap, dict):
        sys.stderr.write(f"error: {url} did not answer with a status object\n")
        return 1
    sys.stdout.write(json.dumps(snap, indent=2) + "\n" if args.json else render(snap))
    return 0
