"""Log set-up: one line per event, JSON when not on a terminal, with the API key scrubbed from the final text.

Call `log_event(logger, level, "event text", job_id=..., queue=...)`; the keyword fields
become JSON keys (or `key=value` pairs in text mode).
"""

from __future__ import annotations

import json
import logging
import sys
import time

import orjson

from supervisor.client.calls import scrub_secret, secret_forms

__all__ = ["scrub", "secret_forms", "setup_logging", "log_event", "ScrubbingHandler"]

_RESERVED = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}


def _fields(record: logging.LogRecord) -> dict:
    """The event's fields: the dict `log_event` attached, else any `extra=` keys on the record."""
    fields = record.__dict__.get("fields")
    if isinstance(fields, dict):
        return fields
    return {k: v for k, v in record.__dict__.items() if k not in _RESERVED and not k.startswith("_")}


class JsonFormatter(logging.Formatter):
    _second = -1
    _stamp = ""

    def format(self, record: logging.LogRecord) -> str:
        second = int(record.created)
        if second != self._second:  # strftime once a second, not once a line
            self._second, self._stamp = second, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        out = {"ts": f"{self._stamp}.{int(record.msecs):03d}Z", "level": record.levelname.lower(),
               "logger": record.name, "msg": record.getMessage()}
        out.update(_fields(record))
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        try:
            return orjson.dumps(out, default=str, option=orjson.OPT_NON_STR_KEYS).decode()
        except TypeError:  # what orjson cannot hold (integers beyond 64 bits): the slower stdlib encoder
            return json.dumps(out, default=str, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%H:%M:%S", time.localtime(record.created)) + f".{int(record.msecs):03d}"
        extras = " ".join(f"{k}={v}" for k, v in _fields(record).items())
        line = f"{ts} {record.levelname:<7} {record.getMessage()}" + (f"  {extras}" if extras else "")
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        if record.stack_info:
            line += "\n" + self.formatStack(record.stack_info)
        return line


class ScrubbingHandler(logging.StreamHandler):
    """Writes each record as its formatter renders it, with every form of the secret replaced by ***.

    The scrub runs on the final text (message, every field whatever its type, tracebacks, stack info), so
    nothing a formatter adds can carry the key out. A record that cannot be formatted becomes one scrubbed
    line instead of logging's "--- Logging error ---" dump, which would print the raw message and arguments."""

    def __init__(self, stream, secret: str = ""):
        super().__init__(stream)
        self.forms = secret_forms(secret)

    def scrub(self, text: str) -> str:
        for form in self.forms:
            if form in text:
                text = text.replace(form, "***")
        return text

    def format(self, record: logging.LogRecord) -> str:
        try:
            line = super().format(record)
        except Exception as exc:  # a bad record must not dump its raw content
            line = f"log record from {record.name} could not be formatted: {type(exc).__name__}: {exc}"
        return self.scrub(line)

    def handleError(self, record: logging.LogRecord) -> None:
        try:
            self.stream.write(self.scrub(f"logging error writing a record from {record.name}") + self.terminator)
        except Exception:  # the stream itself is gone; nothing left to tell
            pass


_secret = ""  # the secret setup_logging was given, for `scrub`


def scrub(text: str) -> str:
    """`text` with every form of the logged secret replaced by ***: for a text about to be cut (a log line
    scrubs whole forms only, so a key cut in half would pass)."""
    return scrub_secret(text, _secret) if _secret else text


def set_secret(handler: logging.Handler | None, secret: str) -> None:
    """From now on scrub `secret` from `handler`'s lines (when it is ours) and from `scrub`'s texts."""
    global _secret
    _secret = secret
    if isinstance(handler, ScrubbingHandler):
        handler.forms = secret_forms(secret)


def setup_logging(fmt: str = "auto", level: str = "INFO", secret: str = "", stream=None) -> None:
    """One handler on the root logger: JSON or text lines to `stream` (stderr), the secret scrubbed from each."""
    global _secret
    _secret = secret
    stream = stream or sys.stderr
    if fmt == "auto":
        fmt = "text" if stream.isatty() else "json"
    handler = ScrubbingHandler(stream, secret)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    # No line carries the caller's file and line, the thread or the process: skip collecting them (the
    # logging HOWTO's "Optimization"); it is most of the cost of a record in the parent's per-job budget.
    logging._srcfile = None
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)


def log_event(logger: logging.Logger, level: int, event: str, **fields) -> None:
    """Log one event line; `fields` become JSON keys (or key=value pairs in text mode)."""
    if logger.isEnabledFor(level):
        logger.log(level, event, extra={"fields": fields})
