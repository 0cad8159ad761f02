"""Security: the API key never leaks (logs, titles, argv, exception text, children's environment);
TLS verification stays on (--ca-bundle for a private CA); plain http:// off loopback is refused.
"""

from __future__ import annotations

import shutil
import subprocess

import psutil
import pytest
from conftest import PY, ROOT, Daemon, free_port, wait_for_status, wait_until
from support.tls_proxy import self_signed_cert, tls_proxy

from supervisor.client import rest as api
from supervisor.config import ConfigError, load_config


def proc_text(pid: int) -> tuple[str, str]:
    with open(f"/proc/{pid}/environ", "rb") as f:
        environ = f.read().decode("utf-8", "replace")
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        cmdline = f.read().decode("utf-8", "replace")
    return environ, cmdline


@pytest.mark.timeout(60)
def test_the_key_never_shows_in_logs_titles_argv_or_the_childrens_environment(dev_server):
    key = dev_server.api_key
    # Polling, not waking on events: the failed claims below are what puts the key's paths into error lines.
    d = Daemon(dev_server, "secret", procs=2, args=["--log-level", "DEBUG", "--wake", "poll"]).start()
    try:
        d.wait_ready()
        assert key not in " ".join(d.cmd)  # the key reaches the daemon only through its environment
        ids = [
            dev_server.enqueue("secret", {"do": "env"}),
            dev_server.enqueue("secret", {"do": "raise", "message": "x"}, max_retries=0),
        ]
        # Make the API fail for a while so error paths log too.
        dev_server.request("POST", "/_dev/faults", json={"fail_503": 1.0, "delay_ms": 0, "cut": 0})
        wait_until(lambda: d.events("claim failed"), timeout=10, what="a failed claim logged")
        dev_server.request("POST", "/_dev/faults", json={"fail_503": 0, "delay_ms": 0, "cut": 0})
        jobs = wait_for_status(dev_server, ids, ("completed", "deadletter"), timeout=20)
        child_env = jobs[0]["result"]["env"]
        assert "SPOOLED_API_KEY" not in child_env and key not in repr(child_env)
        assert jobs[1]["last_error"].startswith("ValueError: x")

        # Every process under the daemon: forkserver, resource tracker and each child.
        descendants = psutil.Process(d.proc.pid).children(recursive=True)
        titles = [p for p in descendants if "spooled-supervisor: child" in " ".join(p.cmdline())]
        assert len(titles) == 2
        for proc in descendants:
            environ, cmdline = proc_text(proc.pid)
            assert key not in environ and "SPOOLED_API_KEY" not in environ, proc
            assert key not in cmdline, proc
        parent_title = " ".join(psutil.Process(d.proc.pid).cmdline())
        assert "spooled-supervisor: parent" in parent_title and key not in parent_title
    finally:
        d.stop()
    assert d.proc.returncode == 0
    assert key not in d.out.text()
    assert d.events("claim failed")  # there were error lines, and they are clean


def test_the_key_never_shows_in_exception_text_or_reprs():
    key = "sp_test_" + "k" * 40
    client = api.SpooledAPI(f"http://127.0.0.1:{free_port()}", api.Secret(key), timeout=1)
    with pytest.raises(api.Unavailable) as info:
        client.claim("q", "w", 1, 30)
    text = f"{info.value} {info.value!r} {info.value.args} {client!r}"
    assert "Connection" in text or "NETWORK_ERROR" in text
    assert key not in text
    cfg = load_config(["--queue", "q", "--handler", "m:f", "--api-url", "http://127.0.0.1:1"], {"SPOOLED_API_KEY": key})
    assert key not in repr(cfg) and key not in str(cfg.api_key)


def test_plain_http_to_another_host_is_refused_unless_allowed():
    env = {"PATH": "/usr/bin:/bin", "SPOOLED_API_KEY": "sp_test_" + "a" * 40, "PYTHONDONTWRITEBYTECODE": "1"}
    cmd = [PY, "-m", "supervisor", "run", "--queue", "q", "--handler", "supervisor.demo_handlers:noop",
           "--api-url", "http://api.example.com"]
    r = subprocess.run(
        cmd,
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: refusing plain http:// to api.example.com"), r.stderr
    assert "sp_test_" not in r.stderr + r.stdout
    cfg = load_config(
        ["--queue", "q", "--handler", "m:f", "--api-url", "http://api.example.com", "--allow-insecure-http"], env
    )
    assert cfg.allow_insecure_http and cfg.api_url == "http://api.example.com"
    for url in ("http://127.0.0.1:8787", "http://localhost:8787", "http://[::1]:8787"):
        assert load_config(["--queue", "q", "--handler", "m:f", "--api-url", url], env).api_url == url
    with pytest.raises(ConfigError, match="--ca-bundle /nonexistent.pem is not a readable file"):
        load_config(["--queue", "q", "--handler", "m:f", "--ca-bundle", "/nonexistent.pem"], env)


@pytest.mark.timeout(60)
@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command to make a certificate")
def test_tls_is_verified_and_a_private_ca_works_with_ca_bundle(dev_server, tmp_path):
    cert, key = self_signed_cert(tmp_path)
    proxy, port = tls_proxy(cert, key, dev_server.url)
    url = f"https://127.0.0.1:{port}"
    try:
        # Without the CA: the certificate is refused, nothing registers, and the daemon keeps retrying.
        untrusted = Daemon(dev_server, "tls", procs=1, worker_id="tls-untrusted", args=["--api-url", url]).start()
        try:
            failed = wait_until(
                lambda: untrusted.events("registration failed; retrying"),
                timeout=15,
                what="registration refused over an untrusted certificate",
            )
            assert "CERTIFICATE_VERIFY_FAILED" in failed[0]["error"], failed[0]
            assert dev_server.worker("tls-untrusted") is None and untrusted.proc.poll() is None
        finally:
            untrusted.stop()
        # With --ca-bundle: verified, registered, and a job runs.
        trusted = Daemon(
            dev_server, "tls", procs=1, worker_id="tls-trusted", args=["--api-url", url, "--ca-bundle", cert]
        ).start()
        try:
            trusted.wait_ready()
            job = dev_server.enqueue("tls", {"do": "echo"})
            assert wait_for_status(dev_server, [job], timeout=15)[0]["status"] == "completed"
            assert dev_server.worker("tls-trusted")["status"] == "healthy"
        finally:
            trusted.stop()
        assert trusted.proc.returncode == 0
    finally:
        proxy.shutdown()
        proxy.server_close()
