"""The daemon's configuration: flags, environment and an optional TOML file turned into one validated `Config`.

`load_config(argv, environ)` either returns a Config or raises ConfigError with one line
saying what to fix. It does no network I/O and registers nothing.

Every option is one `Option` row: its flag, its environment variable, a parser that turns the text into
a value (or raises ValueError saying what is allowed) and its default. A flag's value is parsed exactly like
its variable's, and the error names whichever the value came from. A TOML file (`--config PATH` or
SPOOLED_CONFIG) may hold the same settings, keyed by the flag without its dashes (`procs = 8`); precedence is
flag, variable, file, default.
"""

from __future__ import annotations

import argparse
import importlib
import math
import os
import re
import shlex
import socket
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from difflib import get_close_matches
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import urlsplit

from supervisor import cli
from supervisor.client.calls import Secret
from supervisor.client.hosts import is_loopback
from supervisor.cpus import granted_cpus
from supervisor.ops.deletion_cost import NotInPod, PodRef, in_cluster

DEFAULT_API_URL = "https://api.spooled.cloud"
DEFAULT_GRPC_URL = "grpc.spooled.cloud:443"
CREDENTIAL_NAME = "spooled-api-key"
CONFIG_ENV = "SPOOLED_CONFIG"
GRPC_EXTRA_HINT = "pip install 'spooled-supervisor[grpc]'"
PATH_MAX = 4096  # the longest path Linux accepts; error lines show paths up to this whole
_WORKER_ID_RX = re.compile(r"[^A-Za-z0-9._-]")
_QUEUE_RX = re.compile(r"^[^\W.-][\w.-]{0,99}$")
MAX_WAIT = 86400  # seconds: the longest drain, readiness silence; far below what a wait on the loop accepts
MAX_GRACE = 3600  # seconds between SIGTERM and SIGKILL
MAX_COUNT = 1_000_000_000
MAX_MIB = 16 * 1024 * 1024  # 16 TiB
MAX_RESULT = 1 << 30
MAX_RPS = 1_000_000
MAX_KEY_FILE_BYTES = 65536  # a key file longer than this is not a key
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


class ConfigError(Exception):
    """A configuration problem; str() is the one line shown to the operator."""


@dataclass(frozen=True)
class Config:
    api_url: str
    api_key: Secret = field(repr=False)
    queues: tuple[str, ...]  # in priority order; () until taken from the handler's SDK worker
    handler: str
    worker_id: str
    hostname: str
    procs: int
    lease: int = 30
    drain_timeout: float = 25.0
    poll_interval: float = 5.0
    wake: str = "events"  # "events": listen to the API's events stream while idle; "poll": poll only
    max_jobs_per_child: int = 0
    max_memory_per_child_mb: int = 0
    preload: bool = False  # import the handler's module in the forkserver, shared by every child
    memory_high: tuple[float, bool] = (85.0, True)  # (value, is a percent of the limit): pause claims above
    memory_max: tuple[float, bool] = (95.0, True)  # above: shed the newest running job
    kill_grace: float = 3.0
    max_result_bytes: int = 1_900_000
    api_timeout: float = 10.0
    ca_bundle: str | None = None
    allow_insecure_http: bool = False
    health_host: str = "127.0.0.1"
    health_port: int | None = None
    ready_api_silence: float = 60.0  # /readyz fails after this long without an API answer
    k8s_pod: PodRef | None = None  # --k8s-deletion-cost: the pod whose annotation to keep current
    log_format: str = "auto"
    log_level: str = "INFO"
    api_url_source: str = "default"  # where --api-url came from: a flag, variable or file key, else "default"
    child_logging: str = "daemon"  # daemon: children log as the daemon does; module: as the handler's module sets up
    prefetch: int | None = None  # jobs claimed ahead; None = auto
    max_rps: float | None = None  # API requests per second cap; None = off
    transport: str = "rest"  # "rest" or "grpc"
    grpc_url: str = DEFAULT_GRPC_URL
    grpc_client: str = "wire"  # "wire" (the loop's own HTTP/2 connection) or "grpcio" (its channel and futures)
    until_empty: bool = False  # drain and exit once the queues are empty
    procs_source: str = ""  # where `procs` came from, for the start-up log
    queue_source: str = ""  # where the queue came from when --queue was not given (the handler's SDK worker)
    share_api_key: bool = False  # children get SPOOLED_API_KEY and SPOOLED_API_URL
    child_init: str | None = None  # module:function each child calls once, after the handler's import
    child_exit_grace: float = 2.0  # seconds a leaving child has for its `stopped` hooks, atexit and logging
    watch: bool = False  # reload the children when the handler's code changes (supervisor.commands.watch)
    watch_paths: tuple[str, ...] = ()  # more paths to watch

    @property
    def first_queue(self) -> str:
        """The highest-priority queue (registration names one; the others travel beside it); "" until known."""
        return self.queues[0] if self.queues else ""


