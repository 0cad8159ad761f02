"""Loading the user's `--handler module:attr`, and the context object each job's handler is given.

The attribute may be a function, a coroutine function, or the official SDK's `SpooledWorker` /
`AsyncSpooledWorker` (its `@worker.process` function is used; its `start()` never runs here).

The contexts carry every field of the SDK's contexts under the same names and types (`job_id`,
`queue_name`, `payload`, `retry_count`, `max_retries`, `signal`, `log`, `progress`), plus `id`,
`timeout_seconds`, `lease_id`, `lease_expires_at` and `worker_id`. A coroutine handler gets an
`AsyncJobContext`: `log` and `progress` may be awaited (they also work un-awaited) and `signal` is an
`asyncio.Event`. `log` takes two forms, told apart by one rule: a call that gives the message as the
second argument (positionally or as `message=`) is the SDK's `log(level, message, meta=None)`; a call with
one positional argument is `log(message, **fields)`.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.abc
import importlib.machinery
import inspect
import logging
import math
import os
import sys
import threading
from collections.abc import Awaitable, Callable, Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from supervisor import sdkworker

KEY_VARIABLE = "SPOOLED_API_KEY"
SHARE_HINT = (f"the handler's module reads {KEY_VARIABLE}, which children get only with --share-api-key "
              "(SPOOLED_SHARE_API_KEY=1)")
SDK_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warn": logging.WARNING, "warning": logging.WARNING,
              "error": logging.ERROR}
_LINE_KEYS = frozenset({"ts", "level", "logger", "msg", "exc", "stack"})  # a JSON log line's own keys
_job_log = logging.getLogger("supervisor.job")


class HandlerSpecError(ValueError):
    """`--handler` names something that cannot run jobs; str() is the one line to show."""


class HandlerImportError(Exception):
    """Importing the handler's module failed; `hint` (if any) says what the operator can do about it."""

    def __init__(self, hint: str | None):
        super().__init__(hint or "")
        self.hint = hint


def not_found_hint(name: str) -> str:
    """The one line for a handler module that is nowhere on the path: where it was looked for, what to do."""
    return (f"No module named {name!r} in {os.getcwd()} (the current directory) or the installed packages: "
            "run from the project's directory, install it (pip install -e .) or add its directory to PYTHONPATH")


def parse_spec(spec: str) -> tuple[str, str]:
    module, sep, attr = spec.partition(":")
    if not sep or not module or not attr:
        raise HandlerSpecError(f"--handler must look like package.module:function, got {spec!r}")
    return module, attr


@dataclass(frozen=True)
class Handler:
    """A loaded handler: the function to call per job, whether it is a coroutine function, what the
    parent reports once about the SDK worker it came from (`about`, empty for a plain function), and that
    worker (None for a plain function), whose event hooks the child runs."""

    fn: Callable[..., Any]
    is_async: bool
    about: dict = field(default_factory=dict)
    worker: Any = None

    def __call__(self, ctx: Any) -> Any:
        return self.fn(ctx)


def load_handler(spec: str) -> Handler:
    """Import `module:attr` (dotted attributes allowed) and return the handler to run.

    Raises HandlerSpecError when the attribute is not a handler or an SDK worker with one registered, and
    HandlerImportError (chained to the cause) when the import fails, or reads the API key and finds none,
    in a child that was not given the key."""
    module_name, attr = parse_spec(spec)
    install_start_guard()
    with watch_key_reads() as missed:
        try:
            module: Any = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
                raise HandlerImportError(not_found_hint(exc.name)) from None  # importlib's frames: no help
            raise
        except KeyError as exc:
            if exc.args == (KEY_VARIABLE,) or missed:
                raise HandlerImportError(SHARE_HINT) from exc
            raise
        except Exception as exc:
            if missed:
                raise HandlerImportError(SHARE_HINT) from exc
            raise
    if missed:
        raise HandlerImportError(SHARE_HINT)
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise HandlerSpecError(missing_attribute(spec, module, obj, part)) from None
    handler = _as_handler(spec, module, obj)
    if _start_called:
        handler.about["start_called"] = list(_start_called)
    return handler


def missing_attribute(spec: str, module: Any, owner: Any, name: str) -> str:
    """One line for a --handler whose attribute is not there: where it was looked for, and (for a typo) the
    functions the module defines."""
    where = getattr(module, "__file__", None) or module.__name__
    what = "module" if owner is module else type(owner).__name__
    line = f"--handler {spec}: {what} {getattr(owner, '__name__', '')} ({where}) has no attribute {name}"
    if owner is module:
        found = sorted(n for n, v in vars(module).items() if not n.startswith("_") and callable(v)
                       and getattr(v, "__module__", None) == module.__name__)
        if found:
            line += "; it has: " + ", ".join(found[:12]) + (", ..." if len(found) > 12 else "")
    return line


