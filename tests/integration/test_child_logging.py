"""The children log as the daemon does: the format and level the daemon was given apply to `ctx.log` (both
forms), a library's `logging` and the lines written while the handler's module is imported, with `job_id`
and `queue` on every line written during a job; a module that configures logging itself keeps its
configuration, and --child-logging module leaves logging wholly to the module."""

from __future__ import annotations

import json

import pytest
from conftest import Daemon, wait_for_status

pytestmark = pytest.mark.timeout(60)
HANDLER = "tests.support.handlers_logging:handle"


def run_one(dev_server, queue: str, fmt: str, level: str, handler: str = HANDLER, args=(),
            last: str = "root error line") -> list[str]:
    """Start a daemon with one child, run one job to completion, stop; return the daemon's output lines."""
    job = dev_server.enqueue(queue, {"x": 1})
    d = Daemon(dev_server, queue, handler=handler, procs=1, worker_id=f"w-{queue}",
               args=["--log-level", level, *args])
    d.cmd[d.cmd.index("--log-format") + 1] = fmt
    d.start()
    try:
        wait_for_status(dev_server, [job], timeout=30)
        d.out.wait_for(last)  # the job's last line: the child writes it before the job is reported
    finally:
        d.stop()
    return d.out.text().splitlines()


def json_lines(lines: list[str]) -> list[dict]:
    assert all(line.startswith("{") for line in lines if line.strip()), [ln for ln in lines if ln[:1] != "{"]
    return [json.loads(line) for line in lines if line.strip()]


def test_json_at_warning_every_child_line_is_json_and_warning_up_with_the_job_fields(dev_server):
    records = json_lines(run_one(dev_server, "log-json-warn", "json", "WARNING"))
    by_msg = {r["msg"]: r for r in records}
    assert "sdk debug line" not in by_msg and "info line" not in by_msg and "library info line" not in by_msg
    imported = by_msg["imported the handler module"]
    assert imported["level"] == "warning" and imported["logger"] == "userlib" and "job_id" not in imported
    for msg in ("library warning line", "root error line"):
        assert by_msg[msg]["queue"] == "log-json-warn" and by_msg[msg]["job_id"], by_msg[msg]


def test_text_at_debug_every_child_line_is_text_and_debug_up_with_the_job_fields(dev_server):
    lines = run_one(dev_server, "log-text-debug", "text", "DEBUG")
    assert not [line for line in lines if line.startswith("{")]
    (debug,) = [line for line in lines if "sdk debug line" in line]
    assert " DEBUG " in debug and "n=1" in debug and "queue=log-text-debug" in debug and "job_id=" in debug
    (info,) = [line for line in lines if "library info line" in line]
    assert " INFO " in info and "job_id=" in info and "queue=log-text-debug" in info
    (imported,) = [line for line in lines if "imported the handler module" in line]
    assert " WARNING " in imported and "job_id=" not in imported


def test_a_module_that_configures_logging_keeps_its_configuration(dev_server):
    lines = run_one(dev_server, "log-own", "json", "INFO", handler="tests.support.handlers_own_logging:handle",
                    last="library info line")
    assert "OWN INFO userlib library info line" in lines
    assert "OWN INFO supervisor.job info line" in lines  # ctx.log goes through the module's handler too
    assert not [line for line in lines if "library info line" in line and line.startswith("{")]  # not twice


def test_child_logging_module_leaves_logging_wholly_to_the_module(dev_server):
    lines = run_one(dev_server, "log-module", "json", "DEBUG", args=["--child-logging", "module"])
    assert "library warning line" in lines and "root error line" in lines  # Python's last-resort handler: bare
    assert not [line for line in lines if "library info line" in line or "sdk debug line" in line]
    assert any(line.startswith("{") and '"msg":"ready"' in line for line in lines)  # the daemon's own: as given