def clean_worker_id(raw: str) -> str:
    """Hostname (or any text) -> a valid worker id: [A-Za-z0-9._-], 1-128 characters."""
    cleaned = _WORKER_ID_RX.sub("-", raw.strip())[:128].strip("-") or "worker"
    return cleaned


# Parsers: text -> value, or ValueError whose text says what is allowed.

def parse_bool(text: str) -> bool:
    """1/true/yes/on and 0/false/no/off, in any case."""
    low = text.strip().lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise ValueError("must be 1/true/yes/on or 0/false/no/off (any case)")


def whole(low: int, high: int | None = None) -> Callable[[str], int]:
    allowed = f"must be between {low} and {high} (a whole number)" if high is not None else \
        f"must be a whole number, {low} or more"

    def parse(text: str) -> int:
        try:
            value = int(text.strip(), 10)
        except ValueError:
            raise ValueError(allowed) from None
        if value < low or (high is not None and value > high):
            raise ValueError(allowed)
        return value
    return parse


def number(low: float, high: float | None = None, above: bool = False) -> Callable[[str], float]:
    if above:
        allowed = f"must be a number above {low:g}" + (f" and at most {high:g}" if high is not None else "")
    else:
        allowed = f"must be between {low:g} and {high:g}" if high is not None else \
            f"must be a number, {low:g} or more"

    def parse(text: str) -> float:
        try:
            value = float(text.strip())
        except ValueError:
            raise ValueError(allowed) from None
        if not math.isfinite(value) or value < low or (above and value == low) or (high is not None and value > high):
            raise ValueError(allowed)
        return value
    return parse


def choice(*names: str, upper: bool = False) -> Callable[[str], str]:
    def parse(text: str) -> str:
        value = text.strip().upper() if upper else text.strip().lower()
        if value not in names:
            raise ValueError("must be " + ", ".join(names[:-1]) + " or " + names[-1])
        return value
    return parse


def parse_queues(text: str) -> tuple[str, ...]:
    """`a,b,c`: queues in priority order, each a valid name, no duplicates."""
    names = tuple(part.strip() for part in text.split(","))
    for name in names:
        if not _QUEUE_RX.match(name):
            raise ValueError(f"must be queue names separated by commas, each 1-100 letters, digits, '.', '_' or "
                             f"'-', not starting with '.' or '-' ({name!r} is not a valid queue name)")
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"must name each queue once ({dupes[0]!r} is listed twice)")
    return names


def parse_handler(text: str) -> str:
    if ":" not in text or text.startswith(":") or text.endswith(":"):
        raise ValueError("must look like package.module:function")
    return text


def parse_memory_level(text: str) -> tuple[float, bool]:
    """`85%` (of the memory limit) or a number of MiB: (value, is a percent)."""
    raw = text.strip()
    try:
        if raw.endswith("%"):
            return number(1, 100)(raw[:-1]), True
        return float(whole(1, MAX_MIB)(raw)), False
    except ValueError:
        raise ValueError("must be a percent of the memory limit between 1% and 100%, or a whole number of MiB "
                         f"up to {MAX_MIB}") from None


def parse_prefetch(text: str) -> int | None:
    if text.strip().lower() == "auto":
        return None
    try:
        return whole(0, 1000)(text)
    except ValueError:
        raise ValueError("must be auto or between 0 and 1000 (a whole number)") from None


def parse_max_rps(text: str) -> float | None:
    if text.strip().lower() == "off":
        return None
    try:
        return number(0, MAX_RPS, above=True)(text)
    except ValueError:
        raise ValueError(f"must be off or a number of requests per second above 0 and at most {MAX_RPS}") from None


def parse_api_url(text: str) -> str:
    url = urlsplit(text)
    if url.scheme not in ("http", "https") or not url.hostname:
        raise ValueError("must be an http(s) URL with a host")
    return text.rstrip("/")


