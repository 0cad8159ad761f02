"""A short, deterministic run of benchmarks/fuzz_devserver.py: schemathesis from the published spec finds no
server error and no invalid timestamp; the timestamp check tells a valid time from an invalid one, and the
verdict fails a run on the checks and the server's errors only."""

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

EXAMPLES = 8  # cases per operation and generation mode in the fuzzing phase: 652 cases, 13-20 s on a busy machine


@pytest.mark.timeout(10)
def test_the_timestamp_check_finds_invalid_times_anywhere_in_a_body():
    good = {"created_at": "1969-12-31T23:59:59.500000Z", "jobs": [{"lease_expires_at": "2026-01-01T00:00:00+02:00"}],
            "data": {"timestamp": "2026-01-01T00:00:00.1Z"}, "name_at": None}
    assert fuzz_devserver.bad_timestamps(good) == []
    bad = {"jobs": [{"scheduled_at": "1970-01-01T00:00:00.-500000Z"}], "data": {"timestamp": "2026-01-01"}}
    assert fuzz_devserver.bad_timestamps(bad) == ["jobs[0].scheduled_at='1970-01-01T00:00:00.-500000Z'",
                                                  "data.timestamp='2026-01-01'"]


def test_the_verdict_fails_on_the_checks_and_the_servers_errors_only():
    clean = {"failures": [], "errors": [{"title": "Runtime Error", "count": 1}], "test_cases": {"generated": 9},
             "stop_reason": "completed"}
    found = fuzz_devserver.verdict(clean, alive=True)
    assert found["ok"] and found["fuzzer_errors"] == [{"title": "Runtime Error", "count": 1}] and found["cases"] == 9
    assert not fuzz_devserver.verdict(clean, alive=False)["ok"]
    five_hundred = {"failures": [{"title": "Server error", "code": "ST101", "count": 1,
                                  "operations": ["GET /api/v1/schedules"]}], "errors": []}
    found = fuzz_devserver.verdict(five_hundred, alive=True)
    assert not found["ok"] and found["failures"][0]["operations"] == ["GET /api/v1/schedules"]
    hung = {"failures": [], "errors": [{"title": "Network Error", "count": 2}]}
    assert fuzz_devserver.verdict(hung, alive=True)["server_errors"] == [{"title": "Network Error", "count": 2}]
    assert not fuzz_devserver.verdict(hung, alive=True)["ok"]


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_a_short_fuzz_run_finds_no_server_error():
    """The same cases every run (schemathesis's deterministic mode, a fixed number of examples per operation, no
    time budget, one worker), so a failure is the server's and repeats; only the two checks (no 5xx, times in
    RFC 3339) and the server's own errors (no answer) fail it, never schemathesis's internal errors."""
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "fuzz_devserver.py"), "--deterministic",
                           "--phases", "examples,fuzzing", "--max-examples", str(EXAMPLES), "--workers", "1"],
                          cwd=ROOT, capture_output=True, text=True, timeout=140)
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["ok"] and summary["server_alive"], proc.stdout[-6000:] + proc.stderr
    assert summary["failures"] == [] and summary["server_errors"] == []
    assert summary["stop_reason"] == "completed" and summary["cases"] >= 95, summary  # every operation, whole
