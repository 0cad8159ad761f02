"""A handler reporting its exceptions to Sentry (the real sentry-sdk), set up by --child-init. The transport
records instead of sending: like Sentry's HTTP transport it holds events until flushed (at the client's close,
which Sentry's atexit integration does), then writes each event as a JSON line to SENTRY_OUT."""

from __future__ import annotations

import json
import os

import sentry_sdk
from sentry_sdk.transport import Transport


class RecordingTransport(Transport):
    def __init__(self, options=None):
        super().__init__(options)
        self.held: list = []

    def capture_envelope(self, envelope) -> None:
        self.held.append(envelope)

    def flush(self, timeout, callback=None) -> None:
        held, self.held = self.held, []
        with open(os.environ["SENTRY_OUT"], "a") as f:
            for envelope in held:
                event = envelope.get_event()
                if event is not None:
                    f.write(json.dumps({"pid": os.getpid(), "event": event}, default=str) + "\n")

    def kill(self) -> None:
        self.flush(0)


def init() -> None:
    sentry_sdk.init(dsn="https://public@sentry.invalid/1", transport=RecordingTransport)


def handle(ctx):
    try:
        raise ValueError(f"cannot handle {ctx.job_id}")
    except ValueError as exc:
        sentry_sdk.capture_exception(exc, tags={"job_id": ctx.job_id})
        raise