def parse_grpc_url(text: str) -> str:
    """HOST:PORT, as gRPC channels take it (IPv6 in brackets)."""
    try:
        parts = urlsplit("//" + text.strip())
        port = parts.port
    except ValueError:
        port = None
    if not text.strip() or not parts.hostname or port is None or not 1 <= port <= 65535 or parts.path or "@" in text:
        raise ValueError("must be HOST:PORT, e.g. " + DEFAULT_GRPC_URL)
    return text.strip()


def parse_worker_id(text: str) -> str:
    if not 1 <= len(text) <= 128 or _WORKER_ID_RX.search(text):
        raise ValueError("must be 1-128 characters of A-Z a-z 0-9 . _ -")
    return text


def parse_paths(text: str) -> tuple[str, ...]:
    paths = tuple(p.strip() for p in text.split(",") if p.strip())
    for p in paths:
        if not os.path.exists(p):
            raise ValueError(f"names {p!r}, which does not exist")
    return paths


def parse_text(text: str) -> str:
    if not text.strip():
        raise ValueError("must not be empty")
    return text.strip()


@dataclass(frozen=True)
class Option:
    """One setting: `--flag` / ENV, parsed by `parse`; `default` is used (unparsed) when neither is set."""

    flag: str
    env: str
    parse: Callable[[str], Any]
    default: Any
    help: str
    metavar: str | None = None
    switch: bool = False  # a flag without a value (sets True); the variable takes a boolean

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")


