"""The daemon's configuration: flags and environment turned into one validated `Config`.

`load_config(argv, environ)` either returns a Config or raises ConfigError with one line
saying what to fix. It does no network I/O and registers nothing.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import re
import socket
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from supervisor.client.rest import Secret

DEFAULT_API_URL = "https://api.spooled.cloud"
CREDENTIAL_NAME = "spooled-api-key"
_WORKER_ID_RX = re.compile(r"[^A-Za-z0-9._-]")
_QUEUE_RX = re.compile(r"^[^\W.-][\w.-]{0,99}$")


class ConfigError(Exception):
    """A configuration problem; str() is the one line shown to the operator."""


@dataclass(frozen=True)
class Config:
    api_url: str
    api_key: Secret = field(repr=False)
    queue: str
    handler: str
    worker_id: str
    hostname: str
    procs: int
    lease: int = 30
    drain_timeout: float = 25.0
    poll_interval: float = 5.0
    max_jobs_per_child: int = 0
    max_memory_per_child_mb: int = 0
    kill_grace: float = 3.0
    max_result_bytes: int = 1_900_000
    api_timeout: float = 10.0
    ca_bundle: str | None = None
    allow_insecure_http: bool = False
    health_host: str = "127.0.0.1"
    health_port: int | None = None
    log_format: str = "auto"
    log_level: str = "INFO"


def clean_worker_id(raw: str) -> str:
    """Hostname (or any text) -> a valid worker id: [A-Za-z0-9._-], 1-128 characters."""
    cleaned = _WORKER_ID_RX.sub("-", raw.strip())[:128].strip("-") or "worker"
    return cleaned


def _env(environ, name, default=None):
    value = environ.get(name)
    return default if value in (None, "") else value


def build_parser(environ) -> argparse.ArgumentParser:
    e = lambda name, default=None: _env(environ, name, default)  # noqa: E731
    p = argparse.ArgumentParser(
        prog="python -m supervisor [run]",
        description="Run CPU-bound jobs from a Spooled queue on N child processes. Every option also reads "
        "the environment variable shown. The API key comes from SPOOLED_API_KEY, --api-key-file, or the systemd "
        f"credential '{CREDENTIAL_NAME}' - never from a flag value, so it never shows in ps.",
    )
    p.add_argument("--queue", default=e("SPOOLED_QUEUE"), help="queue to claim jobs from (SPOOLED_QUEUE)")
    p.add_argument("--handler", default=e("SPOOLED_HANDLER"), help="the job handler, package.module:function; it receives a context with job_id, payload, ... (SPOOLED_HANDLER)")
    p.add_argument("--procs", type=int, default=e("SPOOLED_PROCS"), help="number of child processes (SPOOLED_PROCS; default: the CPU count)")
    p.add_argument("--api-url", default=e("SPOOLED_API_URL", DEFAULT_API_URL), help=f"Spooled API base URL (SPOOLED_API_URL; default {DEFAULT_API_URL})")
    p.add_argument("--api-key-file", default=e("SPOOLED_API_KEY_FILE"), help="file holding the API key (SPOOLED_API_KEY_FILE); otherwise SPOOLED_API_KEY or $CREDENTIALS_DIRECTORY/" + CREDENTIAL_NAME)
    p.add_argument("--api-key", help=argparse.SUPPRESS)
    p.add_argument("--worker-id", default=e("SPOOLED_WORKER_ID"), help="stable worker id, reused across restarts (SPOOLED_WORKER_ID; default: the hostname, e.g. the pod name)")
    p.add_argument("--lease", type=int, default=e("SPOOLED_LEASE", 30), help="job lease in seconds, 5-3600, renewed every third of it (SPOOLED_LEASE; default 30)")
    p.add_argument("--drain-timeout", type=float, default=e("SPOOLED_DRAIN_TIMEOUT", 25.0), help="seconds to let in-flight jobs finish after SIGTERM (SPOOLED_DRAIN_TIMEOUT; default 25)")
    p.add_argument("--poll-interval", type=float, default=e("SPOOLED_POLL_INTERVAL", 5.0), help="longest wait between claims on an empty queue; back-off starts at 50 ms (SPOOLED_POLL_INTERVAL; default 5)")
    p.add_argument("--max-jobs-per-child", type=int, default=e("SPOOLED_MAX_JOBS_PER_CHILD", 0), help="replace a child after about this many jobs, with up to 10%% jitter (SPOOLED_MAX_JOBS_PER_CHILD; 0 = never)")
    p.add_argument("--max-memory-per-child", type=int, default=e("SPOOLED_MAX_MEMORY_PER_CHILD", 0), metavar="MB", help="replace a child whose RSS exceeds this after its job; stop it and fail the job if it keeps growing during one (SPOOLED_MAX_MEMORY_PER_CHILD; 0 = no cap)")
    p.add_argument("--kill-grace", type=float, default=e("SPOOLED_KILL_GRACE", 3.0), help="seconds between SIGTERM and SIGKILL when stopping a child (SPOOLED_KILL_GRACE; default 3)")
    p.add_argument("--max-result-bytes", type=int, default=e("SPOOLED_MAX_RESULT_BYTES", 1_900_000), help="largest JSON result sent to the API; larger fails the job (SPOOLED_MAX_RESULT_BYTES)")
    p.add_argument("--api-timeout", type=float, default=e("SPOOLED_API_TIMEOUT", 10.0), help="seconds to wait for one API answer (SPOOLED_API_TIMEOUT; default 10)")
    p.add_argument("--ca-bundle", default=e("SPOOLED_CA_BUNDLE"), help="CA bundle for a private CA; TLS verification is always on (SPOOLED_CA_BUNDLE)")
    p.add_argument("--allow-insecure-http", action="store_true", default=e("SPOOLED_ALLOW_INSECURE_HTTP", "") in ("1", "true", "yes"), help="allow plain http:// to a host other than loopback (SPOOLED_ALLOW_INSECURE_HTTP)")
    p.add_argument("--health-port", type=int, default=e("SPOOLED_HEALTH_PORT"), help="serve /healthz, /readyz, /metrics and /status on this port (SPOOLED_HEALTH_PORT; off by default)")
    p.add_argument("--health-host", default=e("SPOOLED_HEALTH_HOST", "127.0.0.1"), help="address for the health port (SPOOLED_HEALTH_HOST; default 127.0.0.1, use 0.0.0.0 in a pod)")
    p.add_argument("--log-format", choices=["auto", "json", "text"], default=e("SPOOLED_LOG_FORMAT", "auto"), help="log lines as JSON or text; auto = text on a terminal, JSON otherwise (SPOOLED_LOG_FORMAT)")
    p.add_argument("--log-level", default=e("SPOOLED_LOG_LEVEL", "INFO"), help="DEBUG, INFO, WARNING or ERROR (SPOOLED_LOG_LEVEL; default INFO)")
    return p


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def read_api_key(args, environ) -> Secret:
    if args.api_key is not None:
        raise ConfigError("--api-key is not accepted (it would show in ps and shell history): set SPOOLED_API_KEY or use --api-key-file")
    if args.api_key_file:
        try:
            key = Path(args.api_key_file).read_text().strip()
        except OSError as exc:
            raise ConfigError(f"cannot read --api-key-file {args.api_key_file}: {exc.strerror}") from None
    elif environ.get("SPOOLED_API_KEY"):
        key = environ["SPOOLED_API_KEY"].strip()
    elif environ.get("CREDENTIALS_DIRECTORY") and (Path(environ["CREDENTIALS_DIRECTORY"]) / CREDENTIAL_NAME).is_file():
        key = (Path(environ["CREDENTIALS_DIRECTORY"]) / CREDENTIAL_NAME).read_text().strip()
    else:
        raise ConfigError("no API key: set SPOOLED_API_KEY, or pass --api-key-file PATH")
    if len(key) < 10 or any(c.isspace() for c in key):
        raise ConfigError("the API key looks malformed (too short or contains whitespace): check SPOOLED_API_KEY / --api-key-file")
    return Secret(key)


def load_config(argv: list[str], environ=None) -> Config:
    environ = os.environ if environ is None else environ
    args = build_parser(environ).parse_args(argv)  # a bad flag exits 2 with argparse's one-line error
    return config_from_args(args, environ)


def config_from_args(args, environ) -> Config:
    if not args.queue:
        raise ConfigError("--queue is required (or set SPOOLED_QUEUE)")
    if not _QUEUE_RX.match(args.queue):
        raise ConfigError(f"--queue {args.queue!r} is not a valid queue name: 1-100 letters, digits, '.', '_' or '-', not starting with '.' or '-'")
    if not args.handler:
        raise ConfigError("--handler is required, as package.module:function (or set SPOOLED_HANDLER)")
    if ":" not in args.handler or args.handler.startswith(":") or args.handler.endswith(":"):
        raise ConfigError(f"--handler must look like package.module:function, got {args.handler!r}")
    procs = args.procs if args.procs is not None else (os.cpu_count() or 1)
    try:
        procs = int(procs)
    except ValueError:
        raise ConfigError(f"--procs must be a whole number, got {procs!r}") from None
    if not 1 <= procs <= 1000:
        raise ConfigError(f"--procs must be between 1 and 1000, got {procs}")
    lease = int(args.lease)
    if not 5 <= lease <= 3600:
        raise ConfigError(f"--lease must be between 5 and 3600 seconds, got {lease}")
    checks = [
        (float(args.drain_timeout) >= 0, "--drain-timeout must be 0 or more seconds"),
        (0.05 <= float(args.poll_interval) <= 300, "--poll-interval must be between 0.05 and 300 seconds"),
        (int(args.max_jobs_per_child) >= 0, "--max-jobs-per-child must be 0 (never) or more"),
        (int(args.max_memory_per_child) >= 0, "--max-memory-per-child must be 0 (no cap) or more MB"),
        (float(args.kill_grace) >= 0, "--kill-grace must be 0 or more seconds"),
        (1024 <= int(args.max_result_bytes), "--max-result-bytes must be at least 1024"),
        (0.5 <= float(args.api_timeout) <= 120, "--api-timeout must be between 0.5 and 120 seconds"),
        (args.log_level.upper() in ("DEBUG", "INFO", "WARNING", "ERROR"), "--log-level must be DEBUG, INFO, WARNING or ERROR"),
    ]
    for ok, message in checks:
        if not ok:
            raise ConfigError(message)
    if args.health_port is not None and not 0 <= int(args.health_port) <= 65535:
        raise ConfigError(f"--health-port must be between 0 and 65535, got {args.health_port}")
    url = urlsplit(args.api_url)
    if url.scheme not in ("http", "https") or not url.hostname:
        raise ConfigError(f"--api-url must be an http(s) URL with a host, got {args.api_url!r}")
    if url.scheme == "http" and not _is_loopback(url.hostname) and not args.allow_insecure_http:
        raise ConfigError(f"refusing plain http:// to {url.hostname}: the API key would cross the network unencrypted; use https:// or pass --allow-insecure-http")
    if args.ca_bundle and not Path(args.ca_bundle).is_file():
        raise ConfigError(f"--ca-bundle {args.ca_bundle} is not a readable file")
    hostname = socket.gethostname()
    worker_id = args.worker_id if args.worker_id else clean_worker_id(hostname)
    if not 1 <= len(worker_id) <= 128 or _WORKER_ID_RX.search(worker_id):
        raise ConfigError(f"--worker-id must be 1-128 characters of A-Z a-z 0-9 . _ -, got {worker_id!r}")
    key = read_api_key(args, environ)
    host_clean = re.sub(r"[^A-Za-z0-9._-]", "-", hostname).strip(".-") or "localhost"
    return Config(
        api_url=args.api_url.rstrip("/"), api_key=key, queue=args.queue, handler=args.handler, worker_id=worker_id,
        hostname=host_clean[:255], procs=procs, lease=lease, drain_timeout=float(args.drain_timeout),
        poll_interval=float(args.poll_interval), max_jobs_per_child=int(args.max_jobs_per_child),
        max_memory_per_child_mb=int(args.max_memory_per_child), kill_grace=float(args.kill_grace),
        max_result_bytes=int(args.max_result_bytes), api_timeout=float(args.api_timeout), ca_bundle=args.ca_bundle,
        allow_insecure_http=bool(args.allow_insecure_http), health_host=args.health_host,
        health_port=None if args.health_port is None else int(args.health_port),
        log_format=args.log_format, log_level=args.log_level.upper(),
    )