def _as_handler(spec: str, module: Any, obj: Any) -> Handler:
    kind = sdkworker.worker_kind(obj)
    if kind:
        fn = sdkworker.registered_handler(obj)
        if fn is None:
            raise HandlerSpecError(f"{spec} is a {kind} with no handler registered: decorate the job function "
                                   "with @worker.process")
        return Handler(fn, _is_async(fn) or kind == "AsyncSpooledWorker", sdkworker.worker_facts(obj, kind), obj)
    if not callable(obj) or inspect.isclass(obj):
        what = f"the class {obj.__name__}" if inspect.isclass(obj) else f"a {type(obj).__name__}"
        raise HandlerSpecError(f"{spec} is {what}, not a handler or a SpooledWorker")
    owner = sdkworker.find_owner(module, obj)
    about = sdkworker.worker_facts(owner[1], sdkworker.worker_kind(owner[1]) or "") if owner else {}
    return Handler(obj, _is_async(obj), about, owner[1] if owner else None)


def _is_async(fn: Any) -> bool:
    return inspect.iscoroutinefunction(fn) or (callable(fn) and inspect.iscoroutinefunction(type(fn).__call__))


@contextmanager
def watch_key_reads() -> Iterator[list[str]]:
    """While active, the yielded list gets an entry each time code looks `SPOOLED_API_KEY` up in os.environ
    (`os.environ[...]`, `.get`, `os.getenv`) and finds nothing."""
    missed: list[str] = []
    environ_type = type(os.environ)
    original = environ_type.__getitem__

    def getitem(self: Any, key: Any) -> Any:
        try:
            return original(self, key)
        except KeyError:
            if key == KEY_VARIABLE:
                missed.append(key)
            raise

    environ_type.__getitem__ = getitem  # type: ignore[method-assign]
    try:
        yield missed
    finally:
        environ_type.__getitem__ = original  # type: ignore[method-assign]


# ---------------------------------------------------------------- the SDK worker's start() never runs here

_GUARDED = {"spooled.worker.worker": "SpooledWorker", "spooled.worker.async_worker": "AsyncSpooledWorker"}
_start_called: list[str] = []  # the SDK worker kinds whose start() was called (and did nothing)


def _report_start(kind: str) -> None:
    if kind not in _start_called:
        _start_called.append(kind)


def _disable_start(cls: Any) -> None:
    if cls is None or getattr(cls.start, "_supervisor_guard", False):
        return
    kind = cls.__name__
    if inspect.iscoroutinefunction(cls.start):
        async def start_async(self: Any) -> None:
            _report_start(kind)
        start: Any = start_async
    else:
        def start(self: Any) -> None:
            _report_start(kind)
    start._supervisor_guard = True
    cls.start = start


class _StartGuard(importlib.abc.MetaPathFinder):
    """Disables the SDK workers' `start()` as soon as their modules load, so a module that calls
    `worker.start()` at import (or builds its worker with auto_start) runs no SDK worker inside a child."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name not in _GUARDED:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        loader = spec.loader if spec is not None else None
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        run_module = loader.exec_module

        def exec_module(module: Any) -> None:
            run_module(module)
            _disable_start(getattr(module, _GUARDED[name], None))

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def install_start_guard() -> None:
    """Disable the SDK workers' `start()` in this process, now if loaded, else when they load."""
    for name, cls_name in _GUARDED.items():
        if name in sys.modules:
            _disable_start(getattr(sys.modules[name], cls_name, None))
    if not any(isinstance(finder, _StartGuard) for finder in sys.meta_path):
        sys.meta_path.insert(0, _StartGuard())


# ---------------------------------------------------------------- running a job

def new_context(handler: Any, job: dict, worker_id: str) -> JobContext | AsyncJobContext:
    """The context for one job: an AsyncJobContext for a coroutine handler, else a JobContext."""
    is_async = handler.is_async if isinstance(handler, Handler) else _is_async(handler)
    return (AsyncJobContext if is_async else JobContext).from_claim(job, worker_id)


def call_handler(fn: Callable, ctx: Any) -> Any:
    """Run the handler; a coroutine function is run to completion on a fresh event loop."""
    result = fn(ctx)
    if inspect.isawaitable(result):
        async def _await():
            return await result

        result = asyncio.run(_await())
    return result