OPTIONS: tuple[Option, ...] = (
    Option("--queue", "SPOOLED_QUEUE", parse_queues, None, "queue(s) to claim jobs from; several as a,b,c are "
           "served in that priority order; default: the queue_name of the handler's SDK worker", "Q[,Q...]"),
    Option("--handler", "SPOOLED_HANDLER", parse_handler, None, "the job handler, package.module:function (or an "
           "SDK SpooledWorker, whose queue stands in for --queue); it receives a context with job_id, payload, ...",
           "MOD:FN"),
    Option("--procs", "SPOOLED_PROCS", whole(1, 1000), None, "number of child processes, 1-1000; default: the "
           "CPUs really granted (affinity mask capped by the cgroup CPU quota)", "N"),
    Option("--api-url", "SPOOLED_API_URL", parse_api_url, DEFAULT_API_URL, f"Spooled API base URL; default "
           f"{DEFAULT_API_URL}", "URL"),
    Option("--api-key-file", "SPOOLED_API_KEY_FILE", parse_text, None, "file holding the API key; otherwise "
           f"SPOOLED_API_KEY or $CREDENTIALS_DIRECTORY/{CREDENTIAL_NAME}", "PATH"),
    Option("--share-api-key", "SPOOLED_SHARE_API_KEY", parse_bool, False, "give children SPOOLED_API_KEY and "
           "SPOOLED_API_URL, for a handler module that builds its own SDK client; the variable takes "
           "1/true/yes/on or 0/false/no/off", switch=True),
    Option("--worker-id", "SPOOLED_WORKER_ID", parse_worker_id, None, "stable worker id, reused across restarts; "
           "default: the hostname, e.g. the pod name", "ID"),
    Option("--lease", "SPOOLED_LEASE", whole(5, 3600), 30, "job lease in seconds, 5-3600, renewed every third of "
           "it; default 30", "S"),
    Option("--drain-timeout", "SPOOLED_DRAIN_TIMEOUT", number(0, MAX_WAIT), 25.0, "seconds to let in-flight jobs "
           f"finish after SIGTERM, 0-{MAX_WAIT}; default 25", "S"),
    Option("--poll-interval", "SPOOLED_POLL_INTERVAL", number(0.05, 300), 5.0, "longest wait between claims on "
           "an empty queue, 0.05-300; back-off starts at 50 ms; default 5", "S"),
    Option("--wake", "SPOOLED_WAKE", choice("events", "poll"), "events", "how an idle daemon learns of new "
           "jobs: events = the API's events stream, polling an empty queue only every 15 s (falls back to poll "
           "where the server has no stream); poll = claim on the --poll-interval back-off; default events", "HOW"),
    Option("--max-jobs-per-child", "SPOOLED_MAX_JOBS_PER_CHILD", whole(0, MAX_COUNT), 0, "replace a child after "
           f"about this many jobs, with up to 10%% jitter, 0-{MAX_COUNT}; 0 = never", "N"),
    Option("--max-memory-per-child", "SPOOLED_MAX_MEMORY_PER_CHILD", whole(0, MAX_MIB), 0, "cap in MiB on a child's "
           "process tree (the child and every process it started; PSS, else RSS): over it for 3 samples during a "
           "job, the job fails and the tree is stopped; over it after a job, the child is replaced; 0 = no cap", "MB"),
    Option("--preload", "SPOOLED_PRELOAD", parse_bool, False, "import the handler's module once, before any child "
           "is forked, so children share its memory; the variable takes 1/true/yes/on or 0/false/no/off",
           switch=True),
    Option("--memory-high", "SPOOLED_MEMORY_HIGH", parse_memory_level, (85.0, True), "above this much memory in "
           "use (N%% of the cgroup's or host's limit, or N MiB), stop claiming and hand reserved jobs back; "
           "default 85%%", "N%|MB"),
    Option("--memory-max", "SPOOLED_MEMORY_MAX", parse_memory_level, (95.0, True), "above this, also stop the "
           "newest running job (it fails with MemoryPressure and retries elsewhere); default 95%%", "N%|MB"),
    Option("--child-init", "SPOOLED_CHILD_INIT", parse_handler, None, "module:function each child calls once, "
           "after the handler's import and before its first job (after every fork under --preload): open pools, "
           "reseed, init Sentry or tracing", "MOD:FN"),
    Option("--child-exit-grace", "SPOOLED_CHILD_EXIT_GRACE", number(0, 300), 2.0, "seconds a child leaving gracefully "
           "(recycle, reload, drain, scale-down) has to run its stopped hooks, atexit handlers and logging "
           "flush, 0-300; default 2", "S"),
    Option("--kill-grace", "SPOOLED_KILL_GRACE", number(0, MAX_GRACE), 3.0, "seconds between SIGTERM and SIGKILL "
           f"when stopping a child, 0-{MAX_GRACE}; default 3", "S"),
    Option("--max-result-bytes", "SPOOLED_MAX_RESULT_BYTES", whole(1024, MAX_RESULT), 1_900_000, "largest JSON "
           f"result sent to the API; larger fails the job; 1024-{MAX_RESULT}", "N"),
    Option("--api-timeout", "SPOOLED_API_TIMEOUT", number(0.5, 120), 10.0, "seconds to wait for one API "
           "answer, 0.5-120; default 10", "S"),
    Option("--ca-bundle", "SPOOLED_CA_BUNDLE", parse_text, None, "CA bundle for a private CA; TLS verification "
           "is always on", "PATH"),
    Option("--allow-insecure-http", "SPOOLED_ALLOW_INSECURE_HTTP", parse_bool, False, "allow plain http:// to "
           "a host other than loopback; the variable takes 1/true/yes/on or 0/false/no/off", switch=True),
    Option("--health-port", "SPOOLED_HEALTH_PORT", whole(0, 65535), None, "serve /healthz, /readyz, /metrics "
           "and /status on this port, 0-65535; off by default", "PORT"),
    Option("--health-host", "SPOOLED_HEALTH_HOST", parse_text, "127.0.0.1", "address for the health port; "
           "default 127.0.0.1, use 0.0.0.0 in a pod", "ADDR"),
    Option("--ready-api-silence", "SPOOLED_READY_API_SILENCE", number(0, MAX_WAIT, above=True), 60.0, "/readyz fails "
           f"once the API has not answered for this many seconds, up to {MAX_WAIT} (/healthz never looks at the "
           "API); default 60", "S"),
    Option("--k8s-deletion-cost", "SPOOLED_K8S_DELETION_COST", parse_bool, False, "keep this pod's "
           "pod-deletion-cost annotation current so scale-downs remove idle pods first (needs the deletion-cost "
           "RBAC component); the variable takes 1/true/yes/on or 0/false/no/off", switch=True),
    Option("--log-format", "SPOOLED_LOG_FORMAT", choice("auto", "json", "text"), "auto", "log lines as JSON or "
           "text; auto = text on a terminal, JSON otherwise", "auto|json|text"),
    Option("--log-level", "SPOOLED_LOG_LEVEL", choice("DEBUG", "INFO", "WARNING", "ERROR", upper=True), "INFO",
           "DEBUG, INFO, WARNING or ERROR, any case; default INFO", "LEVEL"),
    Option("--child-logging", "SPOOLED_CHILD_LOGGING", choice("daemon", "module"), "daemon", "daemon: the "
           "children's lines (ctx.log, logging) take the daemon's format and level; module: left wholly to the "
           "handler's module", "daemon|module"),
    Option("--prefetch", "SPOOLED_PREFETCH", parse_prefetch, None, "jobs claimed ahead of free children: auto, or "
           "0-1000; default auto", "auto|N"),
    Option("--max-rps", "SPOOLED_MAX_RPS", parse_max_rps, None, "cap on API requests per second, a number above "
           "0; default off", "R"),
    Option("--transport", "SPOOLED_TRANSPORT", choice("rest", "grpc"), "rest", "claim and complete over REST or "
           f"gRPC; grpc needs {GRPC_EXTRA_HINT}; default rest", "rest|grpc"),
    Option("--grpc-url", "SPOOLED_GRPC_URL", parse_grpc_url, DEFAULT_GRPC_URL, "gRPC endpoint HOST:PORT for "
           f"--transport grpc; default {DEFAULT_GRPC_URL}", "HOST:PORT"),
    Option("--grpc-client", "SPOOLED_GRPC_CLIENT", choice("wire", "grpcio"), "wire", "how --transport grpc sends "
           "its calls: wire (HTTP/2 frames written by the parent's loop itself, the cheaper) or grpcio (grpcio's "
           "channel); default wire", "wire|grpcio"),
    Option("--watch", "SPOOLED_WATCH", parse_bool, False, "replace the children (as SIGHUP does) when a Python "
           "file under the handler's package changes and the handler still imports; the variable takes "
           "1/true/yes/on or 0/false/no/off", switch=True),
    Option("--watch-path", "SPOOLED_WATCH_PATH", parse_paths, (), "with --watch, also watch these folders or "
           "files, comma-separated", "PATH[,PATH...]"),
    Option("--until-empty", "SPOOLED_UNTIL_EMPTY", parse_bool, False, "drain and exit once the queues are "
           "empty; the variable takes 1/true/yes/on or 0/false/no/off", switch=True),
)
OPTION_BY_DEST = {opt.dest: opt for opt in OPTIONS}


