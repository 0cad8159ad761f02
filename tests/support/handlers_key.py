"""A handler that hunts for the daemon's API key the way a hostile or careless job could, running as the
daemon's user: its own environment, then `/proc/<pid>/environ`, `cmdline` and `mem` of the daemon and every
process under it, and any key file or credentials directory those name. It returns everything it could
read (the test looks for the key in it) and what was refused.

`hunt` payload: {"daemon": PID}. `fail_long` payload: {"pad": N}: raises an error whose text holds the
shared key (SPOOLED_API_KEY) after N characters, so a cut before the scrub would leave part of it."""

from __future__ import annotations

import os
import re

from supervisor.child.dumpable import is_dumpable

PATH_HINTS = re.compile(r"(?:CREDENTIALS_DIRECTORY|SPOOLED_API_KEY_FILE)=([^\x00]+)|--api-key-file[ =]([^\x00 ]+)")


def _parent(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def daemon_processes(root: int) -> list[int]:
    """`root` and every process under it (by /proc's parent links), this one excluded."""
    by_parent: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            parent = _parent(int(name))
            if parent is not None:
                by_parent.setdefault(parent, []).append(int(name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(by_parent.get(pid, []))
    return [pid for pid in out if pid != os.getpid()]


def _read(path: str, size: int = 1 << 20) -> str:
    try:
        with open(path, "rb") as f:
            return f.read(size).decode("utf-8", "replace")
    except OSError as exc:
        return f"refused: {type(exc).__name__}"


def _mem(pid: int) -> str:
    """A little of the process's memory at its heap's start (only to see whether the kernel lets us)."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            start = next(int(line.split("-")[0], 16) for line in f if "[heap]" in line)
        with open(f"/proc/{pid}/mem", "rb") as f:
            f.seek(start)
            f.read(4096)
        return "read"
    except StopIteration:
        return "no heap"
    except OSError as exc:
        return f"refused: {type(exc).__name__}"


def hunt(ctx):
    daemon = int(ctx.payload["daemon"])
    found: dict[str, object] = {"own_environ": dict(os.environ), "dumpable": is_dumpable(), "procs": {}}
    texts = [repr(dict(os.environ))]
    for pid in daemon_processes(daemon):
        seen = {"environ": _read(f"/proc/{pid}/environ"), "cmdline": _read(f"/proc/{pid}/cmdline"), "mem": _mem(pid),
                "title": _read(f"/proc/{pid}/cmdline").split("\x00")[0]}
        found["procs"][str(pid)] = seen  # type: ignore[index]
        texts += [seen["environ"], seen["cmdline"]]
    files = {}
    for text in texts:  # follow any key file or credentials directory named anywhere
        for m in PATH_HINTS.finditer(text):
            path = (m.group(1) or m.group(2)).strip()
            for candidate in (path, os.path.join(path, "spooled-api-key")):
                if os.path.isfile(candidate):
                    files[candidate] = _read(candidate, 4096)
    found["files"] = files
    return found


def fail_long(ctx):
    pad = int(ctx.payload.get("pad", 2030))
    raise ValueError("x" * pad + " key=" + os.environ.get("SPOOLED_API_KEY", "") + " and more after it")


def log_key(ctx):
    """Logs the shared key three ways (plain logging, ctx.log, an exception's traceback) and returns its length."""
    import logging

    key = os.environ["SPOOLED_API_KEY"]
    logging.getLogger("app").warning("the token is %s", key)
    ctx.log("with the token", token=key)
    try:
        raise RuntimeError(f"refused {key}")
    except RuntimeError:
        logging.getLogger("app").exception("a call failed")
    return {"length": len(key)}
