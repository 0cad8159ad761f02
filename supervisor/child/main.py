"""A child process: import the handler once, then run jobs sent by the parent, one at a time.

Started by the multiprocessing forkserver (a clean single-threaded process), never forked
from the threaded parent. It leads its own process group (the parent signals the whole group to
stop it), with a keeper process that empties the group once the child is gone
(supervisor.child.group); it ignores SIGINT (the parent decides), dies with SIGKILL when its
parent process dies (PR_SET_PDEATHSIG), and exits when the parent's end of the socket closes.

SIGTERM means the parent is stopping this child (timeout, lost lease, memory cap, drain, shutdown):
the running job's `ctx.signal` is set (the official SDK's abort signal, for threads the handler
started), `JobStopped` is raised in the handler's code so its `finally` blocks and context managers
run, and the child then dies of SIGTERM as before. A handler stuck in C code, or one that swallows
the exception, gets the parent's SIGKILL after --kill-grace.
"""

from __future__ import annotations

import asyncio
import ctypes
import importlib
import os
import signal
import socket
import sys
import time
import traceback
from types import TracebackType

import orjson

from supervisor import exactjson
from supervisor.child import dumpable, group, lifecycle, logs, wire
from supervisor.child.handler import (
    KEY_VARIABLE,
    AsyncJobContext,
    HandlerImportError,
    HandlerSpecError,
    JobContext,
    call_handler,
    load_handler,
    new_context,
)
from supervisor.child.wire import BootError, Done, Drop, Dropped, JobFrame, Ready, Settled, Started, Stop
from supervisor.job import Job
from supervisor.ops.title import set_title

BOOT_ERROR_EXIT = 3
ERROR_LIMIT = 2048
PR_SET_PDEATHSIG = 1


class JobStopped(BaseException):
    """Raised in the handler's code when the parent stops this child (SIGTERM)."""


_running: JobContext | AsyncJobContext | None = None  # the job this child runs now (SIGTERM sets its signal)
_life = lifecycle.Life(None, None, lifecycle.DEFAULT_EXIT_GRACE)  # what wraps its jobs and exit (child.lifecycle)
_shared_key = ""  # the API key the parent shared (--share-api-key), scrubbed from every error text
_jobs_run = 0  # jobs this child has started (numbers each job's mark, supervisor.child.group.JobProcesses)
_not_mine: frozenset[int] = frozenset()  # the keeper: never one of a job's processes
_group_grace = 3.0


def _on_sigterm(signum, frame) -> None:
    if _running is not None:
        _running.signal.set()
    raise JobStopped("the daemon stopped this job's child process (SIGTERM)")


def _die_of_sigterm() -> None:
    """End the way an unhandled SIGTERM ends a process, so the parent reads the same cause."""
    sys.stdout.flush()
    sys.stderr.flush()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)
    os._exit(128 + signal.SIGTERM)  # not reached


def release_forkserver() -> None:
    """Close this child's copy of the forkserver's keep-alive pipe (multiprocessing hands one to every
    child). Otherwise a busy child keeps the forkserver alive after the daemon is SIGKILLed, and the
    forkserver keeps the child alive (PR_SET_PDEATHSIG): orphans burning CPU for ever."""
    try:
        from multiprocessing import forkserver

        server = forkserver._forkserver
        fd = getattr(server, "_forkserver_alive_fd", None)
        if fd is not None:
            server._forkserver_alive_fd = None  # type: ignore[attr-defined]  # private, undeclared
            os.close(fd)
    except Exception:
        pass


def die_with_parent(daemon_pid: int) -> None:
    """SIGKILL this process when its parent (the forkserver, which exits with the daemon) dies."""
    release_forkserver()
    ppid = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except Exception:
        pass
    try:
        os.kill(daemon_pid, 0)
    except ProcessLookupError:
        os._exit(1)
    if os.getppid() != ppid:  # the parent died before prctl took effect
        os._exit(1)


def format_error(exc: BaseException, limit: int = ERROR_LIMIT) -> str:
    """`ExceptionType: message` followed by as much of the traceback's tail as fits in `limit`; a shared
    API key is replaced by *** wherever it appears, before anything is cut."""
    return _format_error(exc, limit)


