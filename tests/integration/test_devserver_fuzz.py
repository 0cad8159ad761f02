"""A short run of benchmarks/fuzz_devserver.py: schemathesis from the published spec finds no server error and
no invalid timestamp; and the timestamp check itself tells a valid time from an invalid one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
pytest.importorskip("schemathesis", reason="schemathesis is not installed (the test extra has it)")

import fuzz_devserver  # noqa: E402


@pytest.mark.timeout(10)
def test_the_timestamp_check_finds_invalid_times_anywhere_in_a_body():
    good = {"created_at": "1969-12-31T23:59:59.500000Z", "jobs": [{"lease_expires_at": "2026-01-01T00:00:00+02:00"}],
            "data": {"timestamp": "2026-01-01T00:00:00.1Z"}, "name_at": None}
    assert fuzz_devserver.bad_timestamps(good) == []
    bad = {"jobs": [{"scheduled_at": "1970-01-01T00:00:00.-500000Z"}], "data": {"timestamp": "2026-01-01"}}
    assert fuzz_devserver.bad_timestamps(bad) == ["jobs[0].scheduled_at='1970-01-01T00:00:00.-500000Z'",
                                                  "data.timestamp='2026-01-01'"]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_short_fuzz_run_finds_no_server_error(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "fuzz_devserver.py"), "--max-time", "15",
                           "--workers", "1"], cwd=ROOT, capture_output=True, text=True, timeout=110)
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert proc.returncode == 0 and summary["ok"] and summary["server_alive"], proc.stdout[-4000:] + proc.stderr
    assert "generated" in proc.stdout and " passed" in proc.stdout
