"""Logging in the processes that import the handler (children, the import probe, a preloading forkserver).

The daemon puts its resolved log format and level, and the --child-logging choice, in CHILD_LOGGING_ENV
before it starts any of them. `install()` runs before the handler's module is imported and, unless the
choice is `module`, gives the root logger the daemon's handler: the same format and level, the shared API
key scrubbed, and `job_id` and `queue` on every line written while a job runs. `settle()` runs once the
import is over and tells the two cases apart by the root logger's handlers:

- still exactly the daemon's handler: it stays (the module logs through the daemon);
- anything else (the module called `logging.basicConfig`, `dictConfig` or `fileConfig` with a root
  section, or added or removed a root handler): the module configured logging itself, so its handlers and
  levels stand and the daemon's handler is taken off the root (no line is written twice).

A `basicConfig()` call during the import counts as configuring logging: it is applied as if the root had no
handler (Python's basicConfig otherwise does nothing once one is there). With --child-logging module
nothing is installed: the children log exactly as the module alone would make them.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

CHILD_LOGGING_ENV = "SPOOLED_SUPERVISOR_LOGGING"  # "FORMAT LEVEL CHOICE", e.g. "json INFO daemon"
KEY_VARIABLE = "SPOOLED_API_KEY"

_job: dict[str, str] = {}  # job_id and queue of the job running now (empty between jobs)
_ours: logging.Handler | None = None  # the daemon's handler, while installed on the root
_settled = False
_basic_config = logging.basicConfig


class _JobFields(logging.Filter):
    """Puts the running job's `job_id` and `queue` on each record that does not carry them already."""

    def filter(self, record: logging.LogRecord) -> bool:
        if _job:
            fields = record.__dict__.get("fields")
            if isinstance(fields, dict):
                for key, value in _job.items():
                    fields.setdefault(key, value)
            else:
                for key, value in _job.items():
                    if not hasattr(record, key):
                        setattr(record, key, value)
        return True


def order(fmt: str, level: str, choice: str, stream: Any = None) -> str:
    """What the daemon puts in CHILD_LOGGING_ENV: `auto` resolved as the daemon resolved it (by its stderr)."""
    if fmt == "auto":
        fmt = "text" if (stream or sys.stderr).isatty() else "json"
    return f"{fmt} {level.upper()} {choice}"


def _read_order() -> tuple[str, str, str]:
    parts = os.environ.get(CHILD_LOGGING_ENV, "").split()
    if len(parts) != 3:
        return "auto", "INFO", "daemon"
    return parts[0], parts[1], parts[2]


def level() -> str:
    """The daemon's log level, as the children were given it."""
    return _read_order()[1]


def install() -> None:
    """Before the handler's module is imported: the daemon's handler on the root (unless the choice is
    `module`, or this process inherited it already from the forkserver that imported the module)."""
    global _ours
    fmt, level, choice = _read_order()
    if choice == "module" or _ours is not None or _settled:
        return
    from supervisor.ops.logs import setup_logging

    lean = logging._srcfile, logging.logThreads, logging.logProcesses, logging.logMultiprocessing
    setup_logging(fmt, level, secret=os.environ.get(KEY_VARIABLE, ""))
    # the daemon's lines need no caller or thread, but a module's own formatter may ask for them
    logging._srcfile, logging.logThreads, logging.logProcesses, logging.logMultiprocessing = lean
    _ours = logging.getLogger().handlers[0]
    _ours.addFilter(_JobFields())
    logging.basicConfig = _basic_config_during_import


def rekey() -> None:
    """Scrub the key this process holds now: a child of a preloading forkserver inherits the daemon's handler
    built where no key was, and gets the shared key (--share-api-key) only after."""
    from supervisor.ops.logs import set_secret

    set_secret(_ours, os.environ.get(KEY_VARIABLE, ""))


def _basic_config_during_import(**kwargs: Any) -> None:
    """`logging.basicConfig` while the handler's module is imported: the module's own configuration wins."""
    if _ours is not None and logging.getLogger().handlers == [_ours]:
        kwargs.setdefault("force", True)
    _basic_config(**kwargs)


def settle() -> None:
    """After the import: keep the daemon's handler if the root still has only it, else the module's own
    configuration (see the module docstring). The daemon's own loggers are re-enabled either way (a
    dictConfig disables the loggers that existed before it)."""
    global _ours, _settled
    if _settled:
        return
    _settled = True
    logging.basicConfig = _basic_config
    root = logging.getLogger()
    if _ours is not None and root.handlers != [_ours]:
        if _ours in root.handlers:
            root.removeHandler(_ours)
        _ours = None
    for name, logger in logging.Logger.manager.loggerDict.items():
        if (name == "supervisor" or name.startswith("supervisor.")) and isinstance(logger, logging.Logger):
            logger.disabled = False


def job_started(job_id: str, queue: str) -> None:
    """From now until `job_ended`, every line carries this job's `job_id` and `queue`."""
    _job["job_id"], _job["queue"] = job_id, queue


def job_ended() -> None:
    _job.clear()


def daemon_handler_installed() -> bool:
    """Whether the root logs through the daemon's handler (not the module's own configuration)."""
    return _ours is not None
