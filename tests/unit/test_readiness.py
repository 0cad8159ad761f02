"""Readiness, not liveness, follows the API's silence: /readyz turns 503 at --ready-api-silence, /healthz stays 200."""

from __future__ import annotations

import requests

from supervisor.ops.health import liveness
from supervisor.parent import hooks as hooks_module


# ---------------------------------------------------------------- health
def test_readyz_not_healthz_follows_the_api_silence_limit(monkeypatch, tmp_path):
    """The decision (in-process): the daemon's health port is built with --ready-api-silence (default 60 s);
    /readyz answers 200 at 59 s of API silence and 503 at 60 s, /healthz 200 throughout."""
    from supervisor.config import load_config

    monkeypatch.setenv("SPOOLED_API_KEY", "sp_test_" + "1" * 40)
    cfg = load_config(["--queue", "q", "--handler", "supervisor.demo_handlers:noop", "--health-port", "0",
                       "--api-url", "http://127.0.0.1:9"])
    assert cfg.ready_api_silence == 60.0
    snap = {"loop_age_secs": 0.1, "api_age_secs": 59.0, "registered": True, "draining": False, "inflight": 0,
            "children": []}
    hooks = hooks_module.DaemonHooks(cfg)
    hooks.start(lambda: dict(snap))
    try:
        base = f"http://127.0.0.1:{hooks.health.port}"
        assert requests.get(base + "/readyz", timeout=5).status_code == 200
        snap["api_age_secs"] = 60.0
        r = requests.get(base + "/readyz", timeout=5)
        assert r.status_code == 503 and "last answered 60.0s ago" in r.json()["reason"]
        assert requests.get(base + "/healthz", timeout=5).status_code == 200
    finally:
        hooks.stop()
    assert liveness({"loop_age_secs": 0.1, "api_age_secs": 1e9}, 10.0, 120.0) is None
