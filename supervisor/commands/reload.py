"""`python -m supervisor reload PID`: ask a running daemon to replace its children (they import the handler
anew), the way systemd's ExecReload= does it.

Under systemd (NOTIFY_SOCKET set, NotifyAccess=exec) it sends RELOADING=1 before SIGHUP, so systemd holds
the unit in `reloading`, and `systemctl reload` waits, until the daemon's READY=1 says every child is new.
(Were RELOADING=1 left to the daemon alone, systemd might see this command exit first and call the reload
done at once.) Elsewhere it only sends SIGHUP.
Exit codes: 0 sent, 1 the signal could not be sent, 2 usage error or no daemon at that pid.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

from supervisor import cli
from supervisor.ops.notify import Notifier

PARENT_TITLE = "spooled-supervisor: parent"


def build_parser() -> argparse.ArgumentParser:
    p = cli.parser("reload", description="Replace a running daemon's children, so they import "
                   "the handler anew (SIGHUP); under systemd this is the unit's ExecReload=.")
    p.add_argument("pid", type=int, help="the daemon's (parent's) pid, e.g. $MAINPID")
    return p


def refusal(pid: int) -> str | None:
    """Why `pid` is no daemon to reload, or None. Under systemd's ProtectProc=invisible and PrivateUsers= the
    daemon's /proc entry is hidden from this command; then being allowed to signal it has to do."""
    if pid <= 0:
        return f"pid {pid} is not a process id"
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return f"no process has pid {pid}"
    except PermissionError:
        return f"not allowed to signal pid {pid}"
    try:
        title = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return None
    if not title.startswith(PARENT_TITLE):
        return f"pid {pid} is not a spooled-supervisor daemon (it runs {title[:80]!r})"
    return None


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    problem = refusal(args.pid)
    if problem is not None:
        sys.stderr.write(f"{cli.program()} reload: error: {problem}\n")
        return 2
    notifier = Notifier.from_env()
    notifier.reloading(time.monotonic())
    try:
        os.kill(args.pid, signal.SIGHUP)
    except OSError as exc:
        notifier.ready()  # nothing will end the reload: leave the unit active
        sys.stderr.write(f"{cli.program()} reload: error: cannot signal pid {args.pid}: {exc}\n")
        return 1
    finally:
        notifier.close()
    return 0
