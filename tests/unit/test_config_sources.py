"""Configuration defaults, one-line errors, the API key from a file or systemd credentials, and a worker id
made from the host name."""

from __future__ import annotations

import pytest

from supervisor.config import ConfigError, clean_worker_id, load_config

ENV = {"SPOOLED_API_KEY": "sp_test_0123456789abcdef"}


def test_config_defaults_and_one_line_errors(monkeypatch):
    cfg = load_config(["--queue", "q", "--handler", "m:f"], ENV)
    assert cfg.lease == 30 and cfg.drain_timeout == 25.0 and cfg.procs >= 1
    assert "sp_test" not in repr(cfg)
    cases = [
        (["--queue", "q"], "--handler is required"),
        (["--queue", "q", "--handler", "nocolon"], "--handler must look like"),
        (["--queue", ".q", "--handler", "m:f"], "not a valid queue name"),
        (["--queue", "q", "--handler", "m:f", "--worker-id", "bad id!"], "--worker-id must be"),
        (["--queue", "q", "--handler", "m:f", "--api-url", "http://10.0.0.1:8080"], "refusing plain http://"),
        (["--queue", "q", "--handler", "m:f", "--ca-bundle", "/nonexistent.pem"], "--ca-bundle"),
        (["--queue", "q", "--handler", "m:f", "--api-key", "sp_test_0123456789"], "--api-key is not accepted"),
    ]
    for argv, text in cases:
        with pytest.raises(ConfigError) as err:
            load_config(argv, ENV)
        assert text in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="no API key"):
        load_config(["--queue", "q", "--handler", "m:f"], {})
    insecure = load_config(
        ["--queue", "q", "--handler", "m:f", "--api-url", "http://10.0.0.1", "--allow-insecure-http"], ENV
    )
    assert insecure.api_url == "http://10.0.0.1"
    from_env = load_config([], {**ENV, "SPOOLED_QUEUE": "q2", "SPOOLED_HANDLER": "m:g", "SPOOLED_PROCS": "3"})
    assert (from_env.first_queue, from_env.handler, from_env.procs) == ("q2", "m:g", 3)


def test_key_from_file_and_systemd_credentials(tmp_path):
    key_file = tmp_path / "key"
    key_file.write_text("sp_test_fromfile123456\n")
    cfg = load_config(["--queue", "q", "--handler", "m:f", "--api-key-file", str(key_file)], {})
    assert cfg.api_key.value == "sp_test_fromfile123456"
    (tmp_path / "spooled-api-key").write_text("sp_test_credential1234")
    cfg = load_config(["--queue", "q", "--handler", "m:f"], {"CREDENTIALS_DIRECTORY": str(tmp_path)})
    assert cfg.api_key.value == "sp_test_credential1234"


def test_worker_id_from_hostname_is_cleaned():
    assert clean_worker_id("pod_name.example.com") == "pod_name.example.com"
    assert clean_worker_id("my host/with:odd*chars") == "my-host-with-odd-chars"
    assert len(clean_worker_id("h" * 300)) == 128
