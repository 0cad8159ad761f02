"""Each job in a span, when the child has OpenTelemetry set up (optional: the `otel` extra).

Tracing is on in a child when `opentelemetry.trace` is imported there and a tracer provider is set by the
time the child's first job starts: by the handler's module, by --child-init, or by `opentelemetry-instrument`
(whose start-up code runs in the forkserver the children come from). This module never imports
OpenTelemetry itself, and the daemon's parent process never imports this module.

Each job then runs in a span `spooled.job <queue>` of kind CONSUMER, with the attributes below, the
handler's own spans its children, its status ERROR and the exception recorded when the job fails. A job
whose payload is an object carrying a W3C trace context under TRACE_KEY ({"traceparent": ..., "tracestate":
...}) continues that trace; a malformed one starts a new trace, with one DEBUG line.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from collections.abc import Callable
from typing import Any

from supervisor.child.logs import KEY_VARIABLE

TRACE_KEY = "_spooled_trace"  # the payload's key holding the producer's W3C trace context
log = logging.getLogger("supervisor.child")


class JobTracer:
    """Runs a job inside its span (see the module docstring)."""

    def __init__(self, trace: Any, worker_id: str):
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
        from opentelemetry.trace.status import Status, StatusCode

        self.trace = trace
        self.tracer = trace.get_tracer("spooled_supervisor")
        self.propagator = TraceContextTextMapPropagator()
        self.consumer = trace.SpanKind.CONSUMER
        self.status, self.error_code = Status, StatusCode.ERROR
        self.worker_id = worker_id

    def run(self, job: dict, go: Callable[[dict], dict]) -> dict:
        """`go(seen)` inside the job's span; `seen` gets the handler's exception under "error"."""
        queue = job.get("queue_name", "")
        attributes = {"messaging.system": "spooled", "messaging.operation.type": "process",
                      "messaging.destination.name": queue, "messaging.message.id": job["id"],
                      "spooled.job.id": job["id"], "spooled.queue": queue,
                      "spooled.job.attempt": int(job.get("retry_count") or 0) + 1,
                      "spooled.worker.id": self.worker_id}
        with self.tracer.start_as_current_span(f"spooled.job {queue}", context=self.parent(job), kind=self.consumer,
                                               attributes=attributes, record_exception=False,
                                               set_status_on_exception=False) as span:
            seen: dict = {}
            reply = go(seen)
            ok = bool(reply.get("ok"))
            span.set_attribute("spooled.job.outcome", "completed" if ok else "failed")
            if not ok:
                error = seen.get("error")
                text = str(reply.get("error") or "")
                if isinstance(error, BaseException):
                    span.add_event("exception", exception_attributes(error))
                span.set_status(self.status(self.error_code, text.split("\n", 1)[0][:300]))
            return reply

    def parent(self, job: dict) -> Any:
        """The context the job's span continues (its payload's trace context), or None for a new trace."""
        payload = job.get("payload")
        carrier = payload.get(TRACE_KEY) if isinstance(payload, dict) else None
        if carrier is None:
            return None
        if isinstance(carrier, dict) and isinstance(carrier.get("traceparent"), str):
            ctx = self.propagator.extract({k: v for k, v in carrier.items() if isinstance(v, str)})
            if self.trace.get_current_span(ctx).get_span_context().is_valid:
                return ctx
        log.debug("the job's trace context is malformed; its span starts a new trace",
                  extra={"fields": {"job_id": job["id"], "trace_context": repr(carrier)[:200]}})
        return None


def exception_attributes(error: BaseException) -> dict[str, str]:
    """OpenTelemetry's exception event, scrubbed of the key shared with the handler (`record_exception` would
    send the message and traceback as they are, and a span exporter is one more place a line goes)."""
    import traceback

    from supervisor.client.calls import scrub_secret

    key = os.environ.get(KEY_VARIABLE, "")

    def clean(text: str) -> str:
        return scrub_secret(text, key) if len(key) >= 10 else text

    return {"exception.type": type(error).__name__,
            "exception.message": clean(str(error)),
            "exception.stacktrace": clean("".join(traceback.format_exception(error)))}


def job_tracer(worker_id: str) -> JobTracer | None:
    """A JobTracer when this process has OpenTelemetry imported and a tracer provider set, else None."""
    trace = sys.modules.get("opentelemetry.trace")
    if trace is None:
        return None
    try:
        provider = trace.get_tracer_provider()
        if isinstance(provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider)):
            return None
        return JobTracer(trace, worker_id)
    except Exception:  # an API too old or too broken to trace with: run untraced
        log.warning("OpenTelemetry is imported but could not be used; jobs are not traced", exc_info=True)
        return None


TRACEPARENT_RX = re.compile(r"^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$")


def carry(payload: Any, traceparent: str, tracestate: str | None = None) -> dict:
    """A copy of `payload` (an object) carrying the W3C trace context under TRACE_KEY, for a producer that
    has no OpenTelemetry at hand (the `enqueue` command, `run_jobs`). ValueError, saying why, when the
    payload is not an object or `traceparent` does not look like one (version-traceid-spanid-flags)."""
    if not isinstance(payload, dict):
        raise ValueError(f"a trace context travels in an object payload (under {TRACE_KEY!r}), got "
                         f"{type(payload).__name__}")
    if not TRACEPARENT_RX.match(traceparent.strip()):
        raise ValueError(f"traceparent must look like 00-<32 hex>-<16 hex>-<2 hex>, got {traceparent[:80]!r}")
    context = {"traceparent": traceparent.strip()}
    if tracestate:
        context["tracestate"] = tracestate
    return {**payload, TRACE_KEY: context}
