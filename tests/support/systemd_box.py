"""A real systemd as PID 1 in private namespaces, for testing the shipped unit files.

The machine's own systemd boots inside new PID, mount, UTS, IPC, network and cgroup namespaces. Its root is
an overlay whose read-only lower layer is the host's `/` (so this checkout and its venv are visible at the
same paths) and whose upper layer is a tmpfs (so files written inside vanish with the box); `/run`, `/tmp`
and `/dev` are private, except the host directories under `/tmp` passed as `expose` (a checkout or venv
cloned there), each seen at its own path through an overlay of its own (writes inside stay in the box);
the network is loopback only; it gets its own cgroup2 subtree. Needs root,
overlayfs, a cgroup2 hierarchy and util-linux's unshare/nsenter/setpriv; `SystemdBox.unavailable()` says
in one line why it cannot run here.

    box = SystemdBox("name")   # unique per concurrent box; SystemdBox("name", expose=["/tmp/clone"])
    box.start()                # returns once `systemctl is-system-running` answers running (or degraded)
    box.run("systemctl", "start", "x.service")
    box.write("/etc/systemd/system/x.service", text)
    box.stop()                 # shuts it down and removes its directory and cgroup
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path

SYSTEMD = Path("/lib/systemd/systemd")
# Commands inside get this environment, not the caller's (no coverage hooks, no test settings leaking in).
ENVIRONMENT = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}
TOOLS = ("unshare", "nsenter", "setpriv", "mount")

# Runs as PID 1's parent-to-be inside the new namespaces: builds the root, pivots into it, execs systemd.
# $1 is the box directory. Capabilities systemd would use to touch the host (modules, clock, raw I/O) go.
INNER = r"""
set -eu
D=$1; R=$D/root; S=$D/scratch
mount --make-rprivate /
mount -t tmpfs -o mode=755 tmpfs "$S"; mkdir "$S/upper" "$S/work"
mount -t overlay overlay -o "lowerdir=/,upperdir=$S/upper,workdir=$S/work" "$R"
mount -t proc -o nosuid,nodev,noexec proc "$R/proc"
mount --bind "$R/proc/sys" "$R/proc/sys"; mount -o remount,bind,ro,nosuid,nodev,noexec "$R/proc/sys"
mount -t sysfs -o ro,nosuid,nodev,noexec sysfs "$R/sys"
mount -t cgroup2 -o nosuid,nodev,noexec cgroup2 "$R/sys/fs/cgroup"
mount -t tmpfs -o mode=755,nosuid tmpfs "$R/dev"
for n in null zero full random urandom tty; do touch "$R/dev/$n"; mount --bind "/dev/$n" "$R/dev/$n"; done
mkdir "$R/dev/pts" "$R/dev/shm"; ln -s pts/ptmx "$R/dev/ptmx"; ln -s /proc/self/fd "$R/dev/fd"
mount -t devpts -o newinstance,ptmxmode=0666,mode=620,gid=5 devpts "$R/dev/pts"
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$R/dev/shm"
touch "$R/dev/console"; mount --bind "$D/console" "$R/dev/console"
mount -t tmpfs -o mode=755,nosuid,nodev tmpfs "$R/run"
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$R/tmp"
shift; i=0
for P in "$@"; do  # host directories under /tmp the box must see (a checkout, a venv): overlays, writes stay here
    i=$((i+1)); mkdir -p "$S/expose$i/upper" "$S/expose$i/work" "$R$P"
    mount -t overlay overlay -o "lowerdir=$P,upperdir=$S/expose$i/upper,workdir=$S/expose$i/work" "$R$P"
done
mkdir -p "$R/etc/systemd/system"
printf '[Unit]\nDescription=test box\nRequires=sysinit.target\nAfter=sysinit.target\n' \
    > "$R/etc/systemd/system/testbox.target"
cd "$R"; mkdir -p .oldroot; pivot_root . .oldroot; cd /; umount -l /.oldroot; rmdir /.oldroot
mount --make-rshared /
DROP=-sys_module,-sys_time,-sys_rawio,-syslog,-wake_alarm,-block_suspend,-mac_admin,-mac_override
exec env -i container=spooled-testbox PATH=/usr/sbin:/usr/bin:/sbin:/bin \
    setpriv --bounding-set "$DROP" /lib/systemd/systemd --system --unit=testbox.target
