"""The `dev` command's terminal: the daemon's JSON log lines as one human line per job event.

`Renderer.line(text)` turns one line of the daemon's output into what the terminal shows (or None to hide
it): a job started, completed in N ms, or failed with its error and the handler's frame that raised; a
handler's own `ctx.log` lines; the daemon's warnings and notices. Anything that is not a JSON log line
(a handler's print) is shown as it came. It counts completed and failed jobs for the closing summary.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable

import orjson

_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')
_INTERNAL = ("/supervisor/", "/site-packages/", "<frozen", "/lib/python3", "importlib")


def user_frame(error: str) -> str | None:
    """`path:line in function` of the last traceback frame in the user's code, or None."""
    found = None
    for m in _FRAME.finditer(error):
        path = m.group(1)
        if not any(part in path for part in _INTERNAL):
            found = f"{path}:{m.group(2)} in {m.group(3)}"
    return found


def import_error_text(handler: str, error: str) -> str:
    """An import error for the terminal: what failed, the user's frame, then the traceback."""
    lines = error.splitlines() or [error]
    where = user_frame(error)
    head = f"error: cannot import the handler {handler}: {lines[0]}"
    return head + (f"\n  at {where}" if where else "") + ("\n" + "\n".join(lines[1:]) if len(lines) > 1 else "")


def short(job_id: object) -> str:
    return str(job_id)[:8]


class Renderer:
    """Formats the daemon's log lines; counts the jobs it saw end."""

    def __init__(self, full_error: Callable[[str], str | None] = lambda job_id: None) -> None:
        self.completed = 0
        self.failed = 0
        self.ready = False  # the daemon said it is ready (its signal handling is in place)
        self.health_port: int | None = None  # the port the daemon said it serves its health endpoints on
        self.full_error = full_error  # a job's whole last_error (the log line's is cut short)

    def line(self, text: str) -> str | None:
        text = text.rstrip("\n")
        if not text.startswith("{"):
            return text if text.strip() else None
        try:
            event = orjson.loads(text)
        except orjson.JSONDecodeError:
            return text
        if not isinstance(event, dict):
            return text
        return self.event(event)

    def event(self, e: dict) -> str | None:
        msg, level, job = str(e.get("msg", "")), str(e.get("level", "info")), e.get("job_id")
        stamp = time.strftime("%H:%M:%S")
        if e.get("logger") == "supervisor.job":  # the handler's ctx.log
            return f"{stamp}   {short(job)} | {msg}" + ("" if level == "info" else f"  ({level})")
        ms = f"{float(e.get('duration') or 0) * 1000:.0f} ms"
        if msg == "job started":
            return f"{stamp} > {short(job)} started on {e.get('queue')} (pid {e.get('pid')})"
        if msg == "job completed":
            self.completed += 1
            return f"{stamp} + {short(job)} completed in {ms}"
        if msg == "job failed":
            self.failed += 1
            error = str(e.get("error") or "")
            where = user_frame(self.full_error(str(job)) or error)
            return f"{stamp} x {short(job)} failed in {ms}: {error.splitlines()[0] if error else '?'}" + \
                (f" (at {where})" if where else "")
        if msg == "ready":
            self.ready = True
        if msg == "serving the health port" and type(e.get("port")) is int:
            self.health_port = e["port"]
        if level == "debug":
            return None
        extra = f" ({e['error']})" if e.get("error") else ""
        return f"{stamp}   {'' if level == 'info' else level + ': '}{msg}{extra}"
