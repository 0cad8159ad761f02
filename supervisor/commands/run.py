"""`python -m supervisor run`: load the configuration, set up logging and telemetry, run the arbiter."""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable
from logging import ERROR, INFO, WARNING
from urllib.parse import quote

from supervisor import exitcodes
from supervisor.child.forkservers import start_forkserver
from supervisor.client.rest import RateLimited, SpooledAPI
from supervisor.config import Config, ConfigError, load_config
from supervisor.ops.hooks import DaemonHooks
from supervisor.ops.logs import log_event, setup_logging
from supervisor.parent import identity, orphans
from supervisor.parent.arbiter import Arbiter
from supervisor.parent.childproc import set_group_grace

SECRET_ENV = ("SPOOLED_API_KEY", "SPOOLED_API_KEY_FILE", "CREDENTIALS_DIRECTORY")
log = logging.getLogger("supervisor")
MAX_START_RETRY_AFTER = 10.0  # seconds at most that a 429 at start-up holds the start


def main(argv: list[str]) -> int:
    try:
        cfg = load_config(argv)
    except ConfigError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return exitcodes.CONFIG
    own = identity.instance_metadata(time.time())
    for name in SECRET_ENV:  # children (via the forkserver) must never see the key
        os.environ.pop(name, None)
    setup_logging(cfg.log_format, cfg.log_level, secret=cfg.api_key.value)
    hooks = DaemonHooks(cfg)  # reads, then unsets, systemd's NOTIFY_SOCKET and WATCHDOG_*
    client = SpooledAPI(cfg.api_url, cfg.api_key, timeout=cfg.api_timeout, ca_bundle=cfg.ca_bundle,
                        on_request=hooks.api_request)
    other = worker_id_in_use(client, cfg, own)
    if other is not None:
        log_event(log, ERROR, identity.in_use_message(cfg.worker_id, other))
        return exitcodes.WORKER_ID_IN_USE
    orphans.become_subreaper()  # before the forkserver, so what escapes a child's group comes back to us
    set_group_grace(cfg.kill_grace)
    start_forkserver(cfg.handler if cfg.preload else None)  # with the key and the notify socket out of the
    # environment, before any thread; with --preload it imports the handler's module (the parent never does)
    if cfg.transport == "grpc":  # imported only now: children (from the forkserver) never import grpc
        from supervisor.client.grpc_transport import make_api

        client = make_api(cfg, on_request=hooks.api_request)  # type: ignore[assignment]  # builds the same calls
    arbiter = Arbiter(cfg, client, hooks)
    try:
        hooks.start(arbiter.snapshot)
    except OSError as exc:
        log.error("cannot serve the health port %s: %s", cfg.health_port, exc)
        return exitcodes.CONFIG
    try:
        return arbiter.run()
    finally:
        orphans.kill_adopted(grace=cfg.kill_grace)
        hooks.stop()


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
