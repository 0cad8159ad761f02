"""The config file end to end: the real daemon, against the real dev server, runs with its file's settings
(the file's keys and mistakes, in process: tests/unit/test_config_file.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.testing import run_jobs


@pytest.mark.timeout(90)
def test_the_real_daemon_runs_with_the_settings_of_its_file(tmp_path: Path, spooled_dev_server):
    path = tmp_path / "supervisor.toml"
    path.write_text("procs = 2\nmax-result-bytes = 2048\n")
    done = run_jobs("supervisor.demo_handlers:misbehave",
                    [{"do": "big_result", "bytes": 100}, {"do": "big_result", "bytes": 5000}],
                    server=spooled_dev_server, max_retries=0, config=str(path))
    assert done[0].status == "completed" and done[0].result == {"blob": "x" * 100}
    assert done[1].status == "deadletter" and "over the 2048 byte limit" in done[1].last_error
