"""Handlers for benchmarks/child_life_daemon.py: the same job (benchmarks.handlers.burn) with each of a child's
life features around it.

  hooked   an SDK SpooledWorker with a no-op hook on every job event (so each job also gets its `settled` frame)
  flushed  an atexit entry and a buffered logging handler (a MemoryHandler over a file, one line held), flushed
           at every graceful exit of a child (run it with --max-jobs-per-child to make exits happen); the job
           itself is the plain one
  traced   a tracer provider set at import (the OpenTelemetry SDK, a batch processor, an exporter that drops
           the spans): each job in a span
"""

from __future__ import annotations

import atexit
import logging
import logging.handlers
import os

from benchmarks.handlers import burn

MODE = os.environ.get("LIFE_BENCH_MODE", "")

if MODE == "hooked":
    from spooled import SpooledClient
    from spooled.worker import SpooledWorker

    worker = SpooledWorker(SpooledClient(api_key="sk_test_" + "0" * 32, base_url="http://127.0.0.1:9"),
                           queue_name="bench")
    for _event in ("job:claimed", "job:started", "job:completed", "job:failed", "job:lease_lost"):
        worker.on(_event, lambda data: None)

    @worker.process
    def handle(ctx):
        return burn(ctx)

elif MODE == "flushed":
    _log = logging.getLogger("bench.buffered")
    _log.propagate = False
    _log.addHandler(logging.handlers.MemoryHandler(10_000, flushLevel=logging.CRITICAL,
                                                   target=logging.FileHandler(os.devnull)))
    _log.setLevel(logging.INFO)
    _log.info("child %s up", os.getpid())  # held until the exit flush
    atexit.register(lambda: None)

    def handle(ctx):
        return burn(ctx)

elif MODE == "traced":
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    class Drop(SpanExporter):
        def export(self, spans):
            return SpanExportResult.SUCCESS

    _provider = TracerProvider()
    _provider.add_span_processor(BatchSpanProcessor(Drop()))
    trace.set_tracer_provider(_provider)

    def handle(ctx):
        return burn(ctx)

else:
    def handle(ctx):
        return burn(ctx)
