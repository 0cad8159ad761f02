"""Tiny runs of the benchmark scripts (run.py, bench_api.py, cores.py, bench_parts.py), so they keep working.

Checks that the JSON has every section with sane values; the figures themselves are not
asserted (this machine is shared and a test is no benchmark).
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(330)
@pytest.mark.exclusive
def test_benchmark_script_tiny_run(tmp_path):
    out = tmp_path / "bench.json"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "run.py"), "--quick", "--ms", "5,20", "--seconds", "0.25",
           "--noop-jobs", "100", "--latency-samples", "3", "--scaling", "1,2", "--idle-seconds", "0.2",
           "--json", str(out), "--no-markdown", "--no-api", "--no-fleet"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r = json.loads(out.read_text())
    for section in ("machine", "config", "efficiency", "sdk", "overhead", "latency", "memory", "scaling", "targets"):
        assert section in r, section
    assert r["machine"]["cores"] >= 1 and r["machine"]["python"]
    assert [e["ms"] for e in r["efficiency"]] == [5.0, 20.0]
    for e in r["efficiency"]:
        assert e["completed"] == e["jobs"] > 0
        assert 0 < e["daemon_efficiency"] <= 1.5 and 0 < e["pool_efficiency"] <= 1.5
        assert e["daemon_over_pool"] > 0 and e["parent_cpu_us_per_job"] >= 0
    assert r["sdk"]["poll_interval_s"] > 0
    for s in r["sdk"]["rows"]:
        assert s["completed"] == s["jobs"] > 0 and s["sdk_jobs_per_s"] > 0 and s["ratio"] > 0
    o = r["overhead"]
    assert o["completed"] == o["noop_jobs"] == 100
    # 100 jobs are ~20 ms of parent CPU, two ticks of the CPU clock: with idle subtracted a loaded run can read 0.
    assert o["noop_jobs_per_s"] > 0 and o["parent_cpu_us_per_job"] >= 0 and o["server_cpu_us_per_job"] >= 0
    la = r["latency"]
    assert la["samples"] == 3
    assert 0 <= la["claim_to_start_ms"]["p50"] <= la["enqueue_to_start_ms"]["p99"] + 1e-6 < 30_000
    m = r["memory"]
    assert m["children"] == r["config"]["procs"] and 0 < m["parent_rss_mib"] < 1024 and m["child_rss_mib"] > 0
    assert [s["procs"] for s in r["scaling"]["rows"]] == [1, 2]
    assert all(s["completed"] == s["jobs"] and s["jobs_per_s"] > 0 for s in r["scaling"]["rows"])
    assert {t["name"] for t in r["targets"]} and all(isinstance(t["met"], bool) for t in r["targets"])
    assert "efficiency" in proc.stdout and "targets" in proc.stdout


@pytest.mark.slow
@pytest.mark.timeout(330)
@pytest.mark.exclusive
def test_api_benchmark_tiny_run(tmp_path):
    """benchmarks/bench_api.py (the API-latency, no-op, fleet and budget sections run.py also runs)."""
    out = tmp_path / "api.json"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "bench_api.py"), "--quick", "--delays", "20", "--ms", "20",
           "--rates", "25", "--seconds", "0.3", "--noop-jobs", "100", "--fleet-jobs", "4", "--budget-seconds", "2",
           "--no-sdk", "--history", "--repeat", "2", "--json", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r = json.loads(out.read_text())
    rows = {row["worker"]: row for row in r["latency"]}
    assert {"ours", "prefetch0", "history"} <= set(rows)  # history's warm-up jobs are not counted in its row
    assert [row["run"] for row in r["noop"] if row["worker"] == "ours"] == [1, 2, 3]
    # --repeat 2: each worker twice, in opposite orders, and the median of its two runs
    first = [row["worker"] for row in r["latency"] if row["run"] == 1]
    assert first[:3] == ["ours", "prefetch0", "history"]  # (then grpc, with the grpc extra)
    assert [row["worker"] for row in r["latency"] if row["run"] == 2] == first[::-1]
    medians = {m["worker"]: m for m in r["latency_medians"]}
    ours = sorted(row["over_pool"] for row in r["latency"] if row["worker"] == "ours")
    assert medians["ours"]["runs"] == 2 and medians["ours"]["over_pool_median"] == round(sum(ours) / 2, 4)
    assert (medians["ours"]["over_pool_min"], medians["ours"]["over_pool_max"]) == (ours[0], ours[1])
    assert "the median of each worker's runs" in proc.stdout
    cpu = sorted(row["server_cpu_us_per_job"] for row in r["latency"] if row["worker"] == "ours")
    assert all(v >= 0 for v in cpu) and medians["ours"]["server_cpu_us_median"] == round(sum(cpu) / 2, 1)
    if "grpc" in rows:  # gRPC against REST turn by turn: the same turn's two rows, subtracted
        (c,) = r["transports"]
        grpc = {row["run"]: row["over_pool"] for row in r["latency"] if row["worker"] == "grpc"}
        diffs = [grpc[row["run"]] - row["over_pool"] for row in r["latency"] if row["worker"] == "ours"]
        assert c["turns"] == 2 and c["difference_median"] == round(sum(diffs) / 2, 4)
        assert c["other_at_or_above"] == sum(d >= 0 for d in diffs) and "gRPC against REST" in proc.stdout
    for row in r["latency"] + r["noop"] + r["budget"]:
        assert row["completed"] == row["jobs"] > 0 and row["jobs_per_s"] > 0 and row["exit_code"] == 0
    assert rows["ours"]["reserve_wait_ms"]["samples"] == rows["ours"]["jobs"]
    assert all(0 < row["steady_efficiency"] <= 1.5 for row in r["latency"])
    assert r["budget"][0]["rate_limit_rps"] == 25 and r["budget"][0]["requests"] >= r["budget"][0]["jobs"]
    f = r["fleet"]
    assert f["completed"] == f["jobs"] == 4 and f["makespan_over_ideal"] > 0 and sum(f["split"].values()) == 4
    assert "API latency" in proc.stdout and "Request budget" in proc.stdout


@pytest.mark.timeout(200)
@pytest.mark.exclusive
def test_api_benchmark_runs_another_checkouts_daemon_over_both_transports(tmp_path):
    """bench_api.py --baseline: the other checkout's daemon (here this one) runs as `baseline` over REST and as
    `baseline-grpc` over gRPC, each row measured."""
    pytest.importorskip("grpc")
    out = tmp_path / "api.json"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "bench_api.py"), "--sections", "latency", "--delays", "0",
           "--ms", "20", "--seconds", "0.2", "--min-jobs", "5", "--no-sdk", "--only", "baseline,baseline-grpc",
           "--baseline", str(ROOT), "--json", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = json.loads(out.read_text())["latency"]
    assert [r["worker"] for r in rows] == ["baseline", "baseline-grpc"]
    for r in rows:
        assert r["completed"] == r["jobs"] > 0 and r["exit_code"] == 0 and r["over_pool"] > 0
    assert rows[0]["requests"] > rows[0]["jobs"] > rows[1]["requests"]  # (the server counts REST requests only)


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.exclusive
def test_cores_benchmark_tiny_run(tmp_path):
    """benchmarks/cores.py: rows at loopback and with 20 ms of API latency, over REST and over gRPC; the
    shares add up."""
    out = tmp_path / "cores.json"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "cores.py"), "--ms", "20", "--delays", "0,20",
           "--transports", "rest,grpc,rest,baseline-grpc", "--baseline", str(ROOT), "--seconds", "0.3",
           "--json", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=100)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    # (rest twice: each row has a database of its own, so the second is measured, not read from the first)
    assert [(r["api_delay_ms"], r["job_ms"], r["transport"]) for r in rows] == [
        (0, 20.0, "rest"), (0, 20.0, "grpc"), (0, 20.0, "rest"), (0, 20.0, "baseline-grpc"), (20, 20.0, "rest"),
        (20, 20.0, "grpc"), (20, 20.0, "rest"), (20, 20.0, "baseline-grpc")]
    for r in rows:
        assert r["jobs"] >= 4 and 0 < r["efficiency"] <= 1.5 and r["server_us_per_job"] > 0
        if r["transport"] == "rest":  # (the server counts REST requests by route only)
            assert r["jobs"] == r["completes"] and r["claims"] >= 1
        assert r["children_us_per_job"] >= 20_000 * 0.9  # each job burns 20 ms of the child's CPU
        assert r["children_cores"] + r["parent_cores"] + r["server_cores"] <= r["machine_busy_cores"] + 0.2
    assert "children" in proc.stdout.splitlines()[1]
    bad = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "cores.py"), "--transports", "baseline"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--baseline PATH" in bad.stderr  # a baseline row without a checkout to run


def test_the_steady_rate_leaves_out_the_ends_of_a_batch(tmp_path):
    """Db.steady: the rate between the 10th and 90th percentile completions, so a slow start and a
    slow end (the first claim, the last report) do not count; fewer than two completions inside: 0."""
    sys.path.insert(0, str(ROOT))
    from benchmarks.bench_api import Db

    path = tmp_path / "jobs.db"
    with sqlite3.connect(path) as db:
        # created_at: Db counts only the jobs created since it was made (0 here: all of them)
        db.execute("CREATE TABLE jobs(queue_name TEXT, status TEXT, started_at REAL, completed_at REAL, "
                   "created_at REAL DEFAULT 0.0)")
        ends = [0.5] + [1.0 + 0.01 * i for i in range(18)] + [3.0]  # 20 jobs: a late first and last one
        insert = "INSERT INTO jobs(queue_name, status, started_at, completed_at) VALUES"
        db.executemany(f"{insert} ('q', 'completed', 0.0, ?)", [(t,) for t in ends])
        db.execute(f"{insert} ('q', 'pending', NULL, NULL)")
        db.execute(f"{insert} ('few', 'completed', 0.0, 1.0)")
    reader = Db(str(path))
    jobs, secs = reader.steady("q")
    assert jobs == 15 and abs(secs - 0.15) < 1e-9  # the 3rd to the 18th completion: 1.01 .. 1.16
    assert reader.span("q") == (20, 3.0)
    assert reader.steady("few") == (0, 0.0) and reader.steady("none") == (0, 0.0)


@pytest.mark.timeout(60)
def test_child_life_cost_tiny_run():
    """benchmarks/child_life_cost.py: every row, a positive CPU time per job."""
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "child_life_cost.py"), "--jobs", "200"], cwd=ROOT,
                          capture_output=True, text=True, timeout=50)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = {line.split()[0]: float(line.split()[1]) for line in proc.stdout.splitlines()}
    assert set(rows) == {"before", "no-op", "traced", "hooks", "parent"} and all(v > 0 for v in rows.values())


@pytest.mark.timeout(120)
def test_parts_benchmark_tiny_run(tmp_path):
    """benchmarks/bench_parts.py: the jobs wing's and the frames' CPU per job, in process, for this tree."""
    out = tmp_path / "parts.json"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "bench_parts.py"), "--jobs", "300", "--rounds", "1",
           "--json", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=100)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (row,) = json.loads(out.read_text())["results"].values()
    assert row["layout"] == "jobs wing" and 0 < row["parts"]["us_per_job"] < 10_000
    assert all(0 < row[name]["us_per_job"] < 10_000 for name in ("frames_parent", "frames_child"))
    assert "frames_parent us/job" in proc.stdout.splitlines()[0]


@pytest.mark.slow
@pytest.mark.timeout(200)
@pytest.mark.exclusive
def test_grpc_benchmark_tiny_run():
    """benchmarks/bench_grpc.py (docs/grpc.md's figures): every transport, one StreamJobs row, the daemons."""
    pytest.importorskip("grpc", reason="the grpc extra is not installed")
    cmd = [sys.executable, str(ROOT / "benchmarks" / "bench_grpc.py"), "--jobs", "20", "--delay-jobs", "10",
           "--delay-ms", "0,5", "--slots", "1,2", "--work-ms", "5",
           "--transports", "rest,grpc-unary,grpc-unary-grpcio,grpc-stream,grpc-jobstreams",
           "--daemon-jobs", "20", "--procs", "1"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    kinds = {(row["transport"], row["slots"], row["delay_ms"]) for row in r["rows"]}
    assert len(kinds) == 5 * 2 * 2 and all(row["jobs_per_s"] > 0 for row in r["rows"])
    assert {row["transport"] for row in r["daemon_rows"]} == {"daemon-rest", "daemon-grpc", "daemon-grpc-grpcio"}
    assert all(row["parent_cpu_us"] >= 0 and row["jobs_per_s"] > 0 for row in r["daemon_rows"])  # (CPU in ticks)


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.exclusive
def test_child_life_daemon_tiny_run(tmp_path):
    """benchmarks/child_life_daemon.py: every row through the real daemon, all jobs completed, the figures there;
    this checkout stands in for the baseline."""
    out = tmp_path / "life.json"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "child_life_daemon.py"), "--baseline", str(ROOT), "--jobs", "30",
           "--ms", "1", "--delays", "0", "--recycle", "10", "--json", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=230)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r = json.loads(out.read_text())
    assert [row["row"] for row in r["rows"]] == ["baseline", "baseline-recycle", "plain", "recycle", "flushed",
                                                 "hooked", "traced"]
    for row in r["rows"]:
        assert row["completed"] == 30 and row["exit_code"] == 0 and row["jobs_per_s"] > 0 and row["over_pool"] > 0
        # CPU is counted in clock ticks: thirty 1 ms jobs may read 0
        assert row["parent_cpu_us_per_job"] >= 0 and row["children_cpu_us_per_job"] >= 0
    assert "children us/job" in proc.stdout
