"""Each job in an OpenTelemetry span under the real daemon (the real SDK, an in-memory exporter): a span per job
with the handler's span inside, the producer's trace continued from the payload's trace context, a malformed one
starting a new trace, a failure recorded, and the last job's span exported when a drain ends the child."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest
from conftest import wait_for_status

from supervisor.child.tracing import TRACE_KEY, carry

pytestmark = pytest.mark.timeout(90)
TRACE_ID, PARENT_ID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"


def test_a_span_per_job_continuing_the_producers_trace(dev_server, daemon_factory, tmp_path):
    d = daemon_factory("traced", handler="tests.support.handlers_traced:handle", procs=1,
                       env={"TRACE_OUT": str(tmp_path)}, args=["--child-init", "tests.support.handlers_traced:init"])
    follows = dev_server.enqueue("traced", carry({"n": 1}, f"00-{TRACE_ID}-{PARENT_ID}-01"))
    malformed = dev_server.enqueue("traced", {TRACE_KEY: {"traceparent": "00-nothex-01"}})
    failed = dev_server.enqueue("traced", {"fail": True}, max_retries=0)
    plain = dev_server.enqueue("traced", {})
    wait_for_status(dev_server, [follows, malformed, plain])
    wait_for_status(dev_server, [failed], statuses=("failed", "deadletter"))
    d.signal(signal.SIGTERM)  # the batch processor exports only when flushed: at the child's exit
    assert d.wait() == 0

    (dump,) = tmp_path.glob("spans-*.json")
    spans = json.loads(dump.read_text())
    jobs = {s["attributes"]["spooled.job.id"]: s for s in spans if s["name"] == "spooled.job traced"}
    assert set(jobs) == {follows, malformed, failed, plain}  # the last one too: the exit flushed it
    inner = {s["parent_id"]: s for s in spans if s["name"] == "inner"}
    for job_id, span in jobs.items():
        assert span["kind"] == "SpanKind.CONSUMER"
        attributes = span["attributes"]
        assert (attributes["spooled.queue"], attributes["spooled.worker.id"], attributes["spooled.job.attempt"]) == (
            "traced", "test-worker", 1)
        assert attributes["spooled.job.outcome"] == ("failed" if job_id == failed else "completed")
        assert inner[span["context"]["span_id"]]["context"]["trace_id"] == span["context"]["trace_id"]
    assert jobs[follows]["context"]["trace_id"] == f"0x{TRACE_ID}" and jobs[follows]["parent_id"] == f"0x{PARENT_ID}"
    assert jobs[malformed]["parent_id"] is None and jobs[malformed]["context"]["trace_id"] != f"0x{TRACE_ID}"
    assert jobs[plain]["parent_id"] is None
    failure = jobs[failed]
    assert failure["status"]["status_code"] == "ERROR"
    assert "ValueError: asked to fail" in failure["status"]["description"]
    (exception,) = [e for e in failure["events"] if e["name"] == "exception"]
    assert exception["attributes"]["exception.type"] == "ValueError"


def test_a_shared_key_in_the_handlers_exception_never_reaches_the_exporter(dev_server, daemon_factory, tmp_path):
    key = dev_server.api_key
    d = daemon_factory("traced-key", handler="tests.support.handlers_traced:handle", procs=1,
                       env={"TRACE_OUT": str(tmp_path)},
                       args=["--share-api-key", "--child-init", "tests.support.handlers_traced:init"])
    failed = dev_server.enqueue("traced-key", {"fail_with_key": True}, max_retries=0)
    wait_for_status(dev_server, [failed], statuses=("failed", "deadletter"))
    d.signal(signal.SIGTERM)
    assert d.wait() == 0
    (dump,) = tmp_path.glob("spans-*.json")
    (span,) = [s for s in json.loads(dump.read_text()) if s["name"] == "spooled.job traced-key"]
    text = json.dumps(span)  # the job's span, ours; the handler's own "inner" span records what it is given
    assert not any(key[i:i + 8] in text for i in range(0, len(key) - 8))
    (exception,) = [e for e in span["events"] if e["name"] == "exception"]
    attributes = exception["attributes"]
    assert attributes["exception.type"] == "ValueError"
    assert attributes["exception.message"] == "the API refused ***"
    assert "the API refused ***" in attributes["exception.stacktrace"] and "handlers_traced.py" in attributes[
        "exception.stacktrace"]


def test_without_a_tracer_provider_nothing_is_traced_and_the_daemon_imports_no_opentelemetry(dev_server, daemon_factory,
                                                                                             tmp_path):
    d = daemon_factory("untraced", handler="tests.support.handlers_traced:handle", procs=1,
                       env={"TRACE_OUT": str(tmp_path)})  # the module imports OpenTelemetry, sets no provider
    wait_for_status(dev_server, [dev_server.enqueue("untraced", {})])
    d.signal(signal.SIGTERM)
    assert d.wait() == 0 and not list(tmp_path.glob("spans-*"))
    code = ("import sys, supervisor.commands.run, supervisor.parent.arbiter, supervisor.child.main\n"
            "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "[]\n"


def test_a_trace_context_travels_in_an_object_payload_only():
    with pytest.raises(ValueError, match="object payload"):
        carry([1, 2], f"00-{TRACE_ID}-{PARENT_ID}-01")
    with pytest.raises(ValueError, match="traceparent must look like"):
        carry({}, "00-<b>markup</b>-01")
    assert carry({"a": 1}, f"00-{TRACE_ID}-{PARENT_ID}-01", "k=v") == {
        "a": 1, TRACE_KEY: {"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01", "tracestate": "k=v"}}


def test_a_malformed_trace_context_is_one_debug_line_and_the_job_completes(dev_server, daemon_factory, tmp_path):
    d = daemon_factory("badtrace", handler="tests.support.handlers_traced:handle", procs=1,
                       env={"TRACE_OUT": str(tmp_path)},
                       args=["--child-init", "tests.support.handlers_traced:init", "--log-level", "DEBUG"])
    job = dev_server.enqueue("badtrace", {TRACE_KEY: {"traceparent": "00-<b>not</b>-01"}})
    (done,) = wait_for_status(dev_server, [job])
    assert done["result"] == {"ok": True}
    (line,) = d.wait_events("the job's trace context is malformed; its span starts a new trace")
    assert line["level"] == "debug" and line["job_id"] == job
    d.signal(signal.SIGTERM)
    assert d.wait() == 0
    assert len(d.events("the job's trace context is malformed; its span starts a new trace")) == 1
