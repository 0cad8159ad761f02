"""`python -m supervisor run`: load the configuration, set up logging and telemetry, run the arbiter."""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from logging import ERROR, INFO, WARNING
from urllib.parse import quote

from supervisor import exitcodes
from supervisor.child import dumpable, probe
from supervisor.child import logs as child_logs
from supervisor.child.forkservers import start_forkserver
from supervisor.child.lifecycle import CHILD_INIT_ENV, EXIT_GRACE_ENV
from supervisor.client.rest import RateLimited, SpooledAPI
from supervisor.client.transport import Transport
from supervisor.commands import watch
from supervisor.config import Config, ConfigError, load_config, parse_queues
from supervisor.ops.hooks import DaemonHooks
from supervisor.ops.logs import log_event, setup_logging
from supervisor.parent import identity, orphans
from supervisor.parent.arbiter import Arbiter
from supervisor.parent.childproc import set_group_grace, shared_env

SECRET_ENV = ("SPOOLED_API_KEY", "SPOOLED_API_KEY_FILE", "CREDENTIALS_DIRECTORY")
log = logging.getLogger("supervisor")
MAX_START_RETRY_AFTER = 10.0  # seconds at most that a 429 at start-up holds the start
PROBE_TIMEOUT = 60.0  # seconds the handler's import may take when the queue is read from it
DAEMON_ONLY_ENV = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")


class HandlerRefused(Exception):
    """The handler could not be imported or is not one; str() is the boot error's text."""


NOT_LINUX = ("the daemon runs on Linux only (it uses /proc, prctl and cgroups); elsewhere run it in the container "
             "image (deploy/) or under WSL2")


class ChildInitRefused(HandlerRefused):
    """--child-init could not be imported or is not callable; str() is the one line to show."""


def main(argv: list[str]) -> int:
    if not sys.platform.startswith("linux"):
        sys.stderr.write(f"error: {NOT_LINUX}\n")
        return exitcodes.CONFIG
    try:
        cfg = load_config(argv)
    except ConfigError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return exitcodes.CONFIG
    own = identity.instance_metadata(time.time())
    for name in SECRET_ENV:  # children (via the forkserver) must never see the key
        os.environ.pop(name, None)
    if not cfg.share_api_key:  # /proc/<pid>/environ keeps the exec-time environment: only root may read it now
        dumpable.set_dumpable(False)
    setup_logging(cfg.log_format, cfg.log_level, secret=cfg.api_key.value)
    os.environ[child_logs.CHILD_LOGGING_ENV] = child_logs.order(cfg.log_format, cfg.log_level, cfg.child_logging)
    if not cfg.queues or cfg.child_init:
        checked = checked_handler(cfg)
        if isinstance(checked, int):
            return checked
        cfg = checked
    if cfg.api_url_source == "default":
        log_event(log, INFO, "no API URL given (--api-url, SPOOLED_API_URL or the file's api_url): using Spooled "
                  "Cloud", api_url=cfg.api_url, grpc_url=cfg.grpc_url if cfg.transport == "grpc" else None)
    hooks = DaemonHooks(cfg)  # reads, then unsets, systemd's NOTIFY_SOCKET and WATCHDOG_*
    client = SpooledAPI(cfg.api_url, cfg.api_key, timeout=cfg.api_timeout, ca_bundle=cfg.ca_bundle,
                        on_request=hooks.api_request)
    other = worker_id_in_use(client, cfg, own)
    if other is not None:
        log_event(log, ERROR, identity.in_use_message(cfg.worker_id, other))
        return exitcodes.WORKER_ID_IN_USE
    if cfg.watch:  # a save within the second of the last must not be read from a stale .pyc
        os.environ["PYTHONDONTWRITEBYTECODE"] = "1"
    orphans.become_subreaper()  # before the forkserver, so what escapes a child's group comes back to us
    set_group_grace(cfg.kill_grace)
    hand_to_children(cfg)
    # With the key and the notify socket out of the environment, before any thread; with --preload it imports
    # the handler's module (the parent never does); non-dumpable like the parent unless the key is shared.
    start_forkserver(cfg.handler if cfg.preload else None, sealed=not cfg.share_api_key)
    arbiter = Arbiter(cfg, choose_transport(cfg, client, hooks), hooks)
    try:
        hooks.start(arbiter.snapshot, arbiter.ask_drain)
    except OSError as exc:
        log.error("cannot serve the health port %s: %s", cfg.health_port, exc)
        return exitcodes.CONFIG
    watcher = start_watching(cfg) if cfg.watch else None
    try:
        return arbiter.run()
    finally:
        orphans.kill_forkserver_strays(grace=cfg.kill_grace)
        if watcher is not None:
            watcher.stop()
        orphans.kill_adopted(grace=cfg.kill_grace)
        hooks.stop()


