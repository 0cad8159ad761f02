"""The API key out of a handler's reach. The daemon runs without capabilities (as any service user does), so
the handler has exactly the daemon's rights: without --share-api-key it cannot read the key from its own
environment, nor from /proc/<pid>/environ, cmdline or mem of the parent, the forkserver or any process under
the daemon, nor follow CREDENTIALS_DIRECTORY or a key file's path from there; with --share-api-key it can
(the control that shows the hunt works), and a long error holding the key is scrubbed before it is cut."""

from __future__ import annotations

import ctypes
import json
import subprocess

import pytest
from conftest import _STARTED, ROOT, Daemon, OutputPump, wait_for_status

PR_CAPBSET_DROP = 24


def drop_capabilities() -> None:
    """In the daemon's process before exec: empty the capability bounding set, so root after exec has no
    capability (a non-root user has none to drop and may not: that is fine)."""
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in range(64):
        libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)


class CaplessDaemon(Daemon):
    def start(self) -> CaplessDaemon:
        self.proc = subprocess.Popen(self.cmd, cwd=ROOT, env=self.env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, start_new_session=True,
                                     preexec_fn=drop_capabilities)
        _STARTED.append(self.proc)
        self.out = OutputPump(self.proc.stdout)
        return self


def capabilities(pid: int) -> str:
    with open(f"/proc/{pid}/status") as f:
        return next(line.split()[1] for line in f if line.startswith("CapEff:"))


def hunt(server, d: Daemon) -> dict:
    job = server.enqueue(d.queue, {"daemon": d.proc.pid}, max_retries=0)
    done = wait_for_status(server, [job], ("completed", "deadletter"), timeout=30)[0]
    assert done["status"] == "completed", done.get("last_error")
    return done["result"]


@pytest.mark.timeout(90)
@pytest.mark.parametrize("source", ["variable", "credential", "key file"])
def test_a_handler_cannot_read_the_key_from_any_daemon_process(dev_server, tmp_path, source):
    key = dev_server.api_key
    env: dict[str, str] = {}
    args = ["--preload"] if source == "credential" else []
    if source == "credential":
        (tmp_path / "creds").mkdir()
        (tmp_path / "creds" / "spooled-api-key").write_text(key)
        env = {"SPOOLED_API_KEY": "", "CREDENTIALS_DIRECTORY": str(tmp_path / "creds")}
    elif source == "key file":
        (tmp_path / "key").write_text(key)
        env = {"SPOOLED_API_KEY": ""}
        args += ["--api-key-file", str(tmp_path / "key")]
    d = CaplessDaemon(dev_server, f"q-hunt-{source.replace(' ', '-')}", handler="tests.support.handlers_key:hunt",
                      procs=1, worker_id=f"w-hunt-{source.replace(' ', '-')}", args=args, env=env).start()
    try:
        d.wait_ready()
        assert capabilities(d.proc.pid) == "0000000000000000"
        found = hunt(dev_server, d)
        assert key not in json.dumps(found)
        assert not found["files"], found["files"]
        assert found["dumpable"] is True  # the child itself: its memory can be measured, py-spy can attach
        own = found["own_environ"]
        assert not {"SPOOLED_API_KEY", "SPOOLED_API_KEY_FILE", "CREDENTIALS_DIRECTORY"} & set(own)
        procs = found["procs"]
        sealed = [p for p in procs.values() if p["environ"].startswith("refused")]
        parent = procs[str(d.proc.pid)]
        assert parent["environ"].startswith("refused") and parent["mem"].startswith("refused"), parent
        assert "spooled-supervisor: parent" in parent["title"]
        forkservers = [p for p in procs.values() if "forkserver" in p["cmdline"]]
        assert forkservers and all(p["environ"].startswith("refused") for p in forkservers)
        assert len(sealed) >= 2
    finally:
        d.stop()


@pytest.mark.timeout(90)
def test_with_share_api_key_the_hunt_finds_it_as_documented(dev_server):
    """The control: with --share-api-key the key is in the child's environment and nothing is sealed."""
    d = CaplessDaemon(dev_server, "q-hunt-shared", handler="tests.support.handlers_key:hunt", procs=1,
                      worker_id="w-hunt-shared", args=["--share-api-key"]).start()
    try:
        d.wait_ready()
        found = hunt(dev_server, d)
        assert found["own_environ"]["SPOOLED_API_KEY"] == dev_server.api_key
        assert dev_server.api_key in found["procs"][str(d.proc.pid)]["environ"]  # the parent is dumpable then
    finally:
        d.stop()


@pytest.mark.timeout(90)
@pytest.mark.parametrize("pad", [2000, 2030, 2045])
def test_a_long_error_holding_the_shared_key_is_scrubbed_before_it_is_cut(dev_server, pad):
    key = dev_server.api_key
    d = Daemon(dev_server, f"q-long-error-{pad}", handler="tests.support.handlers_key:fail_long", procs=1,
               worker_id=f"w-long-error-{pad}", args=["--share-api-key"]).start()
    try:
        d.wait_ready()
        job = dev_server.enqueue(d.queue, {"pad": pad}, max_retries=0)
        done = wait_for_status(dev_server, [job], ("deadletter",), timeout=30)[0]
        error = done["last_error"]
        assert error.startswith("ValueError: xxx") and len(error) <= 2048
        for piece in (key[i:i + 8] for i in range(0, len(key) - 8)):
            assert piece not in error, (piece, error[-120:])
        assert pad < 2030 or "***" in error or error.endswith("...")
        logged = "\n".join(d.out.lines)
        assert not any(key[i:i + 8] in logged for i in range(0, len(key) - 8))
    finally:
        d.stop()


@pytest.mark.timeout(90)
@pytest.mark.parametrize("preload", [False, True])
def test_a_handler_logging_the_shared_key_shows_stars(dev_server, preload):
    """Under --preload the children inherit the forkserver's log handler, built where no key was: the key
    shared after must be scrubbed from their lines all the same."""
    key = dev_server.api_key
    d = Daemon(dev_server, f"q-log-key-{preload}", handler="tests.support.handlers_key:log_key", procs=1,
               worker_id=f"w-log-key-{preload}", args=["--share-api-key", *(["--preload"] if preload else [])]).start()
    try:
        d.wait_ready()
        job = dev_server.enqueue(d.queue, {}, max_retries=0)
        done = wait_for_status(dev_server, [job], timeout=30)[0]
        assert done["result"] == {"length": len(key)}
        lines = d.wait_events("a call failed")
        assert "***" in json.dumps(lines[0])
        logged = "\n".join(d.out.lines)
        assert "the token is ***" in logged
        assert not any(key[i:i + 8] in logged for i in range(0, len(key) - 8))
    finally:
        d.stop()
