"""Sentry in a child, as the production recipe sets it up (--child-init calling sentry_sdk.init): the event of a
handler's exception, held by the transport until flushed, reaches it when the child leaves (a drain)."""

from __future__ import annotations

import json
import signal

import pytest
from conftest import wait_for_status

pytestmark = pytest.mark.timeout(90)


def test_a_handlers_exception_reaches_sentrys_transport_before_the_child_leaves(dev_server, daemon_factory, tmp_path):
    out = tmp_path / "sentry.jsonl"
    d = daemon_factory("sentry", handler="tests.support.handlers_sentry:handle", procs=1, env={"SENTRY_OUT": str(out)},
                       args=["--child-init", "tests.support.handlers_sentry:init"])
    job = dev_server.enqueue("sentry", {}, max_retries=0)
    (failed,) = wait_for_status(dev_server, [job], statuses=("failed", "deadletter"))
    assert not out.exists()  # held by the transport, as Sentry's own holds it until its worker sends it
    d.signal(signal.SIGTERM)
    assert d.wait() == 0
    (line,) = [json.loads(text) for text in out.read_text().splitlines()]
    event = line["event"]
    (exception,) = event["exception"]["values"]
    assert (exception["type"], exception["value"]) == ("ValueError", f"cannot handle {job}")
    assert event["tags"]["job_id"] == job and line["pid"] != d.proc.pid
