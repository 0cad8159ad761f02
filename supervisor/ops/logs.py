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


def secret_forms(secret: str) -> tuple[str, ...]:
    """The secret as it can appear in a line: itself, JSON-escaped and repr-escaped (inside a dict or a list).

    Longest first, so an escaped form is replaced before the plain one inside it could be."""
    if not secret:
        return ()
    forms = {secret, orjson.dumps(secret).decode()[1:-1], repr(secret)[1:-1], repr(secret.encode())[2:-1]}
    return tuple(sorted(forms, key=len, reverse=True))


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


def setup_logging(fmt: str = "auto", level: str = "INFO", secret: str = "", stream=None) -> None:
    """One handler on the root logger: JSON or text lines to `stream` (stderr), the secret scrubbed from each."""
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