def _scrub(text: str) -> str:
    """`text` with every form of the shared key (the one given at start, or the one in the environment now)
    replaced by ***; call it before cutting a text, never after."""
    from supervisor.client.calls import scrub_secret

    for key in {_shared_key, os.environ.get(KEY_VARIABLE, "")}:
        if len(key) >= 10:
            text = scrub_secret(text, key)
    return text


def boot_error_text(exc: BaseException) -> str:
    """The `boot_error` frame's text: one line saying what is wrong, then the traceback when it helps."""
    if isinstance(exc, HandlerSpecError):
        return _scrub(str(exc))
    if isinstance(exc, HandlerImportError) and exc.hint:
        cause = exc.__cause__
        return _scrub(exc.hint) + ("\n" + _format_error(cause, 4000) if cause is not None else "")
    return format_error(exc, 4000)


_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # supervisor/
_USER_CODE_IN_PACKAGE = {os.path.join(_PACKAGE, "demo_handlers.py")}  # the demo's handlers are user code
_ASYNCIO = os.path.dirname(os.path.abspath(asyncio.__file__))
_IMPORTLIB = os.path.dirname(os.path.abspath(importlib.__file__))
FRAMES_NOTE = "Traceback (innermost first, without the daemon's frames):"


def _daemon_frame(filename: str) -> bool:
    """A frame of the daemon's own code or of the import machinery: not what the user needs to see."""
    if filename.startswith("<frozen importlib"):
        return True
    path = os.path.abspath(filename)
    if path.startswith(_IMPORTLIB + os.sep):
        return True
    return path.startswith(_PACKAGE + os.sep) and path not in _USER_CODE_IN_PACKAGE


def user_frames(tb: TracebackType | None) -> list[traceback.FrameSummary]:
    """The traceback's frames the user wrote or called, innermost first: the frames that lead from the
    daemon to the handler (the daemon's, asyncio.run's, importlib's) and any daemon frame deeper in (ctx.log)
    left out. All of them when none is left (the error was the daemon's own)."""
    frames = traceback.extract_tb(tb)
    start = 0
    while start < len(frames) and (_daemon_frame(frames[start].filename)
                                   or os.path.abspath(frames[start].filename).startswith(_ASYNCIO + os.sep)):
        start += 1
    kept = [f for f in frames[start:] if not _daemon_frame(f.filename)]
    return list(reversed(kept or frames))


def _error_line(exc: BaseException) -> str:
    if isinstance(exc, SyntaxError):  # the file, line and caret are the point: right under the error line
        *where, line = "".join(traceback.format_exception_only(type(exc), exc)).rstrip().splitlines()
        return "\n".join([line, *where])
    return f"{type(exc).__name__}: {exc}".strip()


def _format_error(exc: BaseException, limit: int) -> str:
    """The error line, then the user's frames innermost first (so a cut keeps the user's file and line), then
    the cause's; at --log-level DEBUG the whole traceback as Python prints it instead of the frames. Scrubbed
    whole (the shared key) before anything is cut."""
    head = _scrub(_error_line(exc))
    if len(head) >= limit:
        return head[: limit - 3] + "..."
    if logs.level() == "DEBUG":
        body = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).rstrip()
    else:
        parts = [FRAMES_NOTE, *(line.rstrip("\n") for line in traceback.format_list(user_frames(exc.__traceback__)))]
        cause = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
        if cause is not None:
            parts.append(f"caused by {_error_line(cause)}")
            parts += [line.rstrip("\n") for line in traceback.format_list(user_frames(cause.__traceback__)[:3])]
        body = "\n".join(parts)
    text = _scrub(f"{head}\n{body}")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def run_job(handler, job: Job, worker_id: str, max_result_bytes: int, seen: dict | None = None) -> Done:
    """Run one job and build its `done` frame; never raises (SystemExit included). The result is encoded
    here, once, integers of any size exact; one with no JSON form (NaN, Infinity, a set, an object) fails
    the job with `ResultNotSerializable: ... (float('nan') at result['x'] is not valid JSON)`. `seen`, if
    given, gets the handler's return value ("result") or exception ("error")."""
    global _running
    ctx = _running = new_context(handler, job, worker_id)
    logs.job_started(ctx.job_id, ctx.queue_name)
    try:
        result = call_handler(handler, ctx)
    except JobStopped:
        raise
    except SystemExit as exc:
        if seen is not None:
            seen["error"] = exc
        return Done(job.id, False, error=f"SystemExit: handler called sys.exit({exc.code!r})")
    except BaseException as exc:  # KeyboardInterrupt included: the job fails, the child lives
        if seen is not None:
            seen["error"] = exc
        return Done(job.id, False, error=format_error(exc))
    finally:
        _running = None
        logs.job_ended()
    if seen is not None:
        seen["result"] = result
    try:
        encoded, wide = exactjson.dumps_strict_wide(result, "result")
    except exactjson.NotJSON as exc:
        error = _scrub(f"ResultNotSerializable: the handler's result could not be encoded as JSON ({exc})")
        return Done(job.id, False, error=error[:ERROR_LIMIT])
    if len(encoded) > max_result_bytes:
        error = (f"ResultTooLarge: the handler's result is {len(encoded)} bytes of JSON, over the "
                 f"{max_result_bytes} byte limit")
        return Done(job.id, False, error=error)
    return wire.done_ok(job.id, wire.WideJSON(encoded) if wide else orjson.Fragment(encoded))