class OneLineParser(argparse.ArgumentParser):
    """argparse whose errors (unknown flag, missing value) raise one-line ConfigErrors instead of printing usage."""

    def error(self, message: str) -> NoReturn:
        raise ConfigError(f"{message} (see {cli.program()} run --help)")


def build_parser(environ: Mapping[str, str] | None = None) -> argparse.ArgumentParser:
    """The `run` argument parser. Values stay text here (None when not given); `resolve` parses them."""
    p = OneLineParser(
        prog=f"{cli.program()} [run]",
        allow_abbrev=False,  # a flag is taken as spelled in full only
        description="Run CPU-bound jobs from a Spooled queue on N child processes. Every option also reads "
        "the environment variable shown and the --config file's key of the same name (procs = 8); a flag beats "
        "its variable, which beats the file. The API key comes from SPOOLED_API_KEY, "
        f"--api-key-file, or the systemd credential '{CREDENTIAL_NAME}' - never from a flag value, so it never "
        "shows in ps.",
    )
    for opt in OPTIONS:
        if opt.switch:
            p.add_argument(opt.flag, action="store_const", const="1", default=None, help=f"{opt.help} ({opt.env})")
        else:
            p.add_argument(opt.flag, default=None, metavar=opt.metavar, help=f"{opt.help} ({opt.env})")
    p.add_argument("--config", default=None, metavar="PATH", help="TOML file of settings keyed like the flags "
                   "without the dashes (procs = 8, max-memory-per-child = 512); flags and variables beat it "
                   f"({CONFIG_ENV})")
    p.add_argument("--api-key", help=argparse.SUPPRESS)
    cli.add_version(p)
    return p


