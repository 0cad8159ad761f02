"""A tiny run of benchmarks/memory.py, so it keeps working: every row is there with sane values (the
figures themselves are not asserted: the machine is shared and a test is no benchmark)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(330)
@pytest.mark.exclusive
def test_memory_benchmark_tiny_run(tmp_path):
    out = tmp_path / "memory.json"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "memory.py"), "--model-mb", "8", "--procs", "2", "--jobs", "12",
           "--job-mb", "2", "--json", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r = json.loads(out.read_text())
    assert [(row["worker"], row["procs"], row["model_mb"]) for row in r["rows"]] == [
        ("daemon", 2, 0), ("daemon --preload", 2, 0), ("daemon", 2, 8), ("daemon --preload", 2, 8),
        ("multiprocessing.Pool", 2, 8)]
    for row in r["rows"]:
        assert row["children"] == 2 and row["jobs"] >= 3 and row["jobs_per_s"] > 0 and row["cpu_ms_per_job"] >= 0
        assert 0 < row["max_child_uss_mb"] <= row["total_uss_mb"] and row["total_pss_mb"] > 0
        assert row["first_job_s"] > 0
    assert all(row["sample_rss_us"] > 0 for row in r["rows"] if row["worker"] != "multiprocessing.Pool")
    assert isinstance(r["target_met"], bool) and r["target_uss_mb"] > 0
