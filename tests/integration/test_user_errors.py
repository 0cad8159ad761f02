"""Errors that point at the user's code: a handler's exception in the daemon's "job failed" line and the job's
`last_error`, and an exception while the handler's module is imported, show the error line and the user's
innermost frames first, without the daemon's own frames or the import machinery's."""

from __future__ import annotations

import os

import pytest
from conftest import Daemon, wait_for_status

pytestmark = pytest.mark.timeout(60)
USER_LINE = 'handlers_errors.py", line 11, in parse_width'


def test_the_failure_line_and_last_error_name_the_users_file_and_line(dev_server, daemon_factory):
    job = dev_server.enqueue("user-errors", {"width": "wide"}, max_retries=0)
    d = daemon_factory("user-errors", handler="tests.support.handlers_errors:handle", procs=1)
    (failed,) = wait_for_status(dev_server, [job], statuses=("deadletter", "failed"))
    assert failed["last_error"].startswith("ValueError: invalid literal for int()")
    assert USER_LINE in failed["last_error"].splitlines()[2]
    assert "supervisor/child" not in failed["last_error"]
    (line,) = d.wait_events("job failed")
    assert USER_LINE in line["error"] and "supervisor/child" not in line["error"], line  # within its 300 characters


def test_an_exception_at_import_names_the_users_module_not_the_import_machinery(dev_server, tmp_path):
    (tmp_path / "broken_on_import.py").write_text("SETTINGS = {}\n\n\ndef handle(ctx):\n    return 1\n\n\n"
                                                  "WIDTH = SETTINGS['width']\n")
    d = Daemon(dev_server, "import-errors", handler="broken_on_import:handle", procs=1,
               env={"PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}).start()
    assert d.wait(30) == 3
    (msg,) = [r["msg"] for r in d.records() if r["msg"].startswith("cannot import handler")]
    lines = msg.splitlines()
    assert lines[0] == "cannot import handler broken_on_import:handle: KeyError: 'width'", msg
    assert lines[2] == f'  File "{tmp_path}/broken_on_import.py", line 8, in <module>', msg  # the user's line first
    assert "importlib" not in msg and "supervisor/" not in msg


def test_a_handler_name_that_is_not_in_the_module_exits_3_with_one_line_naming_what_is(dev_server):
    d = Daemon(dev_server, "typo", handler="supervisor.demo_handlers:resize", procs=2).start()
    try:
        assert d.wait(30) == 3
    finally:
        d.stop()
    (line,) = [r for r in d.records() if r.get("level") == "error"]
    assert "--handler supervisor.demo_handlers:resize: module supervisor.demo_handlers" in line["msg"]
    assert "has no attribute resize; it has: burn, burn_cpu, count_primes, misbehave, noop" in line["msg"]
    assert "\n" not in line["msg"] and "Traceback" not in d.out.text() and "supervisor/child" not in line["msg"]
