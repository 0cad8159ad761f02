"""A child's start and end around its jobs: --child-init, the SDK worker's hooks, tracing, the exit flush.

In a child's life, in order:
  1. the forkserver forks it; the atexit entries it inherited are forgotten (`forget_inherited_exits`),
     but for those the handler's module registered while the forkserver preloaded it (--preload);
  2. the handler's module is imported (found imported under --preload);
  3. --child-init is called once (`begin`); then tracing is looked for, then the `started` hooks run;
  4. each job: a span (if tracing is on), `job:claimed`, `job:started`, the handler; between jobs, the
     hooks of earlier jobs as they settle (`job:completed`, `job:failed`, `job:lease_lost`);
  5. a graceful exit (the parent's `stop`): the `settled` frames still due are awaited for up to half of
     --child-exit-grace, then the `stopped` hooks, the atexit handlers (the handler's and its libraries':
     Sentry's, OpenTelemetry's span processors, ...) and logging.shutdown() run (`leave`); a child still
     busy when the grace has passed leaves anyway. The parent SIGKILLs a child --kill-grace after asking
     it to stop, so the exit gets the smaller of the two.
A child the parent stops with SIGTERM (a timeout, a lost lease, a memory cap during a job) runs none of 5.

The daemon hands the settings over through the environment the forkserver inherited (CHILD_INIT_ENV,
EXIT_GRACE_ENV), as its children see every variable the daemon was started with.
"""

from __future__ import annotations

import atexit
import importlib
import logging
import os
import select
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from supervisor.child import hooks as hooks_module
from supervisor.child import preload, tracing
from supervisor.child.handler import HandlerImportError, HandlerSpecError, parse_spec
from supervisor.child.wire import Done, Down, Settled
from supervisor.job import Job

CHILD_INIT_ENV = "SPOOLED_CHILD_INIT"
EXIT_GRACE_ENV = "SPOOLED_CHILD_EXIT_GRACE"
DEFAULT_EXIT_GRACE = 2.0


def forget_inherited_exits() -> None:
    """Drop the atexit entries this child inherited from the forkserver, then register again those the
    handler's module (and what it imported) registered while the forkserver preloaded it."""
    atexit._clear()
    for func, args, kwargs in preload.registered_exits:
        atexit.register(func, *args, **kwargs)


def load_init(spec: str) -> Callable[[], Any]:
    """Import --child-init's `module:function`. HandlerSpecError (one line) when it is malformed or not
    callable; the import's own exception when the module does not import."""
    try:
        module_name, attr = parse_spec(spec)
    except HandlerSpecError:
        raise HandlerSpecError(f"--child-init must look like package.module:function, got {spec!r}") from None
    obj: Any = importlib.import_module(module_name)
    try:
        for part in attr.split("."):
            obj = getattr(obj, part)
    except AttributeError:
        raise HandlerSpecError(f"--child-init {spec}: module {module_name} has no attribute {attr}") from None
    if not callable(obj):
        raise HandlerSpecError(f"--child-init {spec} is a {type(obj).__name__}, not a function")
    return obj


def init_problem(spec: str) -> str | None:
    """Why --child-init `spec` cannot be used, in one line (None when it can): checked before children start."""
    try:
        load_init(spec)
    except HandlerSpecError as exc:
        return str(exc)
    except BaseException as exc:
        first = f"{type(exc).__name__}: {exc}".strip().splitlines()[0][:500]
        return f"cannot import --child-init {spec}: {first}"
    return None


def exit_grace(environ: dict[str, str] | os._Environ[str] = os.environ) -> float:
    try:
        grace = float(environ.get(EXIT_GRACE_ENV, DEFAULT_EXIT_GRACE))
    except ValueError:
        return DEFAULT_EXIT_GRACE
    return grace if 0 <= grace <= 300 else DEFAULT_EXIT_GRACE