def resolve(opt: Option, args: argparse.Namespace, environ: Mapping[str, str],
            from_file: Mapping[str, tuple[str, str]] | None = None) -> tuple[Any, str]:
    """(value, source): the flag's value if given, else the variable's (empty = unset), else the config file's,
    else the default. `from_file` maps a dest to (text, source) as `read_config_file` returns it.

    A bad value raises ConfigError naming the flag, the variable or the file's key, whichever it came from.
    """
    raw = getattr(args, opt.dest)
    source = opt.flag
    if raw is None:
        raw, source = environ.get(opt.env) or None, opt.env
    if raw is None and from_file and opt.dest in from_file:
        raw, source = from_file[opt.dest]
    if raw is None:
        return opt.default, "default"
    if "\x00" in raw:
        raise ConfigError(f"{source} must not contain a NUL byte, got {_shown(raw)}")
    try:
        return opt.parse(raw), source
    except ValueError as exc:
        raise ConfigError(f"{source} {exc}, got {_shown(raw)}") from None


def config_file_path(args: argparse.Namespace, environ: Mapping[str, str]) -> tuple[str, str] | None:
    """(path, source) of the config file: --config, else SPOOLED_CONFIG (empty = unset), else None."""
    if args.config is not None:
        return args.config, "--config"
    if environ.get(CONFIG_ENV):
        return environ[CONFIG_ENV], CONFIG_ENV
    return None


def read_config_file(path: str, source: str = "--config") -> dict[str, tuple[str, str]]:
    """The file's settings as {dest: (text, source)}: each value turned into the text its flag would take, so the
    flag's own parser checks it; the source reads `KEY in PATH`. A file that cannot be read or is not TOML, and
    a key that is not a flag's name, raise ConfigError naming the file (and the key)."""
    shown = _shown(path, PATH_MAX)
    try:
        with open(path, "rb") as f:
            table = tomllib.load(f)
    except OSError as exc:
        raise ConfigError(f"cannot read {source} {shown}: {exc.strerror}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{source} {shown} is not valid TOML: {_one_line(str(exc))}") from None
    except ValueError:  # tomllib's int() of thousands of digits
        raise ConfigError(f"{source} {shown} holds a number too long to read (thousands of digits): no setting "
                          "takes one") from None
    by_key = {opt.flag[2:]: opt for opt in OPTIONS}
    settings: dict[str, tuple[str, str]] = {}
    for key, value in table.items():
        if key in by_key:
            settings[by_key[key].dest] = (_file_text(value, f"{key} in {shown}"), f"{key} in {shown}")
            continue
        if key == "api-key":
            raise ConfigError(f"api-key is not accepted in {shown}: set SPOOLED_API_KEY or name a file of its own "
                              "with api-key-file")
        near = get_close_matches(key.replace("_", "-"), list(by_key), n=1)
        hint = f"did you mean {near[0]}?" if near else "keys are the run flags without the dashes, e.g. procs"
        raise ConfigError(f"unknown key {_shown(key)} in {shown} ({hint})")
    return settings


def _file_text(value: Any, source: str) -> str:
    """A TOML value as the text a flag would carry: true/false, numbers as written, a list of names as a,b."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int) and abs(value) >= 10**18:
        raise ConfigError(f"{source} must be a number of at most 18 digits, got one of {len(str(abs(value)))} digits")
    if isinstance(value, (int, float, str)):
        return str(value)
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return ",".join(value)
    raise ConfigError(f"{source} must be a string, a number, true/false or a list of names, got {type(value).__name__}")


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _shown(raw: str, limit: int = 80) -> str:
    """A value as it may be typed back into a shell, on one line whatever it holds: cut to `limit`
    characters, and written as a bash $'...' string (control characters escaped) if it is not printable.
    Paths get a limit of PATH_MAX: an operator needs all of one to find what is wrong with it."""
    text = raw if len(raw) <= limit else raw[:limit - 3] + "..."
    if text.isprintable():
        return shlex.quote(text)
    return "$'" + "".join(map(_bash_byte, text.encode("utf-8", "surrogateescape"))) + "'"  # undecodable bytes too


def _bash_byte(b: int) -> str:
    """One byte inside a bash $'...' string: printable ASCII as itself, ' and \\ escaped, the rest \\xHH."""
    if chr(b) in "'\\":
        return "\\" + chr(b)
    return chr(b) if 0x20 <= b < 0x7F else f"\\x{b:02x}"


