"""A traced handler: --child-init sets a real OpenTelemetry SDK tracer provider whose batch processor exports only
when flushed (its schedule is ten minutes) into an in-memory exporter, written to TRACE_OUT/spans-<pid>.json
at exit, after the provider's own atexit shutdown has flushed it. The handler opens a span of its own."""

from __future__ import annotations

import atexit
import json
import os

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

exporter = InMemorySpanExporter()


def _dump() -> None:
    spans = [json.loads(span.to_json()) for span in exporter.get_finished_spans()]
    with open(os.path.join(os.environ["TRACE_OUT"], f"spans-{os.getpid()}.json"), "w") as f:
        json.dump(spans, f)


def init() -> None:
    atexit.register(_dump)  # before the provider's shutdown is registered: atexit runs it after that shutdown
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=600_000))
    trace.set_tracer_provider(provider)


def handle(ctx):
    with trace.get_tracer("handler").start_as_current_span("inner"):
        if ctx.payload.get("fail"):
            raise ValueError("asked to fail")
        if ctx.payload.get("fail_with_key"):  # under --share-api-key
            raise ValueError(f"the API refused {os.environ['SPOOLED_API_KEY']}")
        return {"ok": True}