class _Done:
    """An awaitable with nothing left to do: what the async context's `log` and `progress` return, so
    `await ctx.log(...)` works and an un-awaited `ctx.log(...)` has already logged."""

    __slots__ = ()

    def __await__(self) -> Generator[Any, None, None]:
        return iter(())  # type: ignore[return-value]

    def __repr__(self) -> str:
        return "<done>"


DONE = _Done()


def _log_call(args: tuple, kwargs: dict) -> tuple[int, str, dict]:
    """(level number, message, fields) from either form of `log` (see the module docstring)."""
    fields: dict[str, Any] = {}
    if len(args) >= 2 or "message" in kwargs:
        level = args[0] if args else kwargs.pop("level", "info")
        message = args[1] if len(args) >= 2 else kwargs.pop("message")
        meta = args[2] if len(args) >= 3 else kwargs.pop("meta", None)
        if isinstance(meta, dict):
            fields.update(meta)
        elif meta is not None:
            fields["meta"] = meta
        fields.update(kwargs)
        levelno = SDK_LEVELS.get(level.lower()) if isinstance(level, str) else None
        if levelno is None:
            levelno = logging.INFO
            fields["requested_level"] = level
        return levelno, str(message), fields
    if not args:
        raise TypeError("ctx.log() needs a message: ctx.log(level, message, meta=None) or ctx.log(message, **fields)")
    fields.update(kwargs)
    return logging.INFO, str(args[0]), fields


def _bounded(percent: Any) -> Any:
    """`percent` clamped to 0-100 (NaN counts as 0); what is not a number is kept as it is."""
    if isinstance(percent, float) and math.isnan(percent):
        return 0
    try:
        return max(0, min(100, percent))
    except TypeError:
        return percent


@dataclass
class _Job:
    """The job's facts, shared by both contexts; `from_claim` builds one from a claimed job."""

    job_id: str
    queue_name: str
    payload: dict[str, Any]
    retry_count: int = 0
    max_retries: int = 0
    timeout_seconds: int | None = None
    lease_id: str | None = None
    lease_expires_at: str | None = None
    worker_id: str = ""

    @property
    def id(self) -> str:
        return self.job_id

    @classmethod
    def from_claim(cls, job: dict, worker_id: str) -> Any:
        return cls(
            job_id=job["id"],
            queue_name=job.get("queue_name", ""),
            payload=job.get("payload"),  # type: ignore[arg-type]  # any JSON the job was created with
            retry_count=int(job.get("retry_count") or 0),
            max_retries=int(job.get("max_retries") or 0),
            timeout_seconds=job.get("timeout_seconds"),
            lease_id=job.get("lease_id"),
            lease_expires_at=job.get("lease_expires_at"),
            worker_id=worker_id,
        )

    def _write(self, args: tuple, kwargs: dict) -> None:
        """One line on the daemon's stderr: the message, then `job_id`, `queue` and the fields as keys."""
        levelno, message, fields = _log_call(args, kwargs)
        if not _job_log.isEnabledFor(levelno):
            return
        line = {(f"{k}_" if k in _LINE_KEYS else k): v for k, v in fields.items()}
        line.update(job_id=self.job_id, queue=self.queue_name)
        _job_log.log(levelno, message, extra={"fields": line})

    def _write_progress(self, percent: Any, message: str | None) -> None:
        bounded = _bounded(percent)
        text = f"progress {bounded}%" + (f": {message}" if message else "")
        self._write((text,), {"progress": bounded})


@dataclass
class JobContext(_Job):
    """What a function handler is given. `signal` is set when the daemon stops the job's child."""

    signal: threading.Event = field(default_factory=threading.Event)

    def log(self, *args: Any, **fields: Any) -> None:
        """`log(level, message, meta=None)` with level debug/info/warn/error (another level logs at INFO,
        kept as `requested_level`), or `log(message, **fields)` at INFO."""
        self._write(args, fields)

    def progress(self, percent: float, message: str | None = None) -> None:
        """Log the job's progress, clamped to 0-100 as the SDK does (local only, like the SDK's)."""
        self._write_progress(percent, message)


@dataclass
class AsyncJobContext(_Job):
    """What a coroutine handler is given: `log` and `progress` may be awaited; `signal` is an asyncio.Event
    set when the daemon stops the job's child."""

    signal: asyncio.Event = field(default_factory=asyncio.Event)

    def log(self, *args: Any, **fields: Any) -> Awaitable[None]:
        """As `JobContext.log`; logs at once and returns an awaitable that is already done."""
        self._write(args, fields)
        return DONE

    def progress(self, percent: float, message: str | None = None) -> Awaitable[None]:
        """As `JobContext.progress`; logs at once and returns an awaitable that is already done."""
        self._write_progress(percent, message)
        return DONE