def read_api_key(args: argparse.Namespace, environ: Mapping[str, str], file_source: str = "--api-key-file") -> Secret:
    """The key from --api-key-file / SPOOLED_API_KEY_FILE, else SPOOLED_API_KEY, else the systemd credential.
    Whatever the source, a key that is not printable ASCII (a file in UTF-16 or not UTF-8, a character no
    HTTP header can carry) raises a ConfigError naming the source, never showing the key."""
    if args.api_key is not None:
        raise ConfigError("--api-key is not accepted (it would show in ps and shell history): "
                          "set SPOOLED_API_KEY or use --api-key-file")
    credential = Path(environ["CREDENTIALS_DIRECTORY"]) / CREDENTIAL_NAME if environ.get("CREDENTIALS_DIRECTORY") \
        else None
    if args.api_key_file:
        source = f"{file_source} {_shown(args.api_key_file, PATH_MAX)}"
        key = _key_text(_read_key_file(args.api_key_file, source), source)
    elif environ.get("SPOOLED_API_KEY"):
        source = "SPOOLED_API_KEY"
        raw = environ["SPOOLED_API_KEY"]
        try:
            raw.encode("utf-8")
        except UnicodeEncodeError:  # bytes the environment held that are not UTF-8 (os.environ's surrogates)
            raise ConfigError("SPOOLED_API_KEY is not UTF-8 text: set it to the key as the dashboard shows it") \
                from None
        key = _key_text(raw, source)
    elif credential is not None and _is_file(credential):
        source = f"the systemd credential {CREDENTIAL_NAME}"
        key = _key_text(_read_key_file(str(credential), source), source)
    else:
        raise ConfigError("no API key: set SPOOLED_API_KEY, or pass --api-key-file PATH")
    if len(key) < 10 or any(c.isspace() for c in key):
        raise ConfigError(f"the API key from {source} looks malformed (too short or contains whitespace)")
    return Secret(key)


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except (OSError, ValueError):
        return False


def _read_key_file(path: str, source: str) -> str:
    """A key file's text: at most MAX_KEY_FILE_BYTES of strict UTF-8 (a UTF-8 byte-order mark is dropped)."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_KEY_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"cannot read {source}: {exc.strerror}") from None
    except ValueError:
        raise ConfigError(f"cannot read {source}: the path holds a NUL byte") from None
    if len(data) > MAX_KEY_FILE_BYTES:
        raise ConfigError(f"{source} is longer than {MAX_KEY_FILE_BYTES} bytes: it does not hold an API key")
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise ConfigError(f"{source} is UTF-16 text (it starts with a byte-order mark): write the key as plain "
                          "ASCII, e.g. printf %s \"$KEY\" > FILE")
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    if b"\x00" in data:
        raise ConfigError(f"{source} holds NUL bytes (UTF-16 text without a byte-order mark?): write the key as "
                          "plain ASCII")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{source} is not UTF-8 text: byte {data[exc.start]:#04x} at offset {exc.start}; "
                          "write the key as plain ASCII") from None


def _key_text(text: str, source: str) -> str:
    """The key from `text` (surrounding whitespace dropped); every character printable ASCII, as an HTTP
    header and the API's keys require."""
    key = text.strip()
    for i, c in enumerate(key):
        if not "\x21" <= c <= "\x7e" and not c.isspace():
            what = "a NUL byte" if c == "\x00" else f"a character that is not printable ASCII (U+{ord(c):04X})"
            raise ConfigError(f"the API key from {source} holds {what} at position {i}: API keys are printable "
                              "ASCII")
    return key


def load_config(argv: list[str], environ: Mapping[str, str] | None = None) -> Config:
    environ = os.environ if environ is None else environ
    args = build_parser(environ).parse_args(argv)  # a bad flag raises a one-line ConfigError
    return config_from_args(args, environ)


def _require_grpc() -> None:
    try:
        importlib.import_module("grpc")
    except ImportError:
        raise ConfigError(f"--transport grpc needs the gRPC extra: {GRPC_EXTRA_HINT}") from None


def _both_endpoints_or_neither(sources: Mapping[str, str]) -> None:
    """--transport grpc talks to two endpoints: the gRPC API, and the REST API for what gRPC does not carry
    (the worker-row check at start, queue statistics, results too large for a gRPC message). The operator
    names both or neither (then both are Spooled Cloud's): the key never goes to a default host beside a
    named one."""
    rest, grpc = sources["api_url"] != "default", sources["grpc_url"] != "default"
    if grpc and not rest:
        raise ConfigError(f"--transport grpc with {sources['grpc_url']} needs the same server's REST URL too: pass "
                          "--api-url (or SPOOLED_API_URL); without it the key would go to Spooled Cloud's REST API")
    if rest and not grpc:
        raise ConfigError(f"--transport grpc with {sources['api_url']} needs the same server's gRPC address too: "
                          "pass --grpc-url HOST:PORT (or SPOOLED_GRPC_URL); without it the key would go to Spooled "
                          "Cloud's gRPC API")