def child_main(sock: socket.socket, handler_spec: str, slot: int, worker_id: str, max_result_bytes: int,
               parent_pid: int, group_grace: float = 3.0, env: dict[str, str] | None = None) -> None:
    """Entry point run by the forkserver for each child; `env` is added to its environment before the
    handler is imported (the API key and URL, when the operator shares them)."""
    global _shared_key, _not_mine, _group_grace
    dumpable.set_dumpable(True)  # a sealed forkserver's children inherit non-dumpable: they hold no key
    leader = group.lead_own_group()  # until then the parent signals this pid alone
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # until the handler is imported: die at once
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    die_with_parent(parent_pid)
    keeper = group.start_keeper(slot, group_grace) if leader else None
    _not_mine, _group_grace = frozenset({keeper} if keeper else ()), group_grace
    os.environ[group.JOB_MARK_ENV] = f"{os.getpid()}.0"  # what the start-up execs is marked as the child's
    sock.setblocking(True)
    title = f"spooled-supervisor: child {slot}"
    set_title(f"{title} starting")
    os.environ.update(env or {})
    lifecycle.forget_inherited_exits()
    logs.install()  # before the import: the module's import-time lines come out as the daemon's
    logs.rekey()  # the key shared with the handler, which an inherited handler was built without
    _shared_key = (env or {}).get(KEY_VARIABLE, "")
    try:
        handler = load_handler(handler_spec)
        life = lifecycle.begin(handler, worker_id)  # --child-init, tracing, the `started` hooks
    except BaseException as exc:
        logs.settle()
        try:
            wire.write_frame(sock, BootError(boot_error_text(exc)))
        finally:
            os._exit(BOOT_ERROR_EXIT)
    logs.settle()
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        serve(sock, handler, title, worker_id, max_result_bytes, keeper, life)
    except JobStopped:
        life.job_stopped()
        _die_of_sigterm()
    life.leave()  # the `stopped` hooks, atexit handlers, logging.shutdown(), within --child-exit-grace
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def serve(sock: socket.socket, handler, title: str, worker_id: str, max_result_bytes: int,
          keeper: int | None = None, life: lifecycle.Life | None = None) -> None:
    """Say `ready` (with the keeper's pid), then run each job the parent sends until it says `stop` or goes away.

    Jobs sent while one runs are held, in order, and the next is started as soon as the running one
    ends, without waiting for the parent (supervisor.child.wire describes the frames). `life` wraps each
    job (hooks, span) and acts on the parent's `settled` frames between jobs."""
    global _life
    inbox = wire.Inbox(sock)
    if life is not None:
        _life = life
    _life.frames = inbox.arrived
    about = getattr(handler, "about", None) or None
    wire.write_frame(sock, Ready(os.getpid(), keeper, about, _life.wants_settled))
    set_title(f"{title} idle")
    held: dict[str, JobFrame] = {}  # the parent's `job` frames not started yet, by job id, in the order sent
    job: Job | None = None
    going = True
    while going:
        if job is None:
            job, going = take_next(sock, inbox, held)
        else:
            job, going = run_then_next(sock, handler, job, held, inbox, title, worker_id, max_result_bytes)
        _life.between_jobs()
    _life.ending(sock)