"""


def cgroup2_root() -> Path | None:
    """Where the cgroup2 hierarchy is mounted (hybrid hosts: /sys/fs/cgroup/unified), or None."""
    try:
        mounts = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return None
    for line in mounts:
        fields = line.split()
        if len(fields) > 2 and fields[2] == "cgroup2":
            return Path(fields[1])
    return None


def exposed(paths: Iterable[str | os.PathLike]) -> list[str]:
    """The outermost of `paths` that lie under /tmp (the box's /tmp is private; all else is the host's), real
    paths, each once."""
    real = sorted({os.path.realpath(p) for p in paths})
    under_tmp = [p for p in real if p.startswith("/tmp/")]
    return [p for p in under_tmp if not any(p != q and p.startswith(q + "/") for q in under_tmp)]


class SystemdBox:
    """One booted systemd in private namespaces; `run` executes commands inside it as root."""

    def __init__(self, name: str, expose: Iterable[str | os.PathLike] = ()):
        self.name = name
        self.expose = exposed(expose)
        self.dir = Path(f"/tmp/spooled-testbox-{name}")
        root = cgroup2_root()
        self.cgroup = root / f"spooled-testbox-{name}" if root else None
        self.launcher: subprocess.Popen | None = None
        self.pid: int | None = None  # systemd's pid, as the host sees it

    @staticmethod
    def unavailable() -> str | None:
        """One line saying why a box cannot run on this machine, or None when it can."""
        if os.geteuid() != 0:
            return "a systemd test box needs root"
        try:
            filesystems = Path("/proc/filesystems").read_text()
        except OSError:
            filesystems = ""
        if "overlay" not in filesystems:
            return "a systemd test box needs overlayfs (not in /proc/filesystems)"
        if cgroup2_root() is None:
            return "a systemd test box needs a cgroup2 hierarchy"
        if not SYSTEMD.exists():
            return f"a systemd test box needs systemd ({SYSTEMD} is missing)"
        missing = [tool for tool in TOOLS if shutil.which(tool) is None]
        if missing:
            return f"a systemd test box needs util-linux ({', '.join(missing)} missing)"
        return None

    def start(self, timeout: float = 60.0) -> None:
        """Boot; return once systemd reports the system running (degraded counts: a unit of ours may fail)."""
        assert self.cgroup is not None
        if self.dir.exists():  # a box of an earlier, killed run
            shutil.rmtree(self.dir, ignore_errors=True)
        for sub in ("root", "scratch"):
            (self.dir / sub).mkdir(parents=True)
        (self.dir / "console").touch()
        (self.dir / "inner.sh").write_text(INNER)
        self.cgroup.mkdir(exist_ok=True)
        log = open(self.dir / "launch.log", "wb")
        # The launcher moves itself into the box's cgroup, then becomes unshare; systemd is its only child.
        self.launcher = subprocess.Popen(
            ["bash", "-c", 'echo $$ > "$1/cgroup.procs" && exec unshare --pid --fork --kill-child --mount --uts '
             '--ipc --net --cgroup --propagation private bash "$2/inner.sh" "${@:2}"', "launcher", str(self.cgroup),
             str(self.dir), *self.expose],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        deadline = time.monotonic() + timeout
        while self.pid is None:
            self._check_launcher(deadline)
            self.pid = self._systemd_pid()
            time.sleep(0.02)
        while True:
            self._check_launcher(deadline)
            state = self.run("systemctl", "is-system-running", check=False, timeout=10).stdout.strip()
            if state in ("running", "degraded"):
                return
            time.sleep(0.05)

    def _check_launcher(self, deadline: float) -> None:
        assert self.launcher is not None
        if self.launcher.poll() is not None or time.monotonic() > deadline:
            log = (self.dir / "launch.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"the systemd box did not boot (launcher exit {self.launcher.poll()}):\n{log}")

    def _systemd_pid(self) -> int | None:
        assert self.launcher is not None
        try:
            children = Path(f"/proc/{self.launcher.pid}/task/{self.launcher.pid}/children").read_text().split()
        except OSError:
            return None
        for pid in children:
            try:
                if Path(f"/proc/{pid}/comm").read_text().strip() == "systemd":
                    return int(pid)
            except OSError:
                continue
        return None

    def run(self, *cmd: str, check: bool = True, timeout: float = 60.0, input: str | None = None
            ) -> subprocess.CompletedProcess:
        """Run `cmd` inside the box as root (all its namespaces); raise on a non-zero exit when `check`."""
        assert self.pid is not None, "start the box first"
        out = subprocess.run(["nsenter", "-t", str(self.pid), "-a", *cmd], capture_output=True, text=True,
                             timeout=timeout, input=input, env=ENVIRONMENT)
        if check and out.returncode != 0:
            raise AssertionError(f"{' '.join(cmd)} exited {out.returncode}:\n{out.stdout[-3000:]}{out.stderr[-3000:]}")
        return out

    def popen(self, *cmd: str) -> subprocess.Popen:
        """Start `cmd` inside the box without waiting for it (text output in .stdout and .stderr)."""
        assert self.pid is not None, "start the box first"
        return subprocess.Popen(["nsenter", "-t", str(self.pid), "-a", *cmd], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=ENVIRONMENT)

    def write(self, path: str, text: str, mode: str = "0644") -> None:
        """Create the file `path` inside the box (parents too) with `text`."""
        self.run("install", "-D", "-m", mode, "/dev/stdin", path, input=text)

    def stop(self, timeout: float = 20.0) -> None:
        """Shut systemd down (SIGKILL it if it lingers: the PID namespace goes with it), then clean up."""
        if self.launcher is not None:
            if self.pid is not None:
                try:
                    self.run("systemctl", "exit", check=False, timeout=10)
                except subprocess.TimeoutExpired:
                    pass
            try:
                self.launcher.wait(timeout)
            except subprocess.TimeoutExpired:  # unshare --kill-child takes systemd, and so the box, with it
                os.kill(self.launcher.pid, signal.SIGKILL)
                self.launcher.wait(timeout)
        self._remove_cgroup(deadline=time.monotonic() + timeout)
        shutil.rmtree(self.dir, ignore_errors=True)

    def _remove_cgroup(self, deadline: float) -> None:
        """Remove the box's cgroup tree, deepest first; a cgroup whose last process is still exiting is busy
        for a moment, so retry until `deadline`."""
        if self.cgroup is None:
            return
        while self.cgroup.exists():
            try:
                for sub in sorted((p for p in self.cgroup.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
                    sub.rmdir()
                self.cgroup.rmdir()
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