class Life:
    """What wraps this child's jobs and its exit (see the module docstring); `wraps` is False when
    nothing does, and the child then calls its jobs directly."""

    def __init__(self, hooks: hooks_module.Hooks | None, tracer: tracing.JobTracer | None, grace: float):
        self.hooks, self.tracer, self.grace = hooks, tracer, grace
        self.wraps = hooks is not None or tracer is not None
        self.wants_settled = hooks is not None and hooks.wants_settled
        self.running: Job | None = None  # the job running now, while `run` runs it
        self.frames: Callable[[], list[Down]] = list  # what the parent sent and was not read yet (the child's Inbox)
        self.end_began: float | None = None  # when the parent asked this child to go (monotonic)

    def run(self, job: Job, go: Callable[[dict], Done]) -> Done:
        """Run `go(seen)` (the job) with its span and hooks around it; its reply."""
        if self.tracer is not None:
            return self.tracer.run(job, lambda seen: self._run(job, go, seen))
        return self._run(job, go, {})

    def _run(self, job: Job, go: Callable[[dict], Done], seen: dict) -> Done:
        hooks = self.hooks
        self.running = job
        if hooks is not None:
            hooks.job_begins(job)
        reply = go(seen)
        self.running = None
        if hooks is not None:
            hooks.job_ended(job, seen)
        return reply

    # ---------------------------------------------------------------- how its jobs settled
    def take_settled(self, frame: Settled) -> None:
        if self.hooks is not None:
            self.hooks.take_settled(frame)

    def between_jobs(self) -> None:
        """Run the hooks of the jobs whose `settled` frame came (no job runs now)."""
        if self.hooks is not None and self.hooks.settled:
            self.hooks.run_settled()

    def ending(self, sock: socket.socket) -> None:
        """The parent asked this child to go: await the `settled` frames still due, for up to half the grace."""
        self.end_began = time.monotonic()
        if self.wants_settled:
            self.await_settled(sock, self.frames, self.end_began + self.grace / 2)

    def await_settled(self, sock: socket.socket, frames: Callable[[], list[Down]], until: float) -> None:
        """Read the parent's frames until every job done here settled, or `until` (monotonic)."""
        hooks = self.hooks
        while hooks is not None and hooks.awaiting:
            self.between_jobs()
            left = until - time.monotonic()
            if not hooks.awaiting or left <= 0:
                break
            if not select.select([sock], [], [], left)[0]:
                break
            try:
                arrived = frames()
            except (EOFError, OSError):
                break
            for frame in arrived:
                if isinstance(frame, Settled):
                    self.take_settled(frame)
        self.between_jobs()

    def job_stopped(self) -> None:
        """The daemon stopped the running job (SIGTERM): run the hooks of the `settled` frames that came
        meanwhile, that job's lost lease included. Best effort: the parent SIGKILLs after --kill-grace."""
        if self.hooks is None:
            return
        try:
            for frame in self.frames():
                if isinstance(frame, Settled):
                    self.take_settled(frame)
        except (EOFError, OSError):
            pass
        self.hooks.run_settled(running=self.running)

    # ---------------------------------------------------------------- the end
    def leave(self) -> None:
        """A graceful exit: the `stopped` hooks, the atexit handlers and logging.shutdown(), cut short
        once --child-exit-grace has passed since the parent asked this child to go."""
        cut_at = (self.end_began or time.monotonic()) + self.grace
        threading.Thread(target=_cut, args=(cut_at,), name="spooled-exit-grace", daemon=True).start()
        if self.hooks is not None:
            self.hooks.stopped()
        atexit._run_exitfuncs()
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()


def _cut(at: float) -> None:
    """Leave at `at` whatever the exit is doing (a hook or a flush that hangs)."""
    time.sleep(max(0.0, at - time.monotonic()))
    try:
        os.write(2, b'{"level":"warning","logger":"supervisor.child","msg":"the child\'s exit ran past '
                    b'--child-exit-grace; leaving without finishing it"}\n')
    finally:
        os._exit(0)


def begin(handler: Any, worker_id: str) -> Life:
    """After the handler's import: --child-init, then tracing, then the `started` hooks. Raises
    HandlerImportError (chained) when --child-init cannot be loaded or raises: the child's boot error."""
    spec = os.environ.get(CHILD_INIT_ENV, "").strip()
    if spec:
        try:
            init = load_init(spec)
        except HandlerSpecError:
            raise
        except BaseException as exc:
            raise HandlerImportError(f"cannot import --child-init {spec}") from exc
        try:
            init()
        except BaseException as exc:
            raise HandlerImportError(f"--child-init {spec} raised {type(exc).__name__}: {exc}") from exc
    hooks = hooks_module.hooks_of(getattr(handler, "worker", None), worker_id)
    life = Life(hooks, tracing.job_tracer(worker_id), exit_grace())
    if hooks is not None:
        hooks.started()
    return life
