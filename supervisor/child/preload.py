"""--preload: imported by the forkserver, before it forks any child, to import the handler's module there.

The parent puts the handler spec and its sys.path in SPOOLED_SUPERVISOR_PRELOAD while it starts the
forkserver; this module, run at the forkserver's start, imports the handler's module, then freezes the
garbage collector (gc.freeze) so collections in the children do not write to the shared pages, and
creates the `ready` file the parent waits for before it asks for a child. Every child forked afterwards
finds the module already imported: its pages are shared copy-on-write.

The atexit entries the import registers are recorded (`registered_exits`): each child forgets the
forkserver's own entries but registers these again, so what the handler's module set up to run at exit
runs at every child's exit (supervisor.child.lifecycle).

A failed import is not an error here: the forkserver must live on. Each child then imports the module
itself, fails the same way and reports the traceback (exit code 3), as without --preload.
"""

from __future__ import annotations

import atexit
import gc
import importlib
import json
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

PRELOAD_ENV = "SPOOLED_SUPERVISOR_PRELOAD"
error: str | None = None  # why the import failed in the forkserver, if it did
registered_exits: list[tuple] = []  # (func, args, kwargs) the handler's module registered with atexit


def preload_order(handler: str, path: list[str], ready: str) -> str:
    """What the parent puts in PRELOAD_ENV: the handler spec, the sys.path to import it with, and the file
    to create once the import is over."""
    return json.dumps({"handler": handler, "sys_path": path, "ready": ready})


@contextmanager
def recording_exits() -> Iterator[None]:
    """While active, what is registered with atexit.register is also kept in `registered_exits`."""
    real = atexit.register

    def register(func: Callable[..., Any], *args: Any, **kwargs: Any) -> Callable[..., Any]:
        registered_exits.append((func, args, kwargs))
        return real(func, *args, **kwargs)

    atexit.register = register  # type: ignore[assignment]
    try:
        yield
    finally:
        atexit.register = real


def _preload(order: str) -> None:
    global error
    from supervisor.child import logs

    logs.install()  # the children forked from here inherit the logging the import leaves
    try:
        spec = json.loads(order)
        sys.path[:] = [p for p in spec["sys_path"] if isinstance(p, str)] or sys.path
        with recording_exits():
            importlib.import_module(str(spec["handler"]).partition(":")[0])
    except BaseException as exc:  # SystemExit and KeyboardInterrupt too: the forkserver must not die
        error = f"{type(exc).__name__}: {exc}"
    logs.settle()
    gc.collect()
    gc.freeze()
    try:
        with open(json.loads(order)["ready"], "x"):
            pass
    except (OSError, ValueError, KeyError, TypeError):
        pass


_order = os.environ.pop(PRELOAD_ENV, None)
if _order is not None:
    _preload(_order)
