"""Log set-up: one line per event, JSON when not on a terminal, with the API key scrubbed.

Call `log_event(logger, level, "event text", job_id=..., queue=...)`; the keyword fields
become JSON keys (or `key=value` pairs in text mode).
"""

from __future__ import annotations

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
        return orjson.dumps(out, default=str).decode()


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%H:%M:%S", time.localtime(record.created)) + f".{int(record.msecs):03d}"
        extras = " ".join(f"{k}={v}" for k, v in _fields(record).items())
        line = f"{ts} {record.levelname:<7} {record.getMessage()}" + (f"  {extras}" if extras else "")
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class Redactor(logging.Filter):
    """Replaces every occurrence of the secret in a record's message and fields with ***."""

    def __init__(self, secret: str):
        super().__init__()
        self.secret = secret

    def filter(self, record: logging.LogRecord) -> bool:
        if not self.secret:
            return True
        msg = record.getMessage()
        if self.secret in msg:
            record.msg, record.args = msg.replace(self.secret, "***"), ()
        fields = record.__dict__.get("fields")
        if isinstance(fields, dict):
            for key, value in fields.items():
                if isinstance(value, str) and self.secret in value:
                    fields[key] = value.replace(self.secret, "***")
        else:
            for key, value in list(record.__dict__.items()):
                if key not in _RESERVED and isinstance(value, str) and self.secret in value:
                    setattr(record, key, value.replace(self.secret, "***"))
        return True


def setup_logging(fmt: str = "auto", level: str = "INFO", secret: str = "", stream=None) -> None:
    stream = stream or sys.stderr
    if fmt == "auto":
        fmt = "text" if stream.isatty() else "json"
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    handler.addFilter(Redactor(secret))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)


def log_event(logger: logging.Logger, level: int, event: str, **fields) -> None:
    """Log one event line; `fields` become JSON keys (or key=value pairs in text mode)."""
    if logger.isEnabledFor(level):
        logger.log(level, event, extra={"fields": fields})
