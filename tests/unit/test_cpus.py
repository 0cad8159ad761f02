"""The default --procs: CPUs really granted (affinity mask capped by the cgroup CPU quota).

Quotas come from fake cgroup trees under tmp_path; the affinity mask is a real one, set on a subprocess.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from supervisor.cpus import cgroup_quota, granted_cpus

ROOT = Path(__file__).resolve().parents[2]


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def v2_tree(tmp_path: Path, cgroup_path: str, files: dict[str, str]) -> tuple[Path, Path]:
    """A cgroup v2 mount with `cpu.max` files at the given relative dirs, and a /proc/self naming `cgroup_path`."""
    root, proc = tmp_path / "cgroup", tmp_path / "proc"
    write(root / "cgroup.controllers", "cpuset cpu io memory pids\n")
    for rel, text in files.items():
        write(root / rel / "cpu.max", text)
    (root / cgroup_path.strip("/")).mkdir(parents=True, exist_ok=True)
    write(proc / "cgroup", f"0::{cgroup_path}\n")
    return root, proc


def v1_tree(tmp_path: Path, cgroup_path: str, quota: str, period: str = "100000",
            mount: str = "cpu,cpuacct") -> tuple[Path, Path]:
    root, proc = tmp_path / "cgroup", tmp_path / "proc"
    leaf = root / mount / cgroup_path.strip("/")
    write(leaf / "cpu.cfs_quota_us", quota + "\n")
    write(leaf / "cpu.cfs_period_us", period + "\n")
    write(root / mount / "cpu.cfs_quota_us", "-1\n")
    write(root / mount / "cpu.cfs_period_us", "100000\n")
    write(root / "memory" / "tasks", "")
    write(proc / "cgroup", f"12:memory:/other\n4:{mount}:{cgroup_path}\n1:name=systemd:/x\n0::/\n")
    return root, proc


def test_v2_quota_caps_a_wide_affinity_mask(tmp_path):
    root, proc = v2_tree(tmp_path, "/kubepods/pod1/c1", {"kubepods/pod1/c1": "200000 100000\n"})
    count, why = granted_cpus(root, proc, affinity=64)
    assert count == 2
    assert why == f"procs=2 from cgroup quota 2.0 CPUs; host has {os.cpu_count()}"


def test_v2_fractional_quota_rounds_up_and_the_tightest_ancestor_wins(tmp_path):
    root, proc = v2_tree(tmp_path, "/a/b/c", {"a": "150000 100000", "a/b": "max 100000", "a/b/c": "400000 100000"})
    assert cgroup_quota(root, proc) == 1.5
    assert granted_cpus(root, proc, affinity=8)[0] == 2


def test_v2_max_means_no_quota_so_the_mask_decides(tmp_path):
    root, proc = v2_tree(tmp_path, "/system.slice/spooled.service", {"system.slice/spooled.service": "max 100000"})
    assert cgroup_quota(root, proc) is None
    count, why = granted_cpus(root, proc, affinity=1)
    assert count == 1 and "affinity mask" in why


def test_v2_tiny_quota_is_still_one_cpu(tmp_path):
    root, proc = v2_tree(tmp_path, "/x", {"x": "10000 100000"})
    assert granted_cpus(root, proc, affinity=4)[0] == 1


def test_v2_host_path_absent_in_a_container_reads_the_mount_itself(tmp_path):
    root, proc = v2_tree(tmp_path, "/", {".": "300000 100000"})
    write(proc / "cgroup", "0::/docker/abc123\n")  # the host's path; the container's mount is its own cgroup
    assert cgroup_quota(root, proc) == 3.0


def test_quota_above_the_mask_leaves_the_mask(tmp_path):
    root, proc = v2_tree(tmp_path, "/x", {"x": "800000 100000"})
    assert granted_cpus(root, proc, affinity=3)[0] == 3


@pytest.mark.parametrize("mount", ["cpu,cpuacct", "cpu"])
def test_v1_cfs_quota(tmp_path, mount):
    root, proc = v1_tree(tmp_path, "/kubepods/burstable/pod9/c9", "250000", "100000", mount=mount)
    count, why = granted_cpus(root, proc, affinity=16)
    assert count == 3 and why.startswith("procs=3 from cgroup quota 2.5 CPUs")


def test_v1_unlimited_quota_and_missing_files(tmp_path):
    root, proc = v1_tree(tmp_path, "/user.slice", "-1")
    assert cgroup_quota(root, proc) is None
    assert cgroup_quota(tmp_path / "nothing", tmp_path / "noproc") is None
    assert granted_cpus(tmp_path / "nothing", tmp_path / "noproc", affinity=2)[0] == 2


def test_garbage_in_cpu_max_is_ignored(tmp_path):
    root, proc = v2_tree(tmp_path, "/x", {"x": "lots\n"})
    assert cgroup_quota(root, proc) is None


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no affinity masks on this platform")
def test_default_procs_under_a_real_one_cpu_mask_is_one(tmp_path):
    """A real process pinned to one CPU (as `taskset -c 0` or CPUAffinity= would) gets procs=1 by default."""
    cpu = min(os.sched_getaffinity(0))
    script = (
        "import os, sys\n"
        f"os.sched_setaffinity(0, {{{cpu}}})\n"
        "from supervisor.config import load_config\n"
        "cfg = load_config(['--queue', 'q', '--handler', 'm:f'], {'SPOOLED_API_KEY': 'sp_test_0123456789'})\n"
        "print(cfg.procs, cfg.procs_source, sep='|')\n"
    )
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("SPOOLED_PROCS", None)
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=60, check=True).stdout.strip()
    procs, source = out.split("|")
    assert procs == "1"
    assert source.startswith("procs=1 from ")
    if (os.cpu_count() or 1) > 1 and cgroup_quota() is None:
        assert source == f"procs=1 from the affinity mask (1 of {os.cpu_count()} CPUs)"