def take_next(sock: socket.socket, inbox: wire.Inbox, held: dict[str, JobFrame]) -> tuple[Job | None, bool]:
    """Idle: wait for the parent's frames and return the job to start, if any, and whether to go on."""
    try:
        frames = inbox.arrived(wait=True)
    except (EOFError, OSError):
        return None, False
    out, stop = take_frames(frames, held)
    job = None
    if stop:
        out += [Dropped(job_id) for job_id in held]
    else:
        frame = next_held(held, out)
        if frame is not None:
            job = frame.job
            if frame.held:  # sent as a held job: the parent learns here that it started
                out.append(Started(job.id, time.monotonic()))
    return job, _write(sock, out) and not stop


def run_then_next(sock: socket.socket, handler, job: Job, held: dict[str, JobFrame], inbox: wire.Inbox, title: str,
                  worker_id: str, max_result_bytes: int) -> tuple[Job | None, bool]:
    """Run `job`, read what the parent sent meanwhile, and start the next held job at once, naming it in
    the `done` frame. Returns that job (None if none is held) and whether to go on."""
    set_title(f"{title} busy {job.id}")
    global _jobs_run
    _jobs_run += 1
    started = group.JobProcesses(_socket_inode(sock), _jobs_run)
    if _life.wraps:
        reply = _life.run(job, lambda seen: run_job(handler, job, worker_id, max_result_bytes, seen))
    else:
        reply = run_job(handler, job, worker_id, max_result_bytes)
    try:
        frames = inbox.arrived()
    except (EOFError, OSError):
        frames = [Stop()]
    out, stop = take_frames(frames, held)
    frame = None
    if stop:
        out += [Dropped(job_id) for job_id in held]
    else:
        frame = next_held(held, out)
    following = frame.job if frame is not None else None
    if following is not None:
        reply = Done(reply.id, reply.ok, reply.result, reply.error, following.id, time.monotonic())
        set_title(f"{title} busy {following.id}")
    else:
        set_title(f"{title} idle")
    going = _write(sock, [*out, reply]) and not stop
    # Nothing a job started outlives it: what it left running is stopped before the next job begins.
    group.stop_processes(started.started(_not_mine | _multiprocessing_helpers()), _group_grace)
    return following, going


def _multiprocessing_helpers() -> frozenset[int]:
    """multiprocessing's own servers a job may have started lazily (the resource tracker, the forkserver):
    they serve the child's later jobs too, and multiprocessing waits for them itself at the child's exit."""
    found = set()
    tracker = sys.modules.get("multiprocessing.resource_tracker")
    server = sys.modules.get("multiprocessing.forkserver")
    for pid in (getattr(getattr(tracker, "_resource_tracker", None), "_pid", None),
                getattr(getattr(server, "_forkserver", None), "_forkserver_pid", None)):
        if isinstance(pid, int) and pid > 0:
            found.add(pid)
    return frozenset(found)


def _socket_inode(sock: socket.socket) -> int | None:
    try:
        return os.fstat(sock.fileno()).st_ino
    except OSError:
        return None


def next_held(held: dict[str, JobFrame], out: list[wire.Up]) -> JobFrame | None:
    """Take the first held job that may still start: one past its `start_by` (its lease may have run out
    while the parent could not say so) is given back (`dropped`, added to `out`) instead."""
    now = time.monotonic()
    while held:
        frame = held.pop(next(iter(held)))
        if frame.start_by is None or now < frame.start_by:
            return frame
        out.append(Dropped(frame.job.id))
    return None


def take_frames(frames: list[wire.Down], held: dict[str, JobFrame]) -> tuple[list[wire.Up], bool]:
    """Apply the parent's frames to the held jobs: `job` adds one, `drop` takes one back (answered
    `dropped`); `settled` (how a job done earlier settled) is kept to act on between jobs. Returns
    the answers to send and whether `stop` came."""
    out: list[wire.Up] = []
    stop = False
    for frame in frames:
        if isinstance(frame, JobFrame):
            held[frame.job.id] = frame
        elif isinstance(frame, Drop):
            if held.pop(frame.id, None) is not None:
                out.append(Dropped(frame.id))
        elif isinstance(frame, Settled):
            _life.take_settled(frame)
        else:
            stop = True
    return out, stop


def _write(sock: socket.socket, msgs: list[wire.Up]) -> bool:
    """Send `msgs` (nothing to send is fine); False if the parent has gone."""
    try:
        if len(msgs) == 1:
            wire.write_frame(sock, msgs[0])
        elif msgs:
            wire.write_frames(sock, msgs)
    except OSError:
        return False
    return True