def checked_handler(cfg: Config) -> Config | int:
    """The import probe for a queue taken from the handler or a --child-init to check: the config to run
    with, or the exit code (the error logged)."""
    try:
        return take_queue_from_handler(cfg) if not cfg.queues else check_handler(cfg)
    except ConfigError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return exitcodes.CONFIG
    except ChildInitRefused as exc:
        log_event(log, ERROR, str(exc))
        return exitcodes.HANDLER_IMPORT
    except HandlerRefused as exc:
        log_event(log, ERROR, f"cannot import handler {cfg.handler}: {exc}")
        return exitcodes.HANDLER_IMPORT


def start_watching(cfg: Config) -> watch.Watcher:
    """--watch: a thread that probes the handler after each save and sends this daemon the SIGHUP a reload
    sends (the arbiter's loop does the rest, as for `reload`)."""
    env = probe_env(cfg)
    roots = watch.handler_roots(cfg.handler, os.getcwd(), cfg.watch_paths)

    def reload() -> None:
        log_event(log, INFO, "code changed and the handler imports: reloading the children")
        os.kill(os.getpid(), signal.SIGHUP)

    def report(error: str | None) -> None:
        if error is None:
            log_event(log, INFO, "the handler imports again")
        else:
            log_event(log, ERROR, "code changed but the handler does not import; the children keep the code they "
                      "have until a save fixes it", error=error)

    log_event(log, INFO, "watching for code changes", paths=[str(p) for p, _ in roots])
    return watch.Watcher(cfg.handler, roots, env, None, reload, report).start()


def probe_env(cfg: Config) -> dict[str, str]:
    """The environment a probe of the handler's import runs in: the children's."""
    env = {k: v for k, v in os.environ.items() if k not in DAEMON_ONLY_ENV}
    env.update(shared_env(cfg))
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)  # the modules the children would find
    return env


def choose_transport(cfg: Config, rest: SpooledAPI, hooks: DaemonHooks) -> Transport:
    """The one place --transport is read: `rest` itself, or the gRPC API (with `rest`'s URL as its fallback).
    Called after the forkserver started: children never import grpc."""
    if cfg.transport == "grpc":
        from supervisor.client.grpc_transport import make_api

        return make_api(cfg, on_request=hooks.api_request)
    return rest


