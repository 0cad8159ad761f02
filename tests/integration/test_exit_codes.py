"""The daemon's exit codes for a main loop that keeps failing (1) and a registration refused as invalid (2)."""

from __future__ import annotations

import psutil
import pytest
from conftest import (
    Daemon,
    DevServer,
    wait_until,
)


# ---------------------------------------------------------------- exit codes
@pytest.mark.timeout(60)
def test_repeated_errors_in_the_main_loop_exit_1(dev_server):
    """A bug that fails every turn (here: the per-turn telemetry hook raising) is logged and retried for a
    hundred turns, then the daemon exits 1 (so systemd restarts it) and takes its children with it."""
    # Polling every 0.2 s keeps the idle loop turning several times a second; listening for events it
    # turns once a second, and a hundred failing turns would take longer than the test waits.
    d = Daemon(dev_server, "q-bug", procs=1, worker_id="w-bug", args=["--wake", "poll"])
    code = ("import sys; import supervisor.parent.hooks as h; import supervisor.parent.arbiter as a\n"
            "def tick(self, now):\n    raise RuntimeError('injected bug in tick')\n"
            "h.DaemonHooks.tick = tick\n"
            "a.LOOP_ERROR_PAUSE = 0.01\n"  # the pauses after the hundred errors add up to 1 s, not 10
            "from supervisor.cli import main\nsys.exit(main(sys.argv[1:]))")
    d.cmd[1:3] = ["-c", code]  # the same command line, run through a patched entry point
    d.start()
    assert d.wait(50) == 1
    errors = [line for line in d.out.lines if "unexpected error in the main loop; carrying on" in line]
    assert len(errors) >= 100, len(errors)
    assert "injected bug in tick" in d.out.text()
    wait_until(lambda: not [p for p in psutil.process_iter(["cmdline"])
                            if "spooled-supervisor: child" in " ".join(p.info["cmdline"] or [])
                            and p.ppid() in (1, d.proc.pid)], timeout=10, what="no child left behind")


@pytest.mark.timeout(30)
def test_a_registration_refused_as_invalid_exits_2(tmp_path):
    server = DevServer(str(tmp_path / "dev.db"), extra=["--max-body-bytes", "64"]).start()  # refuses the body
    d = Daemon(server, "q-refused", procs=1, worker_id="w-refused").start()
    assert d.wait(20) == 2
    line = d.events("registration refused; fix the configuration")
    assert line and line[0]["level"] == "error" and "400" in line[0]["error"], d.out.text()
    assert server.worker("w-refused") is None
