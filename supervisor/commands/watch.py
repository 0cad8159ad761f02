"""`--watch` for `run` and `dev`: reload the children when the handler's code changes on disk.

A change to a Python file under the handler's package (or under a --watch-path) is first tried in a
short-lived process (`supervisor.child.probe`: the handler is imported there, not in the daemon); if it
imports, the daemon gets the SIGHUP that `reload` sends, so its children are replaced one at a time and a
running job finishes on the old code. If it does not, the old children keep running and the error is printed
once; the next save that imports reloads. File events come from `watchfiles` (inotify, in a Rust thread:
an idle watch costs no CPU), filtered to Python files.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import threading
from collections.abc import Callable, Iterable
from pathlib import Path

from supervisor.child import probe as probe_module

PROBE_TIMEOUT = 60.0
IGNORED_DIRS = {".spooled", ".venv", "venv", ".git", "__pycache__", "node_modules", ".mypy_cache", ".ruff_cache",
                ".pytest_cache", ".tox"}


def handler_roots(handler: str, cwd: str, extra: Iterable[str] = ()) -> list[tuple[Path, bool]]:
    """(path, recursive) pairs to watch: the top-level package of `handler`'s module, recursively; a module
    that is no package, its own file's folder, not recursively; then every `extra` path, recursively. The
    module is located (importlib's finder), never imported."""
    top = handler.split(":", 1)[0].split(".", 1)[0]
    roots: list[tuple[Path, bool]] = []
    saved = list(sys.path)
    sys.path.insert(0, cwd)
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        spec = None
    finally:
        sys.path[:] = saved
    if spec is not None and spec.submodule_search_locations:
        roots += [(Path(p), True) for p in spec.submodule_search_locations]
    elif spec is not None and spec.origin and spec.origin not in ("built-in", "frozen"):
        roots.append((Path(spec.origin).parent, False))
    else:
        roots.append((Path(cwd), False))  # not found yet (a typo, a file still to write): watch where it would be
    roots += [(Path(p).resolve(), True) for p in extra]
    return roots


def probe(handler: str, env: dict[str, str], cwd: str | None = None, timeout: float = PROBE_TIMEOUT) -> str | None:
    """Import `handler` in a fresh interpreter; None if it imports, else the error's text."""
    return probe_about(handler, env, cwd, timeout)[0]


def probe_about(handler: str, env: dict[str, str], cwd: str | None = None,
                timeout: float = PROBE_TIMEOUT) -> tuple[str | None, dict]:
    """(None, what the probe says of the handler's SDK worker) if `handler` imports, else (the error, {})."""
    reply = probe_module.ask(handler, env, timeout, cwd=cwd, quiet=True)
    if reply.answer is None:
        if reply.late:
            return f"importing {handler} took longer than {timeout:g} s", {}
        return f"the process importing {handler} died or answered badly (exit code {reply.returncode})", {}
    error = reply.answer.get("error")
    return (str(error), {}) if error else (None, reply.answer.get("about") or {})


def _python_file(path: str, roots: Iterable[Path]) -> bool:
    """A Python source under one of `roots`, not inside an ignored folder below that root (the root itself
    may lie in one: a package installed in .venv, a project in a folder named venv)."""
    if not path.endswith((".py", ".pyi")):
        return False
    for root in roots:
        try:
            below = Path(path).relative_to(root).parts[:-1]
        except ValueError:
            continue
        return not any(p in IGNORED_DIRS for p in below)
    return not any(p in IGNORED_DIRS for p in Path(path).parts[:-1])


def changes(roots: list[tuple[Path, bool]], stop: threading.Event) -> Iterable[set[str]]:
    """Sets of changed Python files under `roots`, each set one debounced burst of saves, until `stop`."""
    import watchfiles

    by_mode: dict[bool, list[Path]] = {}
    for path, recursive in roots:
        if path.exists():
            by_mode.setdefault(recursive, []).append(path)
    if not by_mode:
        stop.wait()
        return
    if len(by_mode) == 1:
        recursive, paths = next(iter(by_mode.items()))
        for batch in watchfiles.watch(*paths, recursive=recursive, stop_event=stop, debounce=300, step=100,
                                      watch_filter=lambda _change, p: _python_file(p, paths), raise_interrupt=False,
                                      ignore_permission_denied=True):
            yield {p for _change, p in batch}
        return
    # a module's folder (its own files only) and extra paths (all below them)
    flat = {str(p) for p in by_mode[False]}
    deep = [str(p) + os.sep for p in by_mode.get(True, [])]
    everything = sorted([*by_mode[False], *by_mode.get(True, [])], key=lambda p: -len(p.parts))  # deepest first

    def wanted(_change: object, p: str) -> bool:
        return _python_file(p, everything) and (str(Path(p).parent) in flat or any(p.startswith(d) for d in deep))

    for batch in watchfiles.watch(*by_mode[False], *by_mode.get(True, []), recursive=True, stop_event=stop,
                                  debounce=300, step=100, watch_filter=wanted, raise_interrupt=False,
                                  ignore_permission_denied=True):
        yield {p for _change, p in batch}


class Watcher:
    """On a thread: each burst of changes is probed; `reload()` is called when it imports, `report(text)` once
    per distinct error when it does not (and `report(None)` when a good save follows a bad one)."""

    def __init__(self, handler: str, roots: list[tuple[Path, bool]], env: dict[str, str], cwd: str | None,
                 reload: Callable[[], None], report: Callable[[str | None], None]):
        self.handler, self.roots, self.env, self.cwd = handler, roots, env, cwd
        self.reload, self.report = reload, report
        self.stop_event = threading.Event()
        self.broken: str | None = None  # the error last printed, until a good save
        self.thread = threading.Thread(target=self._run, name="watch", daemon=True)

    def start(self) -> Watcher:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stop_event.set()
        self.thread.join(5.0)

    def _run(self) -> None:
        for _batch in changes(self.roots, self.stop_event):
            if self.stop_event.is_set():
                return
            self.check()

    def check(self) -> bool:
        """Probe the handler now; reload on success. True if it imported."""
        error = probe(self.handler, self.env, self.cwd)
        if error is None:
            if self.broken is not None:
                self.report(None)
            self.broken = None
            self.reload()
            return True
        if error != self.broken:
            self.report(error)
        self.broken = error
        return False


def wait_until_importable(handler: str, roots: list[tuple[Path, bool]], env: dict[str, str], cwd: str | None,
                          stop: threading.Event) -> bool:
    """Block until a change makes `handler` import (True), or `stop` is set (False)."""
    for _batch in changes(roots, stop):
        if stop.is_set():
            return False
        if probe(handler, env, cwd) is None:
            return True
    return False