def config_from_args(args: argparse.Namespace, environ: Mapping[str, str]) -> Config:
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    path = config_file_path(args, environ)
    from_file = read_config_file(*path) if path else {}
    for opt in OPTIONS:
        values[opt.dest], sources[opt.dest] = resolve(opt, args, environ, from_file)
    if values["handler"] is None:
        raise ConfigError("--handler is required, as package.module:function (or set SPOOLED_HANDLER)")
    url = urlsplit(values["api_url"])
    if url.scheme == "http" and not is_loopback(url.hostname or "") and not values["allow_insecure_http"]:
        raise ConfigError(f"refusing plain http:// to {url.hostname}: the API key would cross the network "
                          "unencrypted; use https:// or pass --allow-insecure-http (SPOOLED_ALLOW_INSECURE_HTTP=1)")
    if values["ca_bundle"] and not Path(values["ca_bundle"]).is_file():
        raise ConfigError(f"{sources['ca_bundle']} {_shown(values['ca_bundle'], PATH_MAX)} is not a readable file")
    if values["transport"] == "grpc":
        _require_grpc()
        _both_endpoints_or_neither(sources)
    high, top = values["memory_high"], values["memory_max"]
    if high[1] == top[1] and high[0] >= top[0]:
        names = [sources[d] if sources[d] != "default" else OPTION_BY_DEST[d].flag
                 for d in ("memory_high", "memory_max")]
        shown = [f"{v:g}%" if pct else f"{v:g} MiB" for v, pct in (high, top)]
        raise ConfigError(f"{names[0]} must be below {names[1]}, got {shown[0]} and {shown[1]}")
    k8s_pod = None
    if values["k8s_deletion_cost"]:
        try:
            k8s_pod = in_cluster(environ)
        except NotInPod as exc:
            raise ConfigError(str(exc)) from None
    procs, procs_source = values["procs"], f"procs={values['procs']} from {sources['procs']}"
    if procs is None:
        procs, procs_source = granted_cpus()
        procs = min(procs, 1000)
    hostname = socket.gethostname()
    worker_id = values["worker_id"] or clean_worker_id(hostname)
    key_args = argparse.Namespace(api_key=args.api_key, api_key_file=values["api_key_file"])
    key = read_api_key(key_args, environ, sources["api_key_file"])
    host_clean = re.sub(r"[^A-Za-z0-9._-]", "-", hostname).strip(".-") or "localhost"
    queues = values["queue"] or ()  # none: the handler's SDK worker must name it (see commands/run.py)
    return Config(
        api_url=values["api_url"], api_url_source=sources["api_url"], api_key=key, queues=tuple(queues),
        handler=values["handler"],
        worker_id=worker_id,
        hostname=host_clean[:255], procs=procs, lease=values["lease"], drain_timeout=float(values["drain_timeout"]),
        poll_interval=float(values["poll_interval"]), max_jobs_per_child=values["max_jobs_per_child"],
        max_memory_per_child_mb=values["max_memory_per_child"], kill_grace=float(values["kill_grace"]),
        max_result_bytes=values["max_result_bytes"], api_timeout=float(values["api_timeout"]),
        ca_bundle=values["ca_bundle"], allow_insecure_http=values["allow_insecure_http"],
        health_host=values["health_host"], health_port=values["health_port"],
        ready_api_silence=float(values["ready_api_silence"]), k8s_pod=k8s_pod, log_format=values["log_format"],
        log_level=values["log_level"], child_logging=values["child_logging"], prefetch=values["prefetch"],
        max_rps=values["max_rps"],
        transport=values["transport"], grpc_url=values["grpc_url"], grpc_client=values["grpc_client"],
        until_empty=values["until_empty"],
        procs_source=procs_source, share_api_key=values["share_api_key"], wake=values["wake"],
        preload=values["preload"], memory_high=high, memory_max=top, child_init=values["child_init"],
        child_exit_grace=float(values["child_exit_grace"]), watch=values["watch"],
        watch_paths=tuple(values["watch_path"]),
    )
