"""`python -m supervisor run`: load the configuration, set up logging and telemetry, run the arbiter."""

from __future__ import annotations

import logging
import os
import sys

from supervisor import exitcodes
from supervisor.client.rest import SpooledAPI
from supervisor.config import ConfigError, load_config
from supervisor.ops.hooks import DaemonHooks
from supervisor.ops.logs import setup_logging
from supervisor.parent.arbiter import Arbiter
from supervisor.parent.childproc import start_forkserver

SECRET_ENV = ("SPOOLED_API_KEY", "SPOOLED_API_KEY_FILE", "CREDENTIALS_DIRECTORY")


def main(argv: list[str]) -> int:
    try:
        cfg = load_config(argv)
    except ConfigError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return exitcodes.CONFIG
    for name in SECRET_ENV:  # children (via the forkserver) must never see the key
        os.environ.pop(name, None)
    setup_logging(cfg.log_format, cfg.log_level, secret=cfg.api_key.value)
    hooks = DaemonHooks(cfg)  # reads, then unsets, systemd's NOTIFY_SOCKET and WATCHDOG_*
    start_forkserver()  # with the key and the notify socket out of the environment, before any thread
    client = SpooledAPI(cfg.api_url, cfg.api_key, timeout=cfg.api_timeout, ca_bundle=cfg.ca_bundle,
                        on_request=hooks.api_request)
    arbiter = Arbiter(cfg, client, hooks)
    try:
        hooks.start(arbiter.snapshot)
    except OSError as exc:
        logging.getLogger("supervisor").error("cannot serve the health port %s: %s", cfg.health_port, exc)
        return exitcodes.CONFIG
    try:
        return arbiter.run()
    finally:
        hooks.stop()