def worker_id_in_use(client: SpooledAPI, cfg: Config, own: dict, sleep: Callable[[float], None] = time.sleep,
                     wall: Callable[[], float] = time.time, clock: Callable[[], float] = time.monotonic) -> str | None:
    """Before registering: describe another live daemon on our worker id, or None to go ahead.

    A recent heartbeat from another instance is watched for up to about one heartbeat interval: if it
    advances, that daemon is alive; if not, it is a dead predecessor (crash, SIGKILL, pod restart) and we
    take the row over. Any API trouble means go ahead: registration has its own retries and errors."""
    row = _read_row(client, cfg.worker_id)
    interval = identity.row_heartbeat_interval(row)
    seen = identity.other_live_instance(row, own["instance_id"], wall(), interval)
    if seen is None:
        return None
    if identity.predecessor_gone(row, own):
        log_event(log, INFO, "the previous instance on this host is gone; taking the worker id over",
                  worker_id=cfg.worker_id, previous=seen)
        return None
    watch = identity.watch_deadline(interval)
    log_event(log, INFO, "worker id has a recent heartbeat from another instance; watching whether it is alive",
              worker_id=cfg.worker_id, other=seen, watch_secs=watch)
    deadline = clock() + watch
    step = max(0.2, min(1.0, interval / 4))
    while clock() < deadline:
        sleep(min(step, max(0.0, deadline - clock())))
        later = _read_row(client, cfg.worker_id)
        if later is None or later.get("status") == "offline":
            return None
        if identity.heartbeat_advanced(row, later):
            return identity.other_live_instance(later, own["instance_id"], wall(), interval)
    log_event(log, WARNING, "the other instance stopped heartbeating; taking the worker id over",
              worker_id=cfg.worker_id)
    return None


def _read_row(client: SpooledAPI, worker_id: str) -> dict | None:
    try:
        row = client.get(f"/api/v1/workers/{quote(worker_id, safe='')}")
    except RateLimited as exc:  # honour Retry-After before the first claim too (bounded: start-up waits)
        wait = min(float(exc.retry_after or 1.0), MAX_START_RETRY_AFTER)
        log_event(log, WARNING, "the API rate-limited the worker-row read; waiting its Retry-After before going on",
                  retry_in=wait)
        time.sleep(wait)
        return None
    except Exception as exc:  # 404 (no row yet), API down, anything: never block the start on it
        if getattr(exc, "status", None) != 404:
            log_event(log, WARNING, "could not read the worker row before registering; going ahead",
                      error=str(exc))
        return None
    return row if isinstance(row, dict) else None


def hand_to_children(cfg: Config, environ: dict[str, str] | os._Environ[str] = os.environ) -> None:
    """Put the children's own settings where they read them: the environment the forkserver inherits."""
    if cfg.child_init:
        environ[CHILD_INIT_ENV] = cfg.child_init
    else:
        environ.pop(CHILD_INIT_ENV, None)
    environ[EXIT_GRACE_ENV] = repr(cfg.child_exit_grace)


def check_handler(cfg: Config) -> Config:
    """--queue given and --child-init set: import both in a process of their own before any child starts."""
    probe_handler(cfg)
    return cfg


def take_queue_from_handler(cfg: Config) -> Config:
    """--queue not given: the queue of the handler's SDK worker (the handler is a SpooledWorker, or a
    function one registered with @worker.process), read by importing the handler in a process of its own."""
    about = probe_handler(cfg)
    queue = about.get("queue_name")
    if not queue:
        raise ConfigError(f"--queue is required (or set SPOOLED_QUEUE): {cfg.handler} is not a SpooledWorker's "
                          "handler, so it names no queue")
    try:
        parse_queues(queue)
    except ValueError as exc:
        raise ConfigError(f"the queue_name of {cfg.handler}'s worker {exc}, got {queue!r}") from None
    return dataclasses.replace(cfg, queues=(queue,), queue_source=cfg.handler)


def probe_handler(cfg: Config, timeout: float = PROBE_TIMEOUT) -> dict:
    """Import the handler in a fresh interpreter with the children's environment; return what it says
    about the handler's SDK worker ({} for a plain function). Raises HandlerRefused."""
    reply = probe.ask(cfg.handler, probe_env(cfg), timeout, init=cfg.child_init)
    answer = reply.answer
    if answer is None:
        if reply.late:
            raise HandlerRefused(f"importing the handler took longer than {timeout:g} s")
        raise HandlerRefused(f"the process importing the handler died ({death(reply.returncode)})")
    if "init_error" in answer:
        raise ChildInitRefused(answer["init_error"])
    if "error" in answer:
        raise HandlerRefused(answer["error"])
    return answer.get("about") or {}


def death(code: int | None) -> str:
    return f"signal {-code}" if code is not None and code < 0 else f"exit code {code}"
